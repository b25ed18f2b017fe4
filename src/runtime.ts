import { hostname } from "node:os";
import { join } from "node:path";
import { demoRecords } from "./catalogue/demo-dataset.ts";
import { importRecords } from "./catalogue/catalogue-import.ts";
import { alertHostList, cacheBound, corsOriginList, pairList, sourceOf, trustedProxyList, type GatewayConfig } from "./config.ts";
import { catalogues, operations, operationsNamed } from "./operations/index.ts";
import { CachedCatalogue, defaultCachePolicy, type CachePolicy } from "./core/cached-catalogue.ts";
import type { CatalogueSource } from "./core/catalogue-source.ts";
import { Translator, type TranslationEngine } from "./core/translation.ts";
import { UpstreamSource } from "./sources/upstream/upstream-source.ts";
import { GlossaryEngine } from "./translation/glossary-engine.ts";
import { LibreTranslateEngine } from "./translation/libretranslate-engine.ts";
import { MemoryCache } from "./stores/embedded/response-cache.ts";
import { memoryPlan } from "./memory-budget.ts";
import { AccountAdmin } from "./core/account-admin.ts";
import type { AccountStore } from "./core/account-store.ts";
import type { CatalogueStore } from "./core/catalogue-store.ts";
import type { LedgerCommitOutcome, Meter } from "./core/meter.ts";
import type { OperatorSwitches } from "./core/operator-switches.ts";
import { MemoryAddressLockout, type AddressLockout } from "./core/address-lockout.ts";
import { systemClock, type Clock } from "./core/clock.ts";
import { CommitBell } from "./core/commit-bell.ts";
import { LedgerRetention } from "./core/ledger-retention.ts";
import { defaultGatewayOptions, Gateway } from "./core/gateway.ts";
import type { ReplayGuard } from "./core/replay-guard.ts";
import type { ResponseCache } from "./core/response-cache.ts";
import { Readiness, type HealthCheck } from "./core/health.ts";
import type { Telemetry } from "./core/telemetry.ts";
import { SqliteAccountStore } from "./stores/embedded/account-store.ts";
import { ChangeWatch } from "./stores/embedded/change-watch.ts";
import { usableDataDirectory } from "./stores/embedded/data-directory-lock.ts";
import { EmbeddedCatalogue } from "./stores/embedded/catalogue-store.ts";
import { migrations as embeddedSteps, openDatabase, schemaStep } from "./stores/embedded/sqlite-database.ts";
import { WalCheckpointer } from "./stores/embedded/wal-checkpointer.ts";
import { InThreadReader, ThreadReader } from "./stores/embedded/sql-reader.ts";
import { SqliteMeter } from "./stores/embedded/meter.ts";
import { SqliteOperatorSwitches } from "./stores/embedded/operator-switches.ts";
import { SqliteReplayGuard } from "./stores/embedded/replay-guard.ts";
import { SqliteProviderWaits } from "./stores/embedded/provider-waits.ts";
import { PostgresAccountStore } from "./stores/postgres/account-store.ts";
import { PostgresCatalogue } from "./stores/postgres/catalogue-store.ts";
import { PostgresMeter } from "./stores/postgres/meter.ts";
import { PostgresOperatorSwitches } from "./stores/postgres/operator-switches.ts";
import { clockOffset, migrateSchema, migrations as sharedSteps, openPostgres } from "./stores/postgres/postgres-database.ts";
import { PostgresReplayGuard } from "./stores/postgres/replay-guard.ts";
import { PostgresAdminTokens } from "./stores/postgres/admin-tokens.ts";
import { SqliteAdminTokens } from "./stores/embedded/admin-tokens.ts";
import { AdminTokens, type AdminTokenStore } from "./core/admin-tokens.ts";
import { redisClient, whenReady } from "./stores/redis/redis-client.ts";
import { RedisAddressLockout } from "./stores/redis/address-lockout.ts";
import { RedisResponseCache } from "./stores/redis/response-cache.ts";
import { RedisLink } from "./stores/redis/redis-link.ts";
import { RedisProviderWaits } from "./stores/redis/provider-waits.ts";
import type { ProviderWaits } from "./core/provider-waits.ts";
import type { AppOptions } from "./transports/server/app.ts";
import type { AccessLogMode } from "./transports/server/access-log.ts";
import type { Logger } from "./transports/server/logger.ts";
import { everyLine } from "./transports/server/repeated-lines.ts";
import { PrometheusTelemetry, type DatabasePool } from "./transports/server/metrics.ts";
import { TlsCertificateFiles } from "./transports/server/tls-certificate.ts";
import { storeMeasures } from "./stores/embedded/store-space.ts";
import { otlpPlan } from "./exporters/otlp-plan.ts";
import { OtlpTraceExporter } from "./exporters/otlp-traces.ts";
import { AlertDeliveries, AlertSender, defaultAlertDeliveryOptions } from "./exporters/alert-webhooks.ts";
import type { AlertOutbox, AlertPost } from "./core/alerts.ts";
import { SqliteAlertOutbox } from "./stores/embedded/alert-outbox.ts";
import { PostgresAlertOutbox } from "./stores/postgres/alert-outbox.ts";
import { Tracer } from "./core/tracing.ts";
import { packageVersion } from "./package-version.ts";

