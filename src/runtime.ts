import { readFileSync } from "node:fs";
import { join } from "node:path";
import { demoRecords } from "./catalogue/demo-dataset.ts";
import { importRecords } from "./catalogue/catalogue-import.ts";
import { corsOriginList, pairList, sourceOf, type GatewayConfig } from "./config.ts";
import { catalogues, operations, operationsNamed } from "./operations/index.ts";
import { CachedCatalogue, defaultCachePolicy, type CachePolicy } from "./core/cached-catalogue.ts";
import type { CatalogueSource } from "./core/catalogue-source.ts";
import { Translator, type TranslationEngine } from "./core/translation.ts";
import { UpstreamSource } from "./sources/upstream/upstream-source.ts";
import { GlossaryEngine } from "./translation/glossary-engine.ts";
import { LibreTranslateEngine } from "./translation/libretranslate-engine.ts";
import { MemoryCache } from "./stores/embedded/response-cache.ts";
import { AccountAdmin } from "./core/account-admin.ts";
import type { AccountStore } from "./core/account-store.ts";
import type { CatalogueStore } from "./core/catalogue-store.ts";
import type { Meter } from "./core/meter.ts";
import type { OperatorSwitches } from "./core/operator-switches.ts";
import { AddressLockout } from "./core/address-lockout.ts";
import { dayOf, systemClock, type Clock } from "./core/clock.ts";
import { Gateway } from "./core/gateway.ts";
import { SqliteAccountStore } from "./stores/embedded/account-store.ts";
import { ChangeWatch } from "./stores/embedded/change-watch.ts";
import { EmbeddedCatalogue } from "./stores/embedded/catalogue-store.ts";
import { openDatabase } from "./stores/embedded/sqlite-database.ts";
import { SqliteMeter } from "./stores/embedded/meter.ts";
import { SqliteOperatorSwitches } from "./stores/embedded/operator-switches.ts";
import { SqliteReplayGuard } from "./stores/embedded/replay-guard.ts";
import type { AppOptions } from "./transports/server/app.ts";
import type { Logger } from "./transports/server/logger.ts";

/** The gateway's parts, typed by their ports; `openRuntime` wires them to the embedded store under the data directory. */
export interface Runtime {
  readonly gateway: Gateway;
  /** Failed authentications per address, shared by the catalogue calls and the admin API. */
  readonly lockout: AddressLockout;
  readonly accounts: AccountStore;
  readonly admin: AccountAdmin;
  readonly meter: Meter;
  readonly switches: OperatorSwitches;
  readonly catalogue: CatalogueStore;
  /** Commits every queued ledger row, then closes the store. */
  close(): void;
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

export function openRuntime(config: GatewayConfig, options: RuntimeOptions = {}): Runtime {
  const clock = options.clock ?? systemClock;
  const log = options.log;
  const db = openDatabase(databasePath(config), { maxBytes: config.storeMaxBytes });
  const watch = new ChangeWatch(db);
  const accounts = new SqliteAccountStore(db, watch);
  const catalogue = new EmbeddedCatalogue(db);
  const meter = new SqliteMeter(db, {
    commitIntervalMs: config.ledgerCommitMs,
    onBalancesChanged: (keys) => {
      for (const key of keys) accounts.forget(key);
    },
    refusalAddressesPerDay: config.refusalAddressesPerDay,
    dataDir: config.dataDir,
    minFreeBytes: config.minFreeMb * 1048576,
    onHealth: (problem, detail) => {
      if (problem !== undefined) log?.error({ err: detail?.cause }, `${problem}: new calls are refused with 4000 until it can be written`);
      else (log?.info ?? log?.error)?.call(log, { droppedRefusals: detail?.droppedRefusals ?? 0 }, "the usage ledger can be written again: calls are served");
    },
  });
  // Retention: at start, then hourly.
  const expire = () => {
    if (config.ledgerRetentionDays <= 0) return;
    const before = dayOf(clock.now() - config.ledgerRetentionDays * 86_400_000, config.timeZone);
    try {
      const removed = meter.expire(before);
      if (removed > 0) log?.info?.({ removed, before }, "ledger rows past retention folded into per-day totals");
    } catch (e) {
      log?.error({ err: e }, "ledger retention could not run");
    }
  };
  expire();
  const retention = setInterval(expire, 3_600_000);
  retention.unref();
  const lockout = new AddressLockout({
    slowAfterFailures: config.authSlowAfter,
    lockAfterFailures: config.authLockAfter,
    lockSeconds: config.authLockSeconds,
  });
  const switches = new SqliteOperatorSwitches(db, watch);
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
      timeZone: config.timeZone,
      now: () => clock.now(),
    });
    upstreams.push(upstream);
    sources.set(name, upstream);
  }
  const cache = config.cacheMaxBytes > 0 ? new MemoryCache(config.cacheMaxBytes, () => clock.now()) : undefined;
  const answers = new CachedCatalogue(sources, cache, cachePolicy(config), () => clock.now(), new Translator(translationEngine(config)));
  const gateway = new Gateway(
    { accounts, meter, switches, catalogue: answers, replays: new SqliteReplayGuard(db), lockout, ...(log ? { log } : {}) },
    {
      timeZone: config.timeZone,
      zoneLabel: config.zoneLabel,
      nodeLabel: config.nodeLabel,
      clock,
      lastRequestId: meter.lastRequestId(),
      authentication: { signatureWindowSeconds: config.signatureWindowSeconds },
    },
  );
  return {
    gateway,
    lockout,
    accounts,
    admin: new AccountAdmin(accounts, meter, clock, operations),
    meter,
    switches,
    catalogue,
    close: () => {
      clearInterval(retention);
      meter.flush();
      db.close();
      for (const u of upstreams) void u.close();
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
export function appOptions(config: GatewayConfig, runtime: Runtime, extra: { readonly logger?: Logger; readonly adminToken?: string } = {}): AppOptions {
  const tls = config.tlsCert !== "" ? { cert: readFileSync(config.tlsCert), key: readFileSync(config.tlsKey) } : undefined;
  return {
    gateway: runtime.gateway,
    ...(extra.logger ? { logger: extra.logger } : { logLevel: config.logLevel === "silent" ? false : config.logLevel }),
    lockout: runtime.lockout,
    ...(tls ? { tls } : {}),
    maxBodyBytes: config.maxBodyBytes,
    limits: {
      maxHeaderBytes: config.maxHeaderBytes,
      requestTimeoutMs: config.requestTimeoutMs,
      keepAliveTimeoutMs: config.keepAliveTimeoutMs,
      maxConnections: config.maxConnections,
      firstRequestTimeoutMs: config.firstRequestTimeoutMs,
    },
    admin: { ports: runtime, token: extra.adminToken ?? config.adminToken },
    corsOrigins: corsOriginList(config),
  };
}
