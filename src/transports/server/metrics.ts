import type { FastifyInstance } from "fastify";
import type { AlertKind } from "../../core/alerts.ts";
import { timingSafeEqual } from "node:crypto";
import { getHeapStatistics } from "node:v8";
import { collectDefaultMetrics, Counter, Gauge, Histogram, Registry } from "prom-client";
import { ledgerCommitOutcomes, type LedgerCommitOutcome, type Transport } from "../../core/meter.ts";
import type { Limit } from "../../core/gateway-error.ts";
import type { AbandonStage, AuthFailure, CacheResult, KeyOutcome, StoppedWaiting, Telemetry } from "../../core/telemetry.ts";
import { within } from "../../core/within.ts";
import type { ErrorCode } from "../../gen/gateway/catalogue/v1/status_pb.js";
import type { CertificateFacts } from "./tls-certificate.ts";
import { logDropReasons, type LogOutputCounts } from "./log-output.ts";
import { cutReasons, type CutCounts } from "./slow-readers.ts";
import { capRefusals, type ConnectionCounts } from "./one-port-server.ts";
import type { StoreMeasures } from "../../stores/embedded/store-space.ts";

/** How long a scrape waits for the shared database's answer (the feed's hold, the clock's offset) before reading it as unknown (NaN). */
const databaseAskMs = 1000;

/** A connection pool as the metrics read it. */
export interface DatabasePool {
  readonly max: number;
  now(): { readonly open: number; readonly idle: number; readonly waiting: number };
}

let processMetrics: Registry | undefined;

/** The process's default metrics, collected once per process however many gateways it runs. */
function processRegistry(): Registry {
  if (processMetrics === undefined) {
    processMetrics = new Registry();
    collectDefaultMetrics({ register: processMetrics });
    new Gauge({
      name: "gateway_heap_limit_bytes",
      help: "The size V8's heap may reach (what GATEWAY_MEMORY_MB gives it under `gateway serve`): past it the process stops with 'JavaScript heap out of memory', and every call in flight with it. Compare nodejs_heap_size_used_bytes.",
      registers: [processMetrics],
    }).set(getHeapStatistics().heap_size_limit);
  }
  return processMetrics;
}

export const latencyBuckets = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10];

/** The four-digit code as legacy clients see it (0 is "0000"). */
const codeLabel = (code: ErrorCode) => String(code).padStart(4, "0");

/** One label set's calls and durations, counted on the call's path with plain arithmetic; prom-client reads them when scraped. */
interface CallCell {
  readonly labels: { readonly operation: string; readonly code: string; readonly transport: string };
  /** Calls not yet added to the prom-client counter. */
  pending: number;
  /** This (operation, transport)'s durations, shared by its codes. */
  readonly durations: DurationCell;
  readonly counter: { inc(n: number): void };
}

interface DurationCell {
  readonly labels: { readonly operation: string; readonly transport: string };
  /** Observations per bucket (not cumulative); the last counts those above every bound. */
  readonly buckets: Float64Array;
  sum: number;
  count: number;
}

/** The map under `key` in a map of maps, made on first use. */
function inner<K, K2, V>(outer: Map<K, Map<K2, V>>, key: K): Map<K2, V> {
  let map = outer.get(key);
  if (map === undefined) outer.set(key, (map = new Map()));
  return map;
}

/**
 * A histogram whose label sets are cells its caller holds (a DurationCell
 * each, counted by `observe`) and rendered by prom-client's registry as its own Histogram would be:
 * the same series, labels and order. prom-client's observe() hashes its
 * labels on every call, which cost the hot path more than the rest of the
 * metrics together.
 */
class CellHistogram {
  readonly type = "histogram";
  readonly aggregator = "sum";
  readonly cells: DurationCell[] = [];

  readonly name: string;
  readonly help: string;
  readonly upperBounds: readonly number[];

  constructor(name: string, help: string, upperBounds: readonly number[], registry: Registry) {
    this.name = name;
    this.help = help;
    this.upperBounds = upperBounds;
    registry.registerMetric(this as never);
  }

  /** One observation: its bucket is the first bound it does not pass, as prom-client's own histogram counts it. */
  observe(cell: DurationCell, value: number): void {
    const bounds = this.upperBounds;
    let i = 0;
    while (i < bounds.length && value > bounds[i]!) i++;
    cell.buckets[i]!++;
    cell.sum += value;
    cell.count++;
  }