/** The gateway's parts, typed by their ports; `openRuntime` wires them to the embedded store under the data directory. */
export interface Runtime {
  readonly gateway: Gateway;
  /** Failed authentications per address, shared by the catalogue calls and the admin API. */
  readonly lockout: AddressLockout;
  readonly accounts: AccountStore;
  readonly admin: AccountAdmin;
  /** Named admins, each with a token of its own (besides GATEWAY_ADMIN_TOKEN). */
  readonly admins: AdminTokens;
  readonly meter: Meter;
  readonly switches: OperatorSwitches;
  readonly catalogue: CatalogueStore;
  /** The response cache (this process's part of it in shared mode), or none when it is off. */
  readonly cache: ResponseCache | undefined;
  /** The cache in front of the catalogue sources, as the gateway asks it (an operator's purge drops its answers). */
  readonly answers: CachedCatalogue;
  /** Told of each operator's purge of the cache, for the log. */
  readonly onPurge: (purge: { readonly by: string; readonly operation: string; readonly numIid: string; readonly entries: number }) => void;
  /** Whether every store answers and takes writes, and whether the gateway is draining. */
  readonly readiness: Readiness;
  /** Rung after each group commit of ledger rows in this process (what AdminService.WatchCalls reads on at). */
  readonly ledgerCommits: CommitBell;
  /** The gateway's metrics, as `/metrics` serves them. */
  readonly metrics: PrometheusTelemetry;
  /** Usage alerts as the store keeps them (recorded by its triggers; delivered by `serve`, RuntimeOptions.deliverAlerts). */
  readonly alerts: AlertOutbox;
  /** What sends a test alert at once (AccountAdmin.testAlerts). */
  readonly alertSender: AlertPost;
  /** The OTLP collector's TLS files read again (SIGHUP), where the exporter has any; undefined: none to read. */
  readonly renewExporterTls: (() => void) | undefined;
  /** Commits every queued ledger row, then closes the stores (the embedded store at once, before the promise settles). */
  close(): Promise<void>;
}

/** Where the runtime reports what an operator must hear of: errors, and the store's health. */
export interface RuntimeLog {
  error(obj: unknown, msg: string): void;
  warn?(obj: unknown, msg: string): void;
  info?(obj: unknown, msg: string): void;
}

export interface RuntimeOptions {
  readonly clock?: Clock;
  readonly log?: RuntimeLog;
  /** Where calls, the cache, the upstream and the ledger are counted (default: a registry of its own). */
  readonly metrics?: PrometheusTelemetry;
  /**
   * Deliver the usage alerts the store records (`serve`, where GATEWAY_ALERTS is on); the CLI's runtimes do not.
   * `intervalMs` overrides how often due alerts are looked for (tests).
   */
  readonly deliverAlerts?: boolean | { readonly intervalMs: number };
  /**
   * Fold the ledger past GATEWAY_LEDGER_RETENTION_DAYS at start and hourly (`serve`; the CLI's runtimes do not). On
   * the embedded store the first fold is done when the runtime opens; on the shared one it runs in the background.
   */
  readonly retention?: boolean;
}

