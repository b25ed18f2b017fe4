import { readFileSync } from "node:fs";
import { isAbsolute, resolve } from "node:path";
import { assertTimeZone } from "./core/clock.ts";

/** Everything an operator can set. Each field has an environment variable. */
export interface GatewayConfig {
  /** GATEWAY_HOST: address to listen on. */
  host: string;
  /** GATEWAY_PORT: port for every protocol (0 picks a free one). */
  port: number;
  /** GATEWAY_DATA_DIR: where the embedded store keeps its file. */
  dataDir: string;
  /** GATEWAY_TIME_ZONE: IANA zone of server_time and secache_date. */
  timeZone: string;
  /** GATEWAY_ZONE_LABEL: label written before server_time. */
  zoneLabel: string;
  /** GATEWAY_NODE_LABEL: first part of every request id. */
  nodeLabel: string;
  /** GATEWAY_TLS_CERT / GATEWAY_TLS_KEY: PEM files; both set turns on TLS with ALPN (h2, http/1.1). */
  tlsCert: string;
  tlsKey: string;
  /** GATEWAY_LOG_LEVEL: fatal, error, warn, info, debug, trace or silent. */
  logLevel: string;
  /** GATEWAY_MAX_BODY_BYTES: largest request body on any path. */
  maxBodyBytes: number;
  /** GATEWAY_SHUTDOWN_GRACE_MS: how long in-flight calls may run after a stop signal. */
  shutdownGraceMs: number;
  /** GATEWAY_CORS_ORIGINS: origins browsers may call from, comma-separated; `*` for any, empty for none. */
  corsOrigins: string;
  /** GATEWAY_LEDGER_COMMIT_MS: how long a ledger row may wait for its group commit; 0 commits at the end of each event-loop turn. */
  ledgerCommitMs: number;
  /** GATEWAY_ADMIN_TOKEN: bearer token of the AdminService; empty turns it off. */
  adminToken: string;
  /** GATEWAY_UPSTREAM_URL: base URL of the upstream provider; set, it serves both catalogues unless `sources` says otherwise. */
  upstreamUrl: string;
  /** GATEWAY_UPSTREAM_KEY / GATEWAY_UPSTREAM_SECRET: the gateway's own account at the provider. */
  upstreamKey: string;
  upstreamSecret: string;
  /** GATEWAY_UPSTREAM_SIGNING: `plain` sends the secret, `md5` signs with dateline and sign. */
  upstreamSigning: string;
  /** GATEWAY_UPSTREAM_TIMEOUT_MS: limit of one upstream attempt (4017 past it). */
  upstreamTimeoutMs: number;
  /** GATEWAY_UPSTREAM_DEADLINE_MS: limit of a whole upstream call, retries included. */
  upstreamDeadlineMs: number;
  /** GATEWAY_UPSTREAM_CATALOGUES: our catalogue to the provider's name, `retail=taobao,wholesale=1688`. */
  upstreamCatalogues: string;
  /** GATEWAY_SOURCES: source per catalogue, `retail=upstream,wholesale=embedded`; empty: upstream when a URL is set. */
  sources: string;
  /** GATEWAY_CACHE_MAX_BYTES: memory the response cache may hold (approximate). */
  cacheMaxBytes: number;
  /** GATEWAY_CACHE_TTL_SECONDS: freshness per operation, `item_get=600,item_search_peerbuy=600`; 0 turns caching off. */
  cacheTtlSeconds: string;
  /** GATEWAY_CACHE_NOT_FOUND_TTL_SECONDS: freshness of a stored 2000. */
  cacheNotFoundTtlSeconds: number;
  /** GATEWAY_CACHE_STALE_IF_ERROR_SECONDS: how long past freshness an answer may stand in for a failing source. */
  cacheStaleIfErrorSeconds: number;
  /** GATEWAY_SIGNATURE_WINDOW_SECONDS: how far a signed call's dateline or timestamp may be from the server's time. */
  signatureWindowSeconds: number;
  /** GATEWAY_AUTH_SLOW_AFTER / GATEWAY_AUTH_LOCK_AFTER: failed authentications a minute from one address before answers slow, and before it is refused. */
  authSlowAfter: number;
  authLockAfter: number;
  /** GATEWAY_AUTH_LOCK_SECONDS: how long a refused address stays refused (4008). */
  authLockSeconds: number;
  /** GATEWAY_MAX_HEADER_BYTES: request line and headers, together. */
  maxHeaderBytes: number;
  /** GATEWAY_REQUEST_TIMEOUT_MS: time a client has to send a whole request. */
  requestTimeoutMs: number;
  /** GATEWAY_KEEP_ALIVE_TIMEOUT_MS: how long an idle connection stays open. */
  keepAliveTimeoutMs: number;
  /** GATEWAY_MAX_CONNECTIONS: open connections at once; more are refused. */
  maxConnections: number;
  /** GATEWAY_TRANSLATION_ENGINE: glossary (built in), libretranslate, or none. */
  translationEngine: string;
  /** GATEWAY_TRANSLATE_URL / GATEWAY_TRANSLATE_API_KEY: a LibreTranslate-compatible server. */
  translateUrl: string;
  translateApiKey: string;
  /** GATEWAY_TRANSLATE_SOURCE: that server's code for Chinese. */
  translateSource: string;
  /** GATEWAY_TRANSLATE_TIMEOUT_MS: limit of one translation request. */
  translateTimeoutMs: number;
  /** GATEWAY_TRANSLATE_CONCURRENCY: translation requests in flight at once. */
  translateConcurrency: number;
  /** GATEWAY_STORE_MAX_BYTES: largest size of the embedded store's file (0: no cap); past it the gateway behaves as on a full disk. */
  storeMaxBytes: number;
  /** GATEWAY_MIN_FREE_MB: below this much free space in the data directory new calls are refused with 4000 (0: no floor). */
  minFreeMb: number;
  /** GATEWAY_LEDGER_RETENTION_DAYS: ledger rows older than this many days are folded into per-day totals (0: kept for ever). */
  ledgerRetentionDays: number;
  /** GATEWAY_REFUSAL_ADDRESSES_PER_DAY: distinct addresses counted per day for calls with no account; more count as "other". */
  refusalAddressesPerDay: number;
  /** GATEWAY_FIRST_REQUEST_TIMEOUT_MS: time a new connection has to send a whole first request head (or the HTTP/2 preface). */
  firstRequestTimeoutMs: number;
  /** GATEWAY_UPSTREAM_MAX_BODY_BYTES: largest answer read from the upstream provider (4002 past it). */
  upstreamMaxBodyBytes: number;
}