  cell(labels: DurationCell["labels"]): DurationCell {
    const cell = { labels, buckets: new Float64Array(this.upperBounds.length + 1), sum: 0, count: 0 };
    this.cells.push(cell);
    return cell;
  }

  async getForPromString(): Promise<{ name: string; help: string; type: string; aggregator: string; values: unknown[] }> {
    const values: unknown[] = [];
    const bucket = `${this.name}_bucket`;
    for (const c of this.cells) {
      let acc = 0;
      this.upperBounds.forEach((le, i) => {
        acc += c.buckets[i]!;
        values.push({ labels: { le }, sharedLabels: c.labels, value: acc, metricName: bucket, exemplar: null });
      });
      values.push(
        { labels: { le: "+Inf" }, sharedLabels: c.labels, value: c.count, metricName: bucket, exemplar: null },
        { labels: {}, sharedLabels: c.labels, value: c.sum, metricName: `${this.name}_sum`, exemplar: undefined },
        { labels: {}, sharedLabels: c.labels, value: c.count, metricName: `${this.name}_count`, exemplar: undefined },
      );
    }
    return { name: this.name, help: this.help, type: this.type, aggregator: this.aggregator, values };
  }

  /** The JSON form (`registry.getMetricsAsJSON`): every label of a sample in one object, as prom-client's own histogram gives it. */
  async get(): Promise<unknown> {
    const data = await this.getForPromString();
    const values = (data.values as { labels: object; sharedLabels: object }[]).map(({ labels, sharedLabels, ...rest }) => ({ ...rest, labels: { ...labels, ...sharedLabels } }));
    return { ...data, values };
  }

  reset(): void {
    for (const c of this.cells) {
      c.buckets.fill(0);
      c.sum = 0;
      c.count = 0;
    }
  }
}

/**
 * The gateway's metrics in Prometheus form, one registry per gateway (so two
 * in one process never mix). It is the Telemetry the core reports to; label
 * values are operation ids, four-digit codes, transports, catalogues and
 * fixed reasons, never an account key. A call's counts are plain additions
 * into cells found through nested maps (no label string is built or hashed
 * per call); the counters take them when scraped.
 */