function translationEngine(config: GatewayConfig): TranslationEngine | undefined {
  if (config.translationEngine === "none") return undefined;
  if (config.translationEngine === "libretranslate") {
    return new LibreTranslateEngine({
      url: config.translateUrl,
      apiKey: config.translateApiKey,
      source: config.translateSource,
      timeoutMs: config.translateTimeoutMs,
      concurrency: config.translateConcurrency,
    });
  }
  return new GlossaryEngine();
}

function cachePolicy(config: GatewayConfig): CachePolicy {
  const ttlSeconds = new Map(defaultCachePolicy.ttlSeconds);
  for (const [name, seconds] of pairList(config.cacheTtlSeconds)) {
    for (const op of operationsNamed(name)) ttlSeconds.set(op.id, Number(seconds));
  }
  return {
    ttlSeconds,
    notFoundTtlSeconds: config.cacheNotFoundTtlSeconds,
    staleIfErrorSeconds: config.cacheStaleIfErrorSeconds,
    // A replica fetching an item for the others holds the claim for as long as its upstream call may take.
    claimMs: config.upstreamDeadlineMs + 2000,
  };
}

export function databasePath(config: Pick<GatewayConfig, "dataDir">): string {
  return join(config.dataDir, "gateway.db");
}

/** The stores a runtime is wired to: embedded (one process, one SQLite file) or shared (PostgreSQL and Redis). */
interface Stores {
  readonly accounts: AccountStore;
  readonly admins: AdminTokenStore;
  readonly meter: Meter;
  readonly switches: OperatorSwitches;
  readonly replays: ReplayGuard;
  /** Usage alerts recorded by the store, to be delivered. */
  readonly alerts: AlertOutbox;
  readonly catalogue: CatalogueStore;
  readonly cache: ResponseCache | undefined;
  /** Failed authentications per address. */
  readonly lockout: AddressLockout;
  /** This replica's label in request ids, and the newest id it already used, if it can know. */
  readonly nodeLabel: string;
  readonly lastRequestId: string | undefined;
  /** What readiness checks: each store answers and can be written. */
  readonly checks: readonly HealthCheck[];
  /** The shared database's connection pool (shared mode), as the metrics read it. */
  readonly databasePool?: DatabasePool;
  /** The paid providers' waits (their Retry-After): shared by the replicas (shared mode), or kept through a restart (embedded). */
  readonly providerWaits?: ProviderWaits;
  /** Whether Redis answers (shared mode), as the metrics read it. */
  readonly redis?: { readonly up: boolean };
  /** This replica's clock less the shared database's (shared mode), as the metrics read it. */
  readonly clockOffset?: () => Promise<{ readonly offsetMs: number }>;
  close(): Promise<void>;
}

/** Whether the configuration asks for shared mode (both URLs; loadConfig refuses one alone). */
export function sharedMode(config: Pick<GatewayConfig, "databaseUrl" | "redisUrl">): boolean {
  return config.databaseUrl !== "" && config.redisUrl !== "";
}

/**
 * A store a newer gateway wrote (a rollback, or an old replica restarted during a rolling upgrade) is run on as
 * it is, without what its newer steps added: refusing would stop those restarts. So it is said, once, at start.
 */
function warnIfNewer(log: RuntimeLog | undefined, store: string, found: number, known: number): void {
  if (found <= known) return;
  (log?.warn ?? log?.error)?.call(
    log,
    { store, schemaStep: found, knownSteps: known },
    `the ${store} store was written by a newer gateway (schema step ${found}; this one knows ${known}): this one runs on it without what the newer steps added; run the newer version`,
  );
}