export const defaultConfig: GatewayConfig = {
  host: "127.0.0.1",
  port: 8080,
  dataDir: "./data",
  timeZone: "Asia/Shanghai",
  zoneLabel: "Beijing",
  nodeLabel: "gw-1",
  tlsCert: "",
  tlsKey: "",
  logLevel: "info",
  maxBodyBytes: 1048576,
  shutdownGraceMs: 10000,
  corsOrigins: "*",
  ledgerCommitMs: 0,
  adminToken: "",
  upstreamUrl: "",
  upstreamKey: "",
  upstreamSecret: "",
  upstreamSigning: "plain",
  upstreamTimeoutMs: 3000,
  upstreamDeadlineMs: 8000,
  upstreamCatalogues: "retail=taobao,wholesale=1688",
  sources: "",
  cacheMaxBytes: 64 * 1048576,
  cacheTtlSeconds: "item_get=600,item_search_peerbuy=600",
  cacheNotFoundTtlSeconds: 60,
  cacheStaleIfErrorSeconds: 86400,
  signatureWindowSeconds: 300,
  authSlowAfter: 5,
  authLockAfter: 20,
  authLockSeconds: 300,
  maxHeaderBytes: 16384,
  requestTimeoutMs: 30000,
  keepAliveTimeoutMs: 72000,
  maxConnections: 10000,
  translationEngine: "glossary",
  translateUrl: "",
  translateApiKey: "",
  translateSource: "zh",
  translateTimeoutMs: 2000,
  translateConcurrency: 4,
  storeMaxBytes: 0,
  minFreeMb: 64,
  ledgerRetentionDays: 0,
  refusalAddressesPerDay: 10_000,
  firstRequestTimeoutMs: 5000,
  upstreamMaxBodyBytes: 4 * 1048576,
};