export class PrometheusTelemetry implements Telemetry {
  readonly registry = new Registry();
  private readonly callCells = new Map<string, Map<string, Map<ErrorCode, CallCell>>>();
  private readonly durationCells = new Map<string, Map<string, DurationCell>>();
  private readonly cacheCells = new Map<string, Map<CacheResult, { pending: number; readonly counter: { inc(n: number): void } }>>();
  private readonly calls = new Counter({
    name: "gateway_calls_total",
    help: "Calls answered, by operation (empty: none reached), four-digit code and transport.",
    labelNames: ["operation", "code", "transport"],
    registers: [this.registry],
    collect: () => {
      for (const byTransport of this.callCells.values()) for (const byCode of byTransport.values()) for (const c of byCode.values()) PrometheusTelemetry.take(c);
    },
  });
  private readonly callSeconds = new CellHistogram("gateway_call_duration_seconds", "Time from a call's arrival in the core to its answer, ledger commit included.", latencyBuckets, this.registry);
  private readonly cache = new Counter({
    name: "gateway_cache_events_total",
    help: "Response-cache lookups: hit, miss (asked the source), stale (stood in for a failing source), coalesced (waited for another call's fetch).",
    labelNames: ["operation", "result"],
    registers: [this.registry],
    collect: () => {
      for (const byResult of this.cacheCells.values()) for (const c of byResult.values()) PrometheusTelemetry.take(c);
    },
  });
  private readonly abandoned = new Counter({
    name: "gateway_calls_abandoned_total",
    help: "Calls answered 4017 and not charged because their caller stopped waiting, by reason (deadline: its RPC deadline passed; hung_up: its connection or stream was reset, or its RPC cancelled) and stage (before_source: nothing was bought; before_answer: what it started was bought, for the cache).",
    labelNames: ["operation", "reason", "stage"],
    registers: [this.registry],
  });
  private readonly limited = new Counter({
    name: "gateway_calls_limited_total",
    help: "Calls a limit refused, by limit: concurrency and rate (4008), daily_max (4013), balance (4016), address_locked (4008: the caller's address is locked out for failed authentications), upstream (4002: the upstream provider asked the gateway to wait, its Retry-After).",
    labelNames: ["operation", "limit"],
    registers: [this.registry],
  });
  private readonly keys = new Counter({
    name: "gateway_idempotency_keys_total",
    help: "Calls that sent an Idempotency-Key, by what became of the key: taken (the call ran), replayed (a copy of a charged call, answered again and not charged), in_flight (a copy refused, 4008, while the call that took the key ran), other_request (the key was kept for another request, 4003).",
    labelNames: ["operation", "outcome"],
    registers: [this.registry],
  });
  private readonly spanCount = new Counter({
    name: "gateway_spans_total",
    help: "The gateway's own spans (GATEWAY_OTLP_TRACES_URL): exported to the collector, rejected by it (a partial success), or dropped (the queue full, or the collector refused a batch or did not answer, after its retries).",
    labelNames: ["outcome"],
    registers: [this.registry],
  });
  private readonly alerts = new Counter({
    name: "gateway_alert_attempts_total",
    help: "Attempts to deliver usage alerts to accounts' URLs, by kind (usage, balance, expiry) and outcome: delivered (a 2xx answer), retried (another answer or none; tried again later), given_up (the last attempt failed, or the account's alerts were turned off).",
    labelNames: ["kind", "outcome"],
    registers: [this.registry],
  });
  private readonly upstream = new Counter({ name: "gateway_upstream_requests_total", help: "Calls to the upstream provider, retries included, by outcome: ok, not_found, timeout, circuit_open, refused (the provider refused the gateway's own account or held its calls back: gateway_upstream_refused_total says with which code), held (not sent: the provider had asked the gateway to wait, its Retry-After), error.", labelNames: ["operation", "outcome"], registers: [this.registry] });
  private readonly upstreamSent = new Counter({ name: "gateway_upstream_sent_total", help: "Requests sent to the upstream provider, retries included, each once it was written to a connection (not one refused or never made, nor one still queued for a connection when its caller's time was up): what the provider may bill, as the ledger's upstream_requests sums it.", labelNames: ["operation"], registers: [this.registry] });
  private readonly lateRequests = new Counter({
    name: "gateway_upstream_late_total",
    help: "Requests to the upstream provider still unanswered when their caller was told 4017, by what became of them: landed (the answer came before the call's deadline and was kept, so the item is not bought again), failed (a fault, or nothing by the deadline), abandoned (cut at once: half the provider connections were already waiting so).",
    labelNames: ["operation", "outcome"],
    registers: [this.registry],
  });
  private readonly refusedByProvider = new Counter({
    name: "gateway_upstream_refused_total",
    help: "Answers of the upstream provider refusing the gateway's own account, by its code: 4004 unknown account, 4005 credentials, 4006 and 4012 an API not enabled, 4007 account stopped, 4013 call quota spent, 4016 balance too low (the operator must act); 4008 its limit on the account's calls, 4009 maintenance (held back for now: retried). Each retry counts.",
    labelNames: ["operation", "code"],
    registers: [this.registry],
  });
  private readonly upstreamSeconds = new Histogram({ name: "gateway_upstream_duration_seconds", help: "Time of each call to the upstream provider, retries included.", labelNames: ["operation"], buckets: latencyBuckets, registers: [this.registry] });
  private readonly circuit = new Gauge({ name: "gateway_circuit_open", help: "1 while the upstream circuit breaker of a catalogue is open (calls answered 4002 at once).", labelNames: ["catalogue"], registers: [this.registry] });
  private readonly commitSeconds = new Histogram({ name: "gateway_ledger_commit_seconds", help: "Time of each group commit of the usage ledger.", buckets: [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1], registers: [this.registry] });
  private readonly batchRows = new Histogram({ name: "gateway_ledger_batch_rows", help: "Ledger rows written by each group commit.", buckets: [1, 2, 4, 8, 16, 32, 64, 128, 256, 512], registers: [this.registry] });
  private readonly unanswered = new Counter({
    name: "gateway_ledger_unanswered_calls_total",
    help: "Calls to be charged whose ledger commit was sent and not answered (a timed-out or lost connection to the shared database), by what the ledger showed: landed (answered, charged), lost (answered 4000, not charged), unconfirmed (not known in time: answered 4000, charged only if the ledger lists them), then for those landed_late (told 4000 and charged: refund them) or lost_late.",
    labelNames: ["outcome"],
    registers: [this.registry],
  });
  private readonly authFailures = new Counter({ name: "gateway_auth_failures_total", help: "Failed authentications: missing_key, unknown_key, bad_credentials, address_not_allowed (a right secret from an address its account does not list), address_locked, admin_token.", labelNames: ["reason"], registers: [this.registry] });
  private readonly tlsReloads = new Counter({ name: "gateway_tls_reloads_total", help: "TLS certificate files read again and found changed (GATEWAY_TLS_CHECK_SECONDS, SIGHUP), by outcome: reloaded (new connections get the new certificate), refused (they did not work together, or could not be read; the certificate before is still served).", labelNames: ["outcome"], registers: [this.registry] });
  /** Made when a certificate is first served: a gateway without TLS shows no validity (a 0 would read as expired). */
  private tlsValidity: { readonly from: Gauge; readonly until: Gauge } | undefined;
  private readonly collectorTlsRenewals = new Counter({
    name: "gateway_otlp_tls_renewals_total",
    help: "The OTLP collector's TLS files (GATEWAY_OTLP_CERTIFICATE, GATEWAY_OTLP_CLIENT_*) read again and found changed (GATEWAY_TLS_CHECK_SECONDS, SIGHUP), by outcome: renewed (new export requests use them), refused (they did not work together, or could not be read; the ones before stay in use).",
    labelNames: ["outcome"],
    registers: [this.registry],
  });
  /** Made when the exporter first holds a client certificate, as tlsValidity. */
  private collectorValidity: { readonly from: Gauge; readonly until: Gauge } | undefined;
  private inflightNow = 0;
  private cacheBytesNow: () => number = () => 0;