function embeddedStores(config: GatewayConfig, clock: Clock, log: RuntimeLog | undefined, telemetry: Telemetry, commits: CommitBell): Stores {
  usableDataDirectory(config.dataDir);
  const db = openDatabase(databasePath(config), { maxBytes: config.storeMaxBytes });
  warnIfNewer(log, "embedded", schemaStep(db), embeddedSteps.length);
  const watch = new ChangeWatch(db);
  // Reports (usage totals, account listings) on a thread of their own, started by the first: on the serving
  // connection, one over a large ledger stopped every call until it was done (sql-reader.ts).
  const reports = new ThreadReader(databasePath(config), new InThreadReader(db), (e) =>
    (log?.warn ?? log?.error)?.call(log, { err: e }, "the store's report thread stopped; reports run on the serving thread"),
  );
  const accounts = new SqliteAccountStore(db, watch, reports);
  // The ledger's commits are what fill the WAL while serving: a thread helps copy it (started by the first commit,
  // so a CLI command that records no call starts none).
  let checkpoints: WalCheckpointer | undefined;
  let checkpointsStarted = false;
  const meter = new SqliteMeter(db, {
    commitIntervalMs: config.ledgerCommitMs,
    now: () => clock.now(),
    onBalancesChanged: (keys) => {
      for (const key of keys) accounts.forget(key);
    },
    refusalAddressesPerDay: config.refusalAddressesPerDay,
    reader: reports,
    dataDir: config.dataDir,
    minFreeBytes: config.minFreeMb * 1048576,
    onHealth: (problem, detail) => {
      if (problem !== undefined) log?.error({ err: detail?.cause }, `${problem}: new calls are refused with 4000 until it can be written`);
      else (log?.info ?? log?.error)?.call(log, { droppedRefusals: detail?.droppedRefusals ?? 0 }, "the usage ledger can be written again: calls are served");
    },
    onCommit: (seconds, rows) => {
      telemetry.ledgerCommitted(seconds, rows);
      commits.ring();
      if (!checkpointsStarted) {
        checkpointsStarted = true;
        // Without the thread the serving connection checkpoints on its own, as it always can.
        const alone = (what: string) => (e: unknown) =>
          (log?.warn ?? log?.error)?.call(log, { err: e }, `the WAL checkpoint thread ${what}; the store checkpoints on the serving thread alone`);
        try {
          checkpoints = WalCheckpointer.assist(db, alone("stopped"));
        } catch (e) {
          alone("could not start")(e);
        }
      }
      void checkpoints?.written();
    },
  });
  const probe = db.prepare("SELECT 1");
  const store: HealthCheck = {
    name: "store",
    run: async () => {
      probe.get();
      // Takes the write lock and gives it back: a read-only file or a locked database fails here.
      db.exec("BEGIN IMMEDIATE");
      db.exec("ROLLBACK");
      return meter.health(clock.now());
    },
  };
  return {
    accounts,
    meter,
    switches: new SqliteOperatorSwitches(db, watch),
    admins: new SqliteAdminTokens(db, watch),
    replays: new SqliteReplayGuard(db),
    alerts: new SqliteAlertOutbox(db),
    catalogue: new EmbeddedCatalogue(db),
    cache: cacheBound(config) > 0 ? new MemoryCache(cacheBound(config), () => clock.now()) : undefined,
    lockout: new MemoryAddressLockout(lockoutOptions(config)),
    providerWaits: new SqliteProviderWaits(db, () => clock.now()),
    nodeLabel: config.nodeLabel || defaultGatewayOptions.nodeLabel,
    lastRequestId: meter.lastRequestId(),
    checks: [store],
    close: async () => {
      meter.flush();
      await reports.close();
      await checkpoints?.close();
      db.close();
    },
  };
}

function lockoutOptions(config: GatewayConfig) {
  return { slowAfterFailures: config.authSlowAfter, lockAfterFailures: config.authLockAfter, lockSeconds: config.authLockSeconds };
}

/**
 * Says what became of a ledger commit sent and not answered (PostgresMeter's
 * `settle`): a warning when it was learnt in time and the calls were
 * answered accordingly; an error while calls were told 4000 without knowing
 * whether they are charged, and when they turn out charged (an operator
 * refunds them), with their request ids.
 */