const envNames: Record<keyof GatewayConfig, string> = {
  host: "GATEWAY_HOST",
  port: "GATEWAY_PORT",
  dataDir: "GATEWAY_DATA_DIR",
  timeZone: "GATEWAY_TIME_ZONE",
  zoneLabel: "GATEWAY_ZONE_LABEL",
  nodeLabel: "GATEWAY_NODE_LABEL",
  tlsCert: "GATEWAY_TLS_CERT",
  tlsKey: "GATEWAY_TLS_KEY",
  logLevel: "GATEWAY_LOG_LEVEL",
  maxBodyBytes: "GATEWAY_MAX_BODY_BYTES",
  shutdownGraceMs: "GATEWAY_SHUTDOWN_GRACE_MS",
  corsOrigins: "GATEWAY_CORS_ORIGINS",
  ledgerCommitMs: "GATEWAY_LEDGER_COMMIT_MS",
  adminToken: "GATEWAY_ADMIN_TOKEN",
  upstreamUrl: "GATEWAY_UPSTREAM_URL",
  upstreamKey: "GATEWAY_UPSTREAM_KEY",
  upstreamSecret: "GATEWAY_UPSTREAM_SECRET",
  upstreamSigning: "GATEWAY_UPSTREAM_SIGNING",
  upstreamTimeoutMs: "GATEWAY_UPSTREAM_TIMEOUT_MS",
  upstreamDeadlineMs: "GATEWAY_UPSTREAM_DEADLINE_MS",
  upstreamCatalogues: "GATEWAY_UPSTREAM_CATALOGUES",
  sources: "GATEWAY_SOURCES",
  cacheMaxBytes: "GATEWAY_CACHE_MAX_BYTES",
  cacheTtlSeconds: "GATEWAY_CACHE_TTL_SECONDS",
  cacheNotFoundTtlSeconds: "GATEWAY_CACHE_NOT_FOUND_TTL_SECONDS",
  cacheStaleIfErrorSeconds: "GATEWAY_CACHE_STALE_IF_ERROR_SECONDS",
  signatureWindowSeconds: "GATEWAY_SIGNATURE_WINDOW_SECONDS",
  authSlowAfter: "GATEWAY_AUTH_SLOW_AFTER",
  authLockAfter: "GATEWAY_AUTH_LOCK_AFTER",
  authLockSeconds: "GATEWAY_AUTH_LOCK_SECONDS",
  maxHeaderBytes: "GATEWAY_MAX_HEADER_BYTES",
  requestTimeoutMs: "GATEWAY_REQUEST_TIMEOUT_MS",
  keepAliveTimeoutMs: "GATEWAY_KEEP_ALIVE_TIMEOUT_MS",
  maxConnections: "GATEWAY_MAX_CONNECTIONS",
  translationEngine: "GATEWAY_TRANSLATION_ENGINE",
  translateUrl: "GATEWAY_TRANSLATE_URL",
  translateApiKey: "GATEWAY_TRANSLATE_API_KEY",
  translateSource: "GATEWAY_TRANSLATE_SOURCE",
  translateTimeoutMs: "GATEWAY_TRANSLATE_TIMEOUT_MS",
  translateConcurrency: "GATEWAY_TRANSLATE_CONCURRENCY",
  storeMaxBytes: "GATEWAY_STORE_MAX_BYTES",
  minFreeMb: "GATEWAY_MIN_FREE_MB",
  ledgerRetentionDays: "GATEWAY_LEDGER_RETENTION_DAYS",
  refusalAddressesPerDay: "GATEWAY_REFUSAL_ADDRESSES_PER_DAY",
  firstRequestTimeoutMs: "GATEWAY_FIRST_REQUEST_TIMEOUT_MS",
  upstreamMaxBodyBytes: "GATEWAY_UPSTREAM_MAX_BODY_BYTES",
};

export class ConfigError extends Error {
  override name = "ConfigError";
}

const logLevels = ["fatal", "error", "warn", "info", "debug", "trace", "silent"];

function integer(v: unknown, min: number, max: number): number | undefined {
  const n = typeof v === "string" && /^[0-9]+$/.test(v) ? Number(v) : v;
  return typeof n === "number" && Number.isInteger(n) && n >= min && n <= max ? n : undefined;
}

/**
 * The configuration: defaults, then the JSON file named by GATEWAY_CONFIG
 * (keys as in GatewayConfig), then environment variables. Throws a
 * ConfigError that names every bad value and what it accepts.
 */