  constructor() {
    // Every outcome from the start, at 0: an alert on increase() sees the first calls of one (a series that appears
    // at its first count of 3 is read as starting at 3).
    for (const outcome of ledgerCommitOutcomes) this.unanswered.labels(outcome).inc(0);
    // The gauge is read when scraped, so a call costs an addition, not a gauge update.
    const self = this;
    new Gauge({
      name: "gateway_inflight_calls",
      help: "Calls inside the core now.",
      registers: [this.registry],
      collect() {
        this.set(self.inflightNow);
      },
    });
    new Gauge({
      name: "gateway_cache_bytes",
      help: "Bytes the response cache of this process holds, as it counts them against GATEWAY_CACHE_MAX_BYTES: decoded answers and every rendering kept for them.",
      registers: [this.registry],
      collect() {
        this.set(self.cacheBytesNow());
      },
    });
  }

  /**
   * `gateway_ledger_feed_held_seconds`, read from the store when scraped
   * (one indexed query): a shared store only, whose followers a write
   * transaction left open in the database holds back (Meter.feedHeldSince).
   */
  watchFeedHold(heldSince: () => Promise<number | undefined>, now: () => number): void {
    new Gauge({
      name: "gateway_ledger_feed_held_seconds",
      help: "Shared mode: how long ago the oldest call was made that has committed but that the ledger's feed (FollowCalls, WatchCalls, gateway feed) still holds back, because a write transaction begun before it is still open in the database; 0 when none is held, NaN when the database could not be asked or did not answer within a second. Commits of calls in flight hold it for milliseconds; seconds mean a transaction left open (a migration, an idle-in-transaction session).",
      registers: [this.registry],
      async collect() {
        const since = await askDatabase(heldSince);
        this.set(since === null ? Number.NaN : since === undefined ? 0 : Math.max(0, now() - since) / 1000);
      },
    });
  }

  /**
   * `gateway_clock_offset_seconds`, measured when scraped (one query): a
   * shared store only, whose replicas decide some limits on their own
   * clocks (postgres-database.ts clockOffset).
   */
  watchClockOffset(offset: () => Promise<{ readonly offsetMs: number }>): void {
    new Gauge({
      name: "gateway_clock_offset_seconds",
      help: "Shared mode: this replica's clock less PostgreSQL's, in seconds, measured when scraped (the server's clock_timestamp() read by one query, compared at the middle of its round trip); NaN when the database could not be asked or did not answer within a second. Leases and idempotency holds expire on PostgreSQL's clock; the rate limit, each call's day and signed calls' time windows use the replica's, so replicas that disagree by more than a rate's interval let an account through faster than its rate.",
      registers: [this.registry],
      async collect() {
        const measured = await askDatabase(offset);
        this.set(measured === null ? Number.NaN : measured.offsetMs / 1000);
      },
    });
  }