function logUnansweredCommit(log: RuntimeLog | undefined, outcome: LedgerCommitOutcome, requestIds: readonly string[], cause: unknown): void {
  const n = `${requestIds.length} call${requestIds.length === 1 ? "" : "s"}`;
  // Each names its calls (an operator may have to refund them): never held back as a repeat.
  const fields = everyLine({ err: cause, outcome, requestIds });
  const warn = (msg: string) => (log?.warn ?? log?.error)?.call(log, fields, msg);
  if (outcome === "landed") warn(`a ledger commit's answer was lost; it had committed, so its ${n} were answered and charged`);
  else if (outcome === "lost") warn(`a ledger commit's answer was lost; it had not committed, so its ${n} answered 4000, not charged`);
  else if (outcome === "unconfirmed") log?.error(fields, `a ledger commit's answer was lost and the shared database could not be asked whether it committed: its ${n} answered 4000 and are charged only if the ledger lists them; the gateway goes on asking`);
  else if (outcome === "landed_late") log?.error(fields, `an unconfirmed ledger commit had committed: its ${n} were told 4000 and are charged; refund them, except calls sent again with their Idempotency-Key (each copy was answered from the charged call, uncharged)`);
  else warn(`an unconfirmed ledger commit had not committed: none of its ${n} is charged`);
}

/** This replica's default label in shared mode: its host and process, so no two running replicas share one. */
function replicaLabel(): string {
  const host = hostname().replace(/[^A-Za-z0-9_-]/g, "").slice(0, 20) || "gw";
  return `${host}-${process.pid}`.slice(0, 32);
}

/** Connections a replica holds to the shared database at most: every call's admission and ledger commit take one. */
const sharedPoolSize = 16;

async function sharedStores(config: GatewayConfig, clock: Clock, log: RuntimeLog | undefined, telemetry: Telemetry, commits: CommitBell): Promise<Stores> {
  const pool = openPostgres(config.databaseUrl, { max: sharedPoolSize });
  try {
    warnIfNewer(log, "shared", (await migrateSchema(pool)).from, sharedSteps.length);
  } catch (e) {
    await pool.end().catch(() => {});
    throw new Error(`shared mode cannot start: ${(e as Error).message}`, { cause: e });
  }
  // Waited for, not needed: a replica that starts while Redis is away serves without it, as one that was running does.
  const redis = redisClient(config.redisUrl);
  const link = new RedisLink(redis, {
    onChange: (up, reason) => {
      if (up) log?.info?.({ store: "redis" }, "the shared cache (Redis) answers again: replicas share their cache and failed-authentication counts again");
      else
        (log?.warn ?? log?.error)?.call(
          log,
          { store: "redis", reason },
          `the shared cache (Redis) cannot be reached (${reason}): calls go on without it; each replica answers from its own memory and the gateway's catalogue, counts failed authentications alone, and refuses (4000, not charged) only a paid provider's item it does not hold, until Redis answers`,
        );
    },
  });
  const notReady = await whenReady(redis).then(
    () => undefined,
    (e: unknown) => e,
  );
  if (notReady !== undefined) link.failed(notReady);
  const nodeLabel = config.nodeLabel || replicaLabel();
  const accounts = new PostgresAccountStore(pool, () => clock.now());
  const meter = new PostgresMeter(pool, {
    holder: nodeLabel,
    commitIntervalMs: config.ledgerCommitMs,
    refusalAddressesPerDay: config.refusalAddressesPerDay,
    onBalancesChanged: (keys) => {
      for (const key of keys) accounts.forget(key);
    },
    now: () => clock.now(),
    onCommit: (seconds, rows) => {
      telemetry.ledgerCommitted(seconds, rows);
      commits.ring();
    },
    onVacuumFailed: (e) => (log?.warn ?? log?.error)?.call(log, { err: e }, "the lease table (admissions) could not be vacuumed; calls go on, and it is tried again later"),
    onUnansweredCommit: (outcome, requestIds, cause) => {
      telemetry.ledgerCommitUnanswered(outcome, requestIds.length);
      logUnansweredCommit(log, outcome, requestIds, cause);
    },
  });
  const postgres: HealthCheck = {
    name: "postgres",
    run: async () => {
      const { rows } = await pool.query<{ standby: boolean; read_only: string }>("SELECT pg_is_in_recovery() AS standby, current_setting('transaction_read_only') AS read_only");
      if (rows[0]?.standby === true || rows[0]?.read_only === "on") return "the database takes no writes (a read-only server or standby)";
      return meter.health(clock.now());
    },
  };
  const probeKey = `gateway:probe:${nodeLabel}`;
  const redisCheck: HealthCheck = {
    name: "redis",
    degradesOnly: true,
    run: async () => {
      if (!link.up) return link.reason; // the link pings it meanwhile
      await link.run((r) => r.set(probeKey, String(clock.now()), "PX", 10_000));
      return undefined;
    },
  };
  const lockout = new RedisAddressLockout(link, lockoutOptions(config));
  const providerWaits = new RedisProviderWaits(link);
  return {
    accounts,
    meter,
    switches: new PostgresOperatorSwitches(pool, () => clock.now()),
    admins: new PostgresAdminTokens(pool, () => clock.now()),
    replays: new PostgresReplayGuard(pool),
    alerts: new PostgresAlertOutbox(pool),
    catalogue: new PostgresCatalogue(pool),
    cache: cacheBound(config) > 0 ? new RedisResponseCache(link, { localMaxBytes: Math.min(cacheBound(config), 16 * 1_048_576), now: () => clock.now() }) : undefined,
    lockout,
    providerWaits,
    nodeLabel,
    lastRequestId: undefined,
    checks: [postgres, redisCheck],
    databasePool: { max: sharedPoolSize, now: () => ({ open: pool.totalCount, idle: pool.idleCount, waiting: pool.waitingCount }) },
    redis: link,
    clockOffset: () => clockOffset(pool, () => clock.now()),
    close: async () => {
      await meter.flush();
      meter.close();
      await pool.end();
      lockout.close();
      providerWaits.close();
      link.close();
      redis.disconnect();
    },
  };
}