export function loadConfig(env: NodeJS.ProcessEnv = process.env): GatewayConfig {
  const raw: Record<string, unknown> = { ...defaultConfig };
  const problems: string[] = [];
  const file = env.GATEWAY_CONFIG;
  if (file !== undefined && file !== "") {
    try {
      const parsed: unknown = JSON.parse(readFileSync(file, "utf8"));
      if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed)) throw new Error("it must hold one JSON object");
      for (const [k, v] of Object.entries(parsed)) {
        if (k in defaultConfig) raw[k] = v;
        else problems.push(`${file}: unknown setting "${k}"; known: ${Object.keys(defaultConfig).join(", ")}`);
      }
    } catch (e) {
      problems.push(`GATEWAY_CONFIG=${file}: ${(e as Error).message}`);
    }
  }
  for (const [k, name] of Object.entries(envNames)) {
    const v = env[name];
    if (v !== undefined && v !== "") raw[k] = v;
  }

  const where = (k: keyof GatewayConfig) => `${envNames[k]} (${k})`;
  const config = { ...defaultConfig };
  for (const k of ["host", "dataDir", "timeZone", "zoneLabel", "nodeLabel", "tlsCert", "tlsKey", "logLevel", "corsOrigins", "adminToken", "upstreamUrl", "upstreamKey", "upstreamSecret", "upstreamSigning", "upstreamCatalogues", "sources", "cacheTtlSeconds", "translationEngine", "translateUrl", "translateApiKey", "translateSource"] as const) {
    if (typeof raw[k] === "string") config[k] = raw[k];
    else problems.push(`${where(k)} must be text`);
  }
  const numbers: [keyof GatewayConfig, number, number, string][] = [
    ["port", 0, 65_535, "port"],
    ["maxBodyBytes", 1024, 1 << 30, "bytes"],
    ["shutdownGraceMs", 0, 600_000, "milliseconds"],
    ["ledgerCommitMs", 0, 1000, "milliseconds"],
    ["upstreamTimeoutMs", 1, 600_000, "milliseconds"],
    ["upstreamDeadlineMs", 1, 600_000, "milliseconds"],
    ["cacheMaxBytes", 0, 2 ** 40, "bytes"],
    ["cacheNotFoundTtlSeconds", 0, 31_536_000, "seconds"],
    ["cacheStaleIfErrorSeconds", 0, 31_536_000, "seconds"],
    ["signatureWindowSeconds", 1, 86_400, "seconds"],
    ["authSlowAfter", 1, 1_000_000, "failures"],
    ["authLockAfter", 1, 1_000_000, "failures"],
    ["authLockSeconds", 0, 86_400, "seconds"],
    ["maxHeaderBytes", 1024, 1_048_576, "bytes"],
    ["requestTimeoutMs", 100, 600_000, "milliseconds"],
    ["keepAliveTimeoutMs", 100, 600_000, "milliseconds"],
    ["maxConnections", 1, 1_000_000, "connections"],
    ["translateTimeoutMs", 1, 600_000, "milliseconds"],
    ["translateConcurrency", 1, 1000, "requests"],
    ["storeMaxBytes", 0, 2 ** 50, "bytes"],
    ["minFreeMb", 0, 1_000_000_000, "megabytes"],
    ["ledgerRetentionDays", 0, 36_500, "days"],
    ["refusalAddressesPerDay", 1, 10_000_000, "addresses"],
    ["firstRequestTimeoutMs", 100, 600_000, "milliseconds"],
    ["upstreamMaxBodyBytes", 1024, 1 << 30, "bytes"],
  ];
  for (const [k, min, max, unit] of numbers) {
    const n = integer(raw[k], min, max);
    if (n === undefined) problems.push(`${where(k)} must be a whole number (${unit}) from ${min} to ${max}, not ${JSON.stringify(raw[k])}`);
    else (config as Record<string, unknown>)[k] = n;
  }
  if (config.upstreamUrl !== "") {
    try {
      const u = new URL(config.upstreamUrl);
      if (u.protocol !== "http:" && u.protocol !== "https:") throw new Error();
    } catch {
      problems.push(`${where("upstreamUrl")} must be an http or https URL`);
    }
  }
  if (config.upstreamSigning !== "plain" && config.upstreamSigning !== "md5") problems.push(`${where("upstreamSigning")} must be plain or md5`);
  for (const [k, check] of [
    ["upstreamCatalogues", (v: string) => /^[A-Za-z0-9_-]+$/.test(v)],
    ["sources", (v: string) => v === "embedded" || v === "upstream"],
    ["cacheTtlSeconds", (v: string) => /^\d{1,8}$/.test(v)],
  ] as const) {
    try {
      for (const [name, value] of pairList(config[k])) if (!check(value)) throw new Error(`${name}=${value}`);
    } catch (e) {
      problems.push(`${where(k)}: ${(e as Error).message} is not valid here`);
    }
  }
  try {
    assertTimeZone(config.timeZone);
  } catch {
    problems.push(`${where("timeZone")} must be an IANA time zone such as Asia/Shanghai, not ${JSON.stringify(config.timeZone)}`);
  }
  if (!logLevels.includes(config.logLevel)) problems.push(`${where("logLevel")} must be one of ${logLevels.join(", ")}`);
  if ((config.tlsCert === "") !== (config.tlsKey === "")) problems.push("GATEWAY_TLS_CERT and GATEWAY_TLS_KEY must be set together");
  if (!/^[A-Za-z0-9_-]{1,32}$/.test(config.nodeLabel)) problems.push(`${where("nodeLabel")} must be 1 to 32 letters, digits, _ or -`);
  for (const origin of corsOriginList(config)) {
    if (origin !== "*" && !/^https?:\/\/[^/\s]+$/.test(origin)) problems.push(`${where("corsOrigins")}: ${JSON.stringify(origin)} is not an origin such as https://shop.example.com`);
  }
  const upstreamUsed = sourceOf(config, "retail") === "upstream" || sourceOf(config, "wholesale") === "upstream";
  if (upstreamUsed && config.upstreamUrl === "") problems.push("GATEWAY_SOURCES names the upstream but GATEWAY_UPSTREAM_URL is not set");
  if (upstreamUsed && (config.upstreamKey === "" || config.upstreamSecret === "")) problems.push("GATEWAY_UPSTREAM_KEY and GATEWAY_UPSTREAM_SECRET must be set to use the upstream");
  if (!["glossary", "libretranslate", "none"].includes(config.translationEngine)) problems.push(`${where("translationEngine")} must be glossary, libretranslate or none`);
  if (config.translationEngine === "libretranslate" && !/^https?:\/\//.test(config.translateUrl)) problems.push("GATEWAY_TRANSLATE_URL must be an http(s) URL to use libretranslate");
  if (config.adminToken !== "" && config.adminToken.length < 16) problems.push(`${where("adminToken")} must be at least 16 characters`);
  if (problems.length > 0) throw new ConfigError(`bad configuration:\n  - ${problems.join("\n  - ")}`);
  config.dataDir = isAbsolute(config.dataDir) ? config.dataDir : resolve(config.dataDir);
  return config;
}