  /**
   * The embedded store's room, measured when scraped: its size and its
   * WAL's, the data directory's free space, and the two limits they are
   * held to (only when set), so an alert can fire before a limit turns
   * every call into a 4000.
   */
  watchStore(space: StoreMeasures, limits: { readonly maxBytes: number; readonly minFreeBytes: number }): void {
    // Each gauge takes its own measure when collected: one system call.
    const gauge = (name: string, help: string, measure: () => number | undefined) =>
      new Gauge({
        name,
        help,
        registers: [this.registry],
        collect() {
          this.set(measure() ?? Number.NaN);
        },
      });
    gauge("gateway_store_bytes", "Size of the embedded store's file (gateway.db): what GATEWAY_STORE_MAX_BYTES caps.", space.bytes);
    gauge("gateway_store_wal_bytes", "Size of the embedded store's WAL (gateway.db-wal): commits not yet copied into the file; it grows while a long read (a backup, a report) holds checkpoints back.", space.walBytes);
    gauge("gateway_store_free_bytes", "Free space on the file system of the data directory (NaN when it cannot be measured); below GATEWAY_MIN_FREE_MB every call that would be served answers 4000.", space.freeBytes);
    if (limits.maxBytes > 0) new Gauge({ name: "gateway_store_max_bytes", help: "GATEWAY_STORE_MAX_BYTES: past it the embedded store takes no more rows and calls answer 4000.", registers: [this.registry] }).set(limits.maxBytes);
    if (limits.minFreeBytes > 0) new Gauge({ name: "gateway_store_min_free_bytes", help: "GATEWAY_MIN_FREE_MB in bytes: with less free space in the data directory, calls that would be served answer 4000.", registers: [this.registry] }).set(limits.minFreeBytes);
  }

  /**
   * The shared database's connection pool, read when scraped: connections
   * open, idle and calls waiting for one. Waiting calls wait on top of their
   * own work: a pool too small for the load, or a database slow to answer.
   */
  watchDatabasePool(pool: DatabasePool): void {
    new Gauge({
      name: "gateway_database_connections",
      help: "Shared mode: this replica's connections to the shared database, by state: open (idle or in use), idle, and waiting (calls waiting for a connection, which add to their latency; sustained, the pool is too small for the load or the database is slow).",
      labelNames: ["state"],
      registers: [this.registry],
      collect() {
        const now = pool.now();
        this.labels("open").set(now.open);
        this.labels("idle").set(now.idle);
        this.labels("waiting").set(now.waiting);
      },
    });
    new Gauge({ name: "gateway_database_connections_max", help: "Shared mode: the most connections this replica opens to the shared database.", registers: [this.registry] }).set(pool.max);
  }

  /**
   * Shared mode: whether Redis answers, read when scraped. While it does
   * not, the replica serves without it (redis-link.ts): alone, from its own
   * memory and the gateway's catalogue.
   */
  watchRedis(link: { readonly up: boolean }): void {
    new Gauge({
      name: "gateway_redis_up",
      help: "Shared mode: 1 while Redis answers; 0 while this replica serves without it (its own memory and the gateway's catalogue answer, failed authentications are counted per replica, a paid provider's item not held here is refused 4000).",
      registers: [this.registry],
      collect() {
        this.set(link.up ? 1 : 0);
      },
    });
  }

  /**
   * Log lines stdout could not take (log-output.ts), read when scraped: its
   * reader fell behind (`backlog`), a write failed (`write_error`: a full
   * disk) or its reader is gone (`reader_gone`). Calls were served meanwhile.
   */
  watchLogOutput(output: LogOutputCounts): void {
    new Counter({
      name: "gateway_log_lines_dropped_total",
      help: "Log lines dropped because stdout could not take them, by reason: backlog (its reader fell behind; 16 MiB waited), write_error (a write failed, e.g. a full disk), reader_gone (its reader closed). Calls are served meanwhile.",
      labelNames: ["reason"],
      registers: [this.registry],
      collect() {
        this.reset();
        for (const reason of logDropReasons) this.labels(reason).inc(output.dropped[reason]);
      },
    });
  }