/**
 * The gateway's parts, wired to the embedded store under the data directory,
 * or, in shared mode (GATEWAY_DATABASE_URL and GATEWAY_REDIS_URL), to
 * PostgreSQL and Redis, bringing the shared schema up to date first.
 */
export async function openRuntime(config: GatewayConfig, options: RuntimeOptions = {}): Promise<Runtime> {
  const clock = options.clock ?? systemClock;
  const log = options.log;
  const telemetry = options.metrics ?? new PrometheusTelemetry();
  // The embedded store is written by this process alone (its data directory's lock), so its bell hears every commit.
  const ledgerCommits = new CommitBell(!sharedMode(config));
  const stores = sharedMode(config) ? await sharedStores(config, clock, log, telemetry, ledgerCommits) : embeddedStores(config, clock, log, telemetry, ledgerCommits);
  const { accounts, meter, switches, catalogue } = stores;
  const lockout = stores.lockout;
  const upstreams: UpstreamSource[] = [];
  const sources = new Map<string, CatalogueSource>();
  for (const name of catalogues) {
    if (sourceOf(config, name) === "embedded") {
      sources.set(name, catalogue);
      continue;
    }
    const upstream = new UpstreamSource({
      url: config.upstreamUrl,
      catalogue: pairList(config.upstreamCatalogues).find(([c]) => c === name)?.[1] ?? name,
      key: config.upstreamKey,
      secret: config.upstreamSecret,
      signing: config.upstreamSigning === "md5" ? "md5" : "plain",
      attemptTimeoutMs: config.upstreamTimeoutMs,
      deadlineMs: config.upstreamDeadlineMs,
      maxBodyBytes: config.upstreamMaxBodyBytes,
      connections: config.upstreamConnections,
      timeZone: config.timeZone,
      now: () => clock.now(),
      label: name,
      telemetry,
      waits: stores.providerWaits,
    });
    upstreams.push(upstream);
    sources.set(name, upstream);
  }
  const answers = new CachedCatalogue(sources, stores.cache, cachePolicy(config), () => clock.now(), new Translator(translationEngine(config)), telemetry);
  // The gateway's own spans, where a collector is named.
  const otlp = otlpPlan(config).plan;
  const spans =
    otlp === undefined
      ? undefined
      : new OtlpTraceExporter({
          ...otlp,
          instanceId: stores.nodeLabel,
          serviceVersion: packageVersion(),
          tlsCheckMs: config.tlsCheckSeconds * 1000,
          onTlsRenewal: (outcome, e) => {
            telemetry.collectorTlsRenewal(outcome);
            if (outcome === "renewed") (log?.info ?? log?.error)?.call(log, { files: otlp.tlsFiles }, "the OTLP collector's TLS files were read again and changed: new export requests use them");
            else (log?.warn ?? log?.error)?.call(log, { err: e, files: otlp.tlsFiles }, "the OTLP collector's TLS files were read again and do not work together, or cannot be read; the ones before stay in use");
          },
          onClientCertificate: (validity) => telemetry.collectorCertificate(validity),
          onSpans: (outcome, n) => telemetry.spans(outcome, n),
          onError: (e) => (log?.warn ?? log?.error)?.call(log, { err: e }, "spans could not all be sent to the OTLP collector; those not taken are counted (gateway_spans_total) and calls go on"),
        });
  const tracer = spans === undefined || otlp === undefined ? undefined : new Tracer(spans, otlp.rootRatio);
  const gateway = new Gateway(
    { accounts, meter, switches, catalogue: answers, replays: stores.replays, lockout, telemetry, tracer, alerts: stores.alerts, ...(log ? { log } : {}) },
    {
      timeZone: config.timeZone,
      zoneLabel: config.zoneLabel,
      nodeLabel: stores.nodeLabel,
      clock,
      lastRequestId: stores.lastRequestId,
      authentication: { signatureWindowSeconds: config.signatureWindowSeconds },
    },
  );
  const readiness = new Readiness(stores.checks);
  const deliverAlerts = options.deliverAlerts;
  // One sender for the alerts delivered and the tests an operator sends, under the operator's hosts.
  const alertSender = new AlertSender(defaultAlertDeliveryOptions.timeoutMs, alertHostList(config));
  const deliveries =
    deliverAlerts === undefined || deliverAlerts === false
      ? undefined
      : new AlertDeliveries(
          stores.alerts,
          {
            ...(typeof deliverAlerts === "object" ? deliverAlerts : {}),
            onAttempt: (kind, outcome) => telemetry.alertAttempt(kind, outcome),
            onError: (e) => (log?.warn ?? log?.error)?.call(log, { err: e }, "usage alerts could not be read from the store; they are tried again"),
          },
          alertSender,
        );
  deliveries?.start();
  const retention =
    options.retention === true
      ? new LedgerRetention(meter, {
          days: config.ledgerRetentionDays,
          timeZone: config.timeZone,
          now: () => clock.now(),
          onFolded: (removed, before) => log?.info?.({ removed, before }, "ledger rows past retention folded into per-day totals"),
          onError: (e) => log?.error({ err: e }, "ledger retention could not run; it is tried again within the hour"),
        })
      : undefined;
  retention?.start();
  const cache = stores.cache;
  if (cache !== undefined) telemetry.watchCache(() => cache.bytes);
  if (!sharedMode(config)) telemetry.watchStore(storeMeasures(databasePath(config), config.dataDir), { maxBytes: config.storeMaxBytes, minFreeBytes: config.minFreeMb * 1048576 });
  if (stores.databasePool !== undefined) telemetry.watchDatabasePool(stores.databasePool);
  if (stores.redis !== undefined) telemetry.watchRedis(stores.redis);
  if (stores.clockOffset !== undefined) telemetry.watchClockOffset(stores.clockOffset);
  const feedHeldSince = meter.feedHeldSince?.bind(meter);
  if (feedHeldSince !== undefined) telemetry.watchFeedHold(feedHeldSince, () => clock.now());
  return {
    gateway,
    lockout,
    readiness,
    ledgerCommits,
    metrics: telemetry,
    alerts: stores.alerts,
    alertSender,
    accounts,
    admin: new AccountAdmin(accounts, meter, clock, operations, "gateway", alertHostList(config)),
    admins: new AdminTokens(stores.admins, clock),
    meter,
    switches,
    catalogue,
    cache: stores.cache,
    answers,
    renewExporterTls: spans !== undefined && otlp !== undefined && Object.keys(otlp.tlsFiles).length > 0 ? () => void spans.renewTls() : undefined,
    onPurge: (purge) => (log?.info ?? log?.error)?.call(log, purge, "cached answers purged by an operator: the next calls for them ask the source"),
    close: async () => {
      readiness.drain();
      // Calls in flight finish on open stores: a caller that hung up has closed its connection, not its call.
      const left = await gateway.settled(config.shutdownGraceMs);
      if (left > 0) log?.error({ calls: left, graceMs: config.shutdownGraceMs }, "calls still in flight after the shutdown grace; the stores close under them");
      for (const u of upstreams) void u.close();
      await spans?.flush();
      await deliveries?.stop();
      await retention?.close();
      await alertSender.close();
      await stores.close();
    },
  };
}

