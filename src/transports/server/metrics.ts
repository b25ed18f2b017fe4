import type { FastifyInstance } from "fastify";
import { timingSafeEqual } from "node:crypto";
import { collectDefaultMetrics, Counter, Gauge, Histogram, Registry } from "prom-client";
import type { Transport } from "../../core/meter.ts";
import type { AuthFailure, CacheResult, Telemetry } from "../../core/telemetry.ts";
import type { ErrorCode } from "../../gen/gateway/catalogue/v1/status_pb.js";

let processMetrics: Registry | undefined;

/** The process's default metrics, collected once per process however many gateways it runs. */
function processRegistry(): Registry {
  if (processMetrics === undefined) {
    processMetrics = new Registry();
    collectDefaultMetrics({ register: processMetrics });
  }
  return processMetrics;
}

const latencyBuckets = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10];

/** The four-digit code as legacy clients see it (0 is "0000"). */
const codeLabel = (code: ErrorCode) => String(code).padStart(4, "0");

/**
 * The gateway's metrics in Prometheus form, one registry per gateway (so two
 * in one process never mix). It is the Telemetry the core reports to; label
 * values are operation ids, four-digit codes, transports, catalogues and
 * fixed reasons, never an account key. Label sets seen once are kept, so a
 * call costs a few increments, not a label lookup.
 */
export class PrometheusTelemetry implements Telemetry {
  readonly registry = new Registry();
  private readonly calls = new Counter({ name: "gateway_calls_total", help: "Calls answered, by operation (empty: none reached), four-digit code and transport.", labelNames: ["operation", "code", "transport"], registers: [this.registry] });
  private readonly callSeconds = new Histogram({ name: "gateway_call_duration_seconds", help: "Time from a call's arrival in the core to its answer, ledger commit included.", labelNames: ["operation", "transport"], buckets: latencyBuckets, registers: [this.registry] });
  private readonly cache = new Counter({ name: "gateway_cache_events_total", help: "Response-cache lookups: hit, miss (asked the source), stale (stood in for a failing source), coalesced (waited for another call's fetch).", labelNames: ["operation", "result"], registers: [this.registry] });
  private readonly upstream = new Counter({ name: "gateway_upstream_requests_total", help: "Calls to the upstream provider, retries included, by outcome: ok, not_found, timeout, circuit_open, error.", labelNames: ["operation", "outcome"], registers: [this.registry] });
  private readonly upstreamSeconds = new Histogram({ name: "gateway_upstream_duration_seconds", help: "Time of each call to the upstream provider, retries included.", labelNames: ["operation"], buckets: latencyBuckets, registers: [this.registry] });
  private readonly circuit = new Gauge({ name: "gateway_circuit_open", help: "1 while the upstream circuit breaker of a catalogue is open (calls answered 4002 at once).", labelNames: ["catalogue"], registers: [this.registry] });
  private readonly commitSeconds = new Histogram({ name: "gateway_ledger_commit_seconds", help: "Time of each group commit of the usage ledger.", buckets: [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1], registers: [this.registry] });
  private readonly batchRows = new Histogram({ name: "gateway_ledger_batch_rows", help: "Ledger rows written by each group commit.", buckets: [1, 2, 4, 8, 16, 32, 64, 128, 256, 512], registers: [this.registry] });
  private readonly authFailures = new Counter({ name: "gateway_auth_failures_total", help: "Failed authentications: missing_key, unknown_key, bad_credentials, address_locked, admin_token.", labelNames: ["reason"], registers: [this.registry] });
  private readonly callChildren = new Map<string, { inc(): void }>();
  private readonly durationChildren = new Map<string, { observe(v: number): void }>();
  private readonly cacheChildren = new Map<string, { inc(): void }>();
  private inflightNow = 0;
  private cacheBytesNow: () => number = () => 0;

  constructor() {
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
    const key = `${operation}\u0000${code}\u0000${transport}`;
    let calls = this.callChildren.get(key);
    if (calls === undefined) this.callChildren.set(key, (calls = this.calls.labels(operation, codeLabel(code), transport)));
    calls.inc();
    const dkey = `${operation}\u0000${transport}`;
    let duration = this.durationChildren.get(dkey);
    if (duration === undefined) this.durationChildren.set(dkey, (duration = this.callSeconds.labels(operation, transport)));
    duration.observe(seconds);
  }

  cacheEvent(operation: string, result: CacheResult): void {
    const key = `${operation}\u0000${result}`;
    let child = this.cacheChildren.get(key);
    if (child === undefined) this.cacheChildren.set(key, (child = this.cache.labels(operation, result)));
    child.inc();
  }

  upstreamRequest(operation: string, outcome: string, seconds: number): void {
    this.upstream.labels(operation, outcome).inc();
    this.upstreamSeconds.labels(operation).observe(seconds);
  }

  circuitChanged(catalogue: string, open: boolean): void {
    this.circuit.labels(catalogue).set(open ? 1 : 0);
  }

  ledgerCommitted(seconds: number, rows: number): void {
    this.commitSeconds.observe(seconds);
    this.batchRows.observe(rows);
  }

  authFailed(reason: AuthFailure): void {
    this.authFailures.labels(reason).inc();
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