  /**
   * HTTP/1.1 connections closed and HTTP/2 streams reset under clients that
   * send faster than they read (slow-readers.ts), read when scraped.
   */
  watchSlowReaders(cut: CutCounts): void {
    this.registry.removeSingleMetric("gateway_slow_readers_cut_total");
    new Counter({
      name: "gateway_slow_readers_cut_total",
      help: "HTTP/1.1 connections closed and HTTP/2 streams reset under clients that sent faster than they read, by reason: pipeline (a connection with more pipelined requests waiting than one connection, or all together, may hold; the waiting ones were not handled), send_timeout (a connection whose waiting answer its client took none of for GATEWAY_SEND_TIMEOUT_MS), http2_send_timeout (the same for a stream), http2_waiting (a stream whose answer made no progress while HTTP/2 answers waiting for their clients took more than their share of the memory budget).",
      labelNames: ["reason"],
      registers: [this.registry],
      collect() {
        this.reset();
        for (const reason of cutReasons) this.labels(reason).inc(cut[reason]);
      },
    });
  }

  /**
   * What the connection cap (GATEWAY_MAX_CONNECTIONS) holds now, read when
   * scraped, and what it refused: otherwise a refusal is seen only by its
   * client (a connection closed as it is accepted, a stream reset).
   */
  watchConnections(counts: ConnectionCounts, max: number): void {
    // An app built again on the same runtime (tests do) reads its own server.
    for (const name of [
      "gateway_connections_open",
      "gateway_http2_sessions_open",
      "gateway_http2_streams_open",
      "gateway_connections_addresses",
      "gateway_connections_most_from_one_address",
      "gateway_connections_max",
      "gateway_connections_refused_total",
    ])
      this.registry.removeSingleMetric(name);
    new Gauge({
      name: "gateway_connections_open",
      help: "Client connections open now, both protocols (a TLS one from when it is accepted, its handshake included), as GATEWAY_MAX_CONNECTIONS counts them: past it new ones are closed as they are accepted. Compare gateway_connections_max.",
      registers: [this.registry],
      async collect() {
        this.set(await counts.open());
      },
    });
    new Gauge({
      name: "gateway_http2_sessions_open",
      help: "HTTP/2 connections (sessions) open now: a part of gateway_connections_open.",
      registers: [this.registry],
      collect() {
        this.set(counts.http2Sessions());
      },
    });
    new Gauge({
      name: "gateway_http2_streams_open",
      help: "HTTP/2 streams (calls) open now across all connections, which GATEWAY_MAX_CONNECTIONS caps too: past it new ones are refused (REFUSED_STREAM). Compare gateway_connections_max.",
      registers: [this.registry],
      collect() {
        this.set(counts.http2Streams());
      },
    });
    new Gauge({
      name: "gateway_connections_addresses",
      help: "Client addresses with a connection open now (each connection's own address, a trusted proxy's included).",
      registers: [this.registry],
      collect() {
        this.set(counts.addresses());
      },
    });
    new Gauge({
      name: "gateway_connections_most_from_one_address",
      help: "The most connections one client address holds now, trusted proxies (GATEWAY_TRUSTED_PROXIES) not counted: one client holding much of gateway_connections_max locks others out once it is reached. AdminService.GetConnections names the addresses; GATEWAY_MAX_CONNECTIONS_PER_ADDRESS caps them.",
      registers: [this.registry],
      collect() {
        this.set(counts.mostByOneAddress());
      },
    });
    new Gauge({ name: "gateway_connections_max", help: "GATEWAY_MAX_CONNECTIONS: the most connections open at once, and the most HTTP/2 streams open at once across them.", registers: [this.registry] }).set(max);
    new Counter({
      name: "gateway_connections_refused_total",
      help: "Refused at the connection caps, by what: connection (past GATEWAY_MAX_CONNECTIONS, closed as it was accepted, nothing written to it), address (past GATEWAY_MAX_CONNECTIONS_PER_ADDRESS from its address, closed the same way) or stream (an HTTP/2 stream past GATEWAY_MAX_CONNECTIONS across connections, reset with REFUSED_STREAM, which clients may retry).",
      labelNames: ["what"],
      registers: [this.registry],
      collect() {
        this.reset();
        for (const what of capRefusals) this.labels(what).inc(counts.refused[what]);
      },
    });
  }