/** Seeds the demo catalogue into an empty embedded store. Returns whether it did. */
export async function seedDemoCatalogue(runtime: Runtime, clock: Clock = systemClock): Promise<boolean> {
  if (!(await runtime.catalogue.empty())) return false;
  const report = await importRecords(runtime.catalogue, demoRecords(), { storedAt: Math.floor(clock.now() / 1000) });
  if (report.skipped.length > 0) throw new Error(`the demo dataset has invalid records: ${JSON.stringify(report.skipped.slice(0, 3))}`);
  return true;
}

export const demoAccountName = "demo";

/** The demo account, created on first use with every operation; its secret is replaced on every start and returned. */
export async function demoAccount(runtime: Runtime): Promise<{ key: string; secret: string }> {
  const existing = (await runtime.admin.list()).find((a) => a.name === demoAccountName);
  if (existing === undefined) {
    const { account, secret } = await runtime.admin.create({ name: demoAccountName });
    return { key: account.key, secret };
  }
  // A demo from an older gateway gets the operations added since, so every banner call works.
  for (const op of operations) if (!existing.operations.has(op.id)) await runtime.admin.setOperation(existing.key, op.id, "enabled");
  return { key: existing.key, secret: await runtime.admin.rotateSecret(existing.key) };
}

/**
 * The app's options as the configuration sets them: TLS, body and header
 * limits, timeouts, connections, CORS and the admin API. `serve` and the
 * test fixture both build the app from this, so what is tested is what runs.
 */