/** The CORS origins as a list. */
export function corsOriginList(config: Pick<GatewayConfig, "corsOrigins">): string[] {
  return config.corsOrigins.split(",").map((o) => o.trim()).filter((o) => o !== "");
}

/** `a=1,b=2` as ordered pairs. */
export function pairList(text: string): [string, string][] {
  return text
    .split(",")
    .map((p) => p.trim())
    .filter((p) => p !== "")
    .map((p) => {
      const [name, value, extra] = p.split("=").map((x) => x.trim());
      if (name === undefined || name === "" || value === undefined || extra !== undefined) throw new Error(`${JSON.stringify(p)} is not name=value`);
      return [name, value] as [string, string];
    });
}

/** Which source serves a catalogue: GATEWAY_SOURCES, else the upstream when its URL is set, else the embedded store. */
export function sourceOf(config: Pick<GatewayConfig, "sources" | "upstreamUrl">, catalogue: string): "embedded" | "upstream" {
  let named: [string, string] | undefined;
  try {
    named = pairList(config.sources).find(([c]) => c === catalogue);
  } catch {
    named = undefined;
  }
  if (named !== undefined) return named[1] === "upstream" ? "upstream" : "embedded";
  return config.upstreamUrl !== "" ? "upstream" : "embedded";
}