  /**
   * The memory budget `gateway serve` runs with (GATEWAY_MEMORY_MB) and the
   * resident memory it should stay within: the budget plus the fixed
   * overhead (memory-budget.ts).
   */
  watchMemory(budgetBytes: number, residentBoundBytes: number): void {
    new Gauge({ name: "gateway_memory_budget_bytes", help: "GATEWAY_MEMORY_MB in bytes: the memory budget the heap, the response cache and the HTTP/2 answers waiting for slow clients divide.", registers: [this.registry] }).set(budgetBytes);
    new Gauge({
      name: "gateway_memory_resident_bound_bytes",
      help: "The resident memory the process should stay within: its budget plus the fixed overhead of code, Node's and V8's own structures and SQLite's page cache. Compare process_resident_memory_bytes.",
      registers: [this.registry],
    }).set(residentBoundBytes);
  }

  /** Where `gateway_cache_bytes` is read from. */
  watchCache(bytes: () => number): void {
    this.cacheBytesNow = bytes;
  }

  /** The text a scrape gets: this gateway's families, then the process's own (CPU, memory, event loop, GC). */
  async scrape(): Promise<string> {
    return (await this.registry.metrics()) + (await processRegistry().metrics());
  }

  callStarted(): void {
    this.inflightNow++;
  }

  callFinished(operation: string, code: ErrorCode, transport: Transport, seconds: number): void {
    this.inflightNow--;
    const cell = this.callCell(operation, code, transport);
    cell.pending++;
    this.callSeconds.observe(cell.durations, seconds);
  }

  private callCell(operation: string, code: ErrorCode, transport: Transport): CallCell {
    const byCode = inner(inner(this.callCells, operation), transport);
    let cell = byCode.get(code);
    if (cell === undefined) {
      const byTransport = inner(this.durationCells, operation);
      let durations = byTransport.get(transport);
      if (durations === undefined) byTransport.set(transport, (durations = this.callSeconds.cell({ operation, transport })));
      const labels = { operation, code: codeLabel(code), transport };
      cell = { labels, pending: 0, durations, counter: this.calls.labels(labels.operation, labels.code, labels.transport) };
      byCode.set(code, cell);
    }
    return cell;
  }

  callAbandoned(operation: string, why: StoppedWaiting, stage: AbandonStage): void {
    this.abandoned.labels(operation, why, stage).inc();
  }

  callLimited(operation: string, limit: Limit): void {
    this.limited.labels(operation, limit).inc();
  }

  spans(outcome: "exported" | "rejected" | "dropped", n: number): void {
    this.spanCount.labels(outcome).inc(n);
  }

  alertAttempt(kind: AlertKind, outcome: "delivered" | "retried" | "given_up"): void {
    this.alerts.labels(kind, outcome).inc();
  }

  idempotencyKey(operation: string, outcome: KeyOutcome): void {
    this.keys.labels(operation, outcome).inc();
  }

  cacheEvent(operation: string, result: CacheResult): void {
    const byResult = inner(this.cacheCells, operation);
    let cell = byResult.get(result);
    if (cell === undefined) byResult.set(result, (cell = { pending: 0, counter: this.cache.labels(operation, result) }));
    cell.pending++;
  }

  /** Adds a cell's pending count to its prom-client counter (when scraped). */
  private static take(cell: { pending: number; readonly counter: { inc(n: number): void } }): void {
    if (cell.pending === 0) return;
    cell.counter.inc(cell.pending);
    cell.pending = 0;
  }

  upstreamRequest(operation: string, outcome: string, seconds: number, sent: number): void {
    this.upstream.labels(operation, outcome).inc();
    if (sent > 0) this.upstreamSent.labels(operation).inc(sent);
    this.upstreamSeconds.labels(operation).observe(seconds);
  }

  upstreamLate(operation: string, outcome: "landed" | "failed" | "abandoned"): void {
    this.lateRequests.labels(operation, outcome).inc();
  }

  upstreamRefused(operation: string, code: string): void {
    this.refusedByProvider.labels(operation, code).inc();
  }