export function appOptions(
  config: GatewayConfig,
  runtime: Runtime,
  extra: { readonly logger?: Logger; readonly adminToken?: string; readonly demo?: boolean } = {},
): AppOptions {
  const tls = config.tlsCert !== "" ? TlsCertificateFiles.open({ cert: config.tlsCert, key: config.tlsKey }, { checkEveryMs: config.tlsCheckSeconds * 1000 }) : undefined;
  return {
    gateway: runtime.gateway,
    ...(extra.logger ? { logger: extra.logger } : { logLevel: config.logLevel === "silent" ? false : config.logLevel }),
    accessLog: config.accessLog as AccessLogMode,
    lockout: runtime.lockout,
    ...(tls ? { tls } : {}),
    maxBodyBytes: config.maxBodyBytes,
    limits: {
      maxHeaderBytes: config.maxHeaderBytes,
      requestTimeoutMs: config.requestTimeoutMs,
      keepAliveTimeoutMs: config.keepAliveTimeoutMs,
      maxConnections: config.maxConnections,
      maxConnectionsPerAddress: config.maxConnectionsPerAddress,
      http2MaxStreams: config.http2MaxStreams,
      firstRequestTimeoutMs: config.firstRequestTimeoutMs,
      sendTimeoutMs: config.sendTimeoutMs,
      hangUpCheck: config.hangUpCheck === "on",
      waitingAnswerBytes: memoryPlan(config.memoryMb).waitingAnswerBytes,
    },
    admin: { ports: runtime, token: extra.adminToken ?? config.adminToken },
    corsOrigins: corsOriginList(config),
    readiness: runtime.readiness,
    trustedProxies: trustedProxyList(config),
    metrics: { telemetry: runtime.metrics, token: config.metricsToken },
    console: config.console === "on" || (config.console === "auto" && extra.demo === true),
    rpcFastPath: config.rpcFastPath === "on",
    legacyFastPath: config.legacyFastPath === "on",
  };
}