  circuitChanged(catalogue: string, open: boolean): void {
    this.circuit.labels(catalogue).set(open ? 1 : 0);
  }

  ledgerCommitted(seconds: number, rows: number): void {
    this.commitSeconds.observe(seconds);
    this.batchRows.observe(rows);
  }

  ledgerCommitUnanswered(outcome: LedgerCommitOutcome, calls: number): void {
    this.unanswered.labels(outcome).inc(calls);
  }

  authFailed(reason: AuthFailure): void {
    this.authFailures.labels(reason).inc();
  }

  /** The TLS certificate served from now on (tls-certificate.ts). */
  tlsCertificate(facts: CertificateFacts): void {
    this.tlsValidity ??= {
      from: new Gauge({ name: "gateway_tls_certificate_start_timestamp_seconds", help: "When the TLS certificate this process serves became valid (its notBefore), in Unix seconds: with the expiry, how long it lives, so that an alert on what is left suits a certificate of hours as well as one of a year.", registers: [this.registry] }),
      until: new Gauge({ name: "gateway_tls_certificate_expiry_timestamp_seconds", help: "When the TLS certificate this process serves expires (its notAfter), in Unix seconds: alert on it minus time().", registers: [this.registry] }),
    };
    this.tlsValidity.from.set(facts.notBefore.getTime() / 1000);
    this.tlsValidity.until.set(facts.notAfter.getTime() / 1000);
  }

  tlsReload(outcome: "reloaded" | "refused"): void {
    this.tlsReloads.labels(outcome).inc();
  }

  /** The OTLP collector's TLS files read again and changed (exporters/otlp-traces.ts). */
  collectorTlsRenewal(outcome: "renewed" | "refused"): void {
    this.collectorTlsRenewals.labels(outcome).inc();
  }

  /** The client certificate the exporter shows the collector from now on: when it became valid and when it expires. */
  collectorCertificate(validity: { readonly notBefore: Date; readonly notAfter: Date }): void {
    this.collectorValidity ??= {
      from: new Gauge({ name: "gateway_otlp_client_certificate_start_timestamp_seconds", help: "When the client certificate shown to the OTLP collector became valid (its notBefore), in Unix seconds: with the expiry, how far through its life it is.", registers: [this.registry] }),
      until: new Gauge({ name: "gateway_otlp_client_certificate_expiry_timestamp_seconds", help: "When the client certificate shown to the OTLP collector expires (its notAfter), in Unix seconds: once it has, the collector refuses every export.", registers: [this.registry] }),
    };
    this.collectorValidity.from.set(validity.notBefore.getTime() / 1000);
    this.collectorValidity.until.set(validity.notAfter.getTime() / 1000);
  }
}

function sameToken(given: string, expected: string): boolean {
  const a = Buffer.from(given);
  const b = Buffer.from(expected);
  return a.length === b.length && timingSafeEqual(a, b);
}

/**
 * `GET /metrics` in the Prometheus text format. With a token set, a scrape
 * must send `Authorization: Bearer <token>`; without one it gets 401 and
 * nothing else. Scrapes are not calls: neither metered nor ledgered.
 */
export function installMetrics(app: FastifyInstance, metrics: PrometheusTelemetry, token: string): void {
  app.get("/metrics", { logLevel: "warn" }, async (req, reply) => {
    if (token !== "") {
      const auth = req.headers.authorization ?? "";
      const given = auth.startsWith("Bearer ") ? auth.slice(7) : "";
      if (!sameToken(given, token)) {
        return reply.code(401).header("www-authenticate", 'Bearer realm="metrics"').header("cache-control", "no-store").send({ error: "a bearer token is required for /metrics" });
      }
    }
    const body = await metrics.scrape();
    return reply.code(200).header("content-type", metrics.registry.contentType).header("cache-control", "no-store").send(body);
  });
}

/**
 * What a gauge asks the database when scraped, or null when it cannot be
 * asked or does not answer within `databaseAskMs`. A scrape never waits
 * longer: when every connection is taken (the moment metrics matter most),
 * the question would queue behind the calls, and the whole scrape with it.
 */
async function askDatabase<T>(ask: () => Promise<T>): Promise<T | null> {
  try {
    return await within(ask(), databaseAskMs, null);
  } catch {
    return null;
  }
}
