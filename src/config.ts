import { readFileSync } from "node:fs";
import { isAbsolute, resolve } from "node:path";
import { defaultAddressLockoutOptions } from "./core/address-lockout.ts";
import { defaultAuthenticationOptions } from "./core/authentication.ts";
import { defaultCachePolicy } from "./core/cached-catalogue.ts";
import { assertTimeZone } from "./core/clock.ts";
import { defaultGatewayOptions } from "./core/gateway.ts";
import { defaultUpstreamOptions } from "./sources/upstream/upstream-source.ts";
import { defaultMemoryMb, memoryPlan, minMemoryMb } from "./memory-budget.ts";
import { defaultMeterOptions } from "./stores/embedded/meter.ts";
import { defaultLibreTranslateOptions } from "./translation/libretranslate-engine.ts";
import { catalogues, operations, operationsNamed } from "./operations/index.ts";
import { defaultAppSettings } from "./transports/server/app.ts";
import { trustedProxiesProblem } from "./transports/server/client-address.ts";
import { accessLogModes } from "./transports/server/access-log.ts";
import { defaultRepeatWindowSeconds } from "./transports/server/repeated-lines.ts";
import { defaultLogBacklogBytes } from "./transports/server/log-output.ts";
import { defaultServiceName, otlpPlan, otlpProtocols } from "./exporters/otlp-plan.ts";
import { defaultOtlpTracesOptions } from "./exporters/otlp-traces.ts";

/** One setting: its environment name, its default (read from the component that owns it), how it is read, and what it does. */
interface Setting<T> {
  readonly env: string;
  readonly default: T;
  readonly doc: string;
  /** The value, or what is wrong with it ("must be …"). */
  readonly read: (raw: unknown) => { value: T } | { problem: string };
  /** The default as the settings table shows it, when the value itself would mislead. */
  readonly shown?: string;
  /** Never shown, never logged: a credential. */
  readonly secret?: boolean;
  /** Older environment names still read when `env` is not set. */
  readonly aliases?: readonly string[];
}

function text(env: string, def: string, doc: string, extra: Partial<Pick<Setting<string>, "shown" | "secret" | "aliases">> = {}): Setting<string> {
  return { env, default: def, doc, ...extra, read: (raw) => (typeof raw === "string" ? { value: raw } : { problem: "must be text" }) };
}

function oneOf(env: string, def: string, choices: readonly string[], doc: string, aliases?: readonly string[]): Setting<string> {
  return {
    env,
    default: def,
    doc,
    ...(aliases !== undefined ? { aliases } : {}),
    read: (raw) => (typeof raw === "string" && choices.includes(raw) ? { value: raw } : { problem: `must be one of ${choices.join(", ")}, not ${JSON.stringify(raw)}` }),
  };
}

function whole(env: string, def: number, [min, max]: readonly [number, number], unit: string, doc: string, shown?: string, aliases?: readonly string[]): Setting<number> {
  return {
    env,
    default: def,
    doc,
    ...(shown !== undefined ? { shown } : {}),
    ...(aliases !== undefined ? { aliases } : {}),
    read: (raw) => {
      const n = typeof raw === "string" && /^[0-9]+$/.test(raw) ? Number(raw) : raw;
      return typeof n === "number" && Number.isInteger(n) && n >= min && n <= max
        ? { value: n }
        : { problem: `must be a whole number (${unit}) from ${min} to ${max}, not ${JSON.stringify(raw)}` };
    },
  };
}

const ms = (n: number) => [n, 600_000] as const;
const mib = 1_048_576;
const limits = defaultAppSettings.limits;
const upstream = defaultUpstreamOptions;
const translate = defaultLibreTranslateOptions;

/**
 * Every setting an operator has, one row each. Defaults are read from the
 * components' own default objects, so what runs without a setting and what
 * the component does by itself are the same thing; the README's settings
 * table is generated from these rows (`npm run docs`).
 */
export const settings = {
  host: text("GATEWAY_HOST", "127.0.0.1", "address to listen on"),
  port: whole("GATEWAY_PORT", 8080, [0, 65_535], "port", "the one port for every protocol; `0` picks a free one"),
  dataDir: text("GATEWAY_DATA_DIR", "./data", "where the embedded store (`gateway.db`, SQLite) lives"),
  timeZone: text("GATEWAY_TIME_ZONE", defaultGatewayOptions.timeZone, "IANA zone of `server_time`, `secache_date`, the legacy `dateline` and day boundaries"),
  zoneLabel: text("GATEWAY_ZONE_LABEL", defaultGatewayOptions.zoneLabel, "label before `server_time`"),
  nodeLabel: text("GATEWAY_NODE_ID", "", "this replica's label, the first part of every `request_id` (1 to 32 letters, digits, `_` or `-`); the older name `GATEWAY_NODE_LABEL` is read too", {
    shown: `\`${defaultGatewayOptions.nodeLabel}\`; in shared mode host and process id, so replicas never share one`,
    aliases: ["GATEWAY_NODE_LABEL"],
  }),
  databaseUrl: text("GATEWAY_DATABASE_URL", "", "with `GATEWAY_REDIS_URL`, shared mode: `postgres://USER@HOST:5432/DATABASE`, the source of truth of every replica", { shown: "unset (embedded store)", secret: true }),
  redisUrl: text("GATEWAY_REDIS_URL", "", "with `GATEWAY_DATABASE_URL`, shared mode: `redis://HOST:6379`, the response cache the replicas share", { shown: "unset (embedded store)", secret: true }),
  tlsCert: text("GATEWAY_TLS_CERT", "", "PEM certificate; with `GATEWAY_TLS_KEY`, serves TLS with ALPN (h2 and http/1.1)", { shown: "unset" }),
  tlsKey: text("GATEWAY_TLS_KEY", "", "PEM private key, set together with `GATEWAY_TLS_CERT`", { shown: "unset" }),
  tlsCheckSeconds: whole("GATEWAY_TLS_CHECK_SECONDS", 60, [0, 86_400], "seconds", "how often the TLS certificate and key files are read again, the OTLP collector's (`GATEWAY_OTLP_CERTIFICATE`, `GATEWAY_OTLP_CLIENT_*`) too; when they changed (a renewal) and work together, new connections get them, without a restart. `0`: only on SIGHUP, which always reads them again"),
  logLevel: oneOf("GATEWAY_LOG_LEVEL", "info", ["fatal", "error", "warn", "info", "debug", "trace", "silent"], "`fatal` … `trace`, or `silent`"),
  accessLog: oneOf(
    "GATEWAY_ACCESS_LOG",
    "both",
    accessLogModes,
    "which access lines each request gets, at `info`: `both` (`incoming request` as it arrives, `request completed` as it ends), `completed` (only the last, which then names the request too: one line per request), `failures` (that line only for a call whose code is not 0000 or 2000, an RPC that ended in an error, or another request answered 400 or more), `off`; error lines are written whatever this says",
  ),
  logRepeatSeconds: whole(
    "GATEWAY_LOG_REPEAT_SECONDS",
    defaultRepeatWindowSeconds,
    [0, 3_600],
    "seconds",
    "a warning or error line that repeats (the same message and error, as every call writes while a store is down) is written once, then counted for this long, and the count written as one line (`repeated`, `repeatedSince`, `firstRequestId`, `lastRequestId`); the next one opens a new window. Access lines are never held. `0`: every line is written",
  ),
  logBacklogKb: whole(
    "GATEWAY_LOG_BACKLOG_KB",
    defaultLogBacklogBytes / 1024,
    [64, 1_048_576],
    "KiB",
    "log lines stdout's reader may leave waiting (a pipe, a socket, a terminal); a line past that is dropped and counted (`gateway_log_lines_dropped_total`), and calls go on being served. A line a file cannot take (a full disk) is dropped too; a reader that is gone drops every line after it",
  ),
  maxBodyBytes: whole("GATEWAY_MAX_BODY_BYTES", defaultAppSettings.maxBodyBytes, [1024, 1 << 30], "bytes", "largest request body, legacy and RPC alike"),
  shutdownGraceMs: whole("GATEWAY_SHUTDOWN_GRACE_MS", 10_000, [0, 600_000], "milliseconds", "how long in-flight calls may finish after SIGTERM"),
  drainDelayMs: whole("GATEWAY_DRAIN_DELAY_MS", 0, [0, 600_000], "milliseconds", "after SIGTERM, how long `/readyz` and gRPC health answer not-ready while every call is still served, before the port closes (give load balancers time to notice; 5000 or more behind Kubernetes)"),
  trustedProxies: text("GATEWAY_TRUSTED_PROXIES", "", "proxies (addresses or CIDRs, comma-separated, e.g. `10.0.0.0/8,::1`) whose `Forwarded` / `X-Forwarded-For` name the client; from any other peer those headers change nothing", { shown: "empty (trust none)" }),
  console: oneOf("GATEWAY_CONSOLE", "auto", ["auto", "on", "off"], "the web console at `/console/` (accounts, usage, an explorer; it uses the AdminService): `auto` serves it in the demo (`npm start`) and not under `gateway serve`"),
  otlpTracesUrl: text("GATEWAY_OTLP_TRACES_URL", "", "an OpenTelemetry collector's traces endpoint, used as written (`http://collector:4318/v1/traces`; for `grpc`, `http://collector:4317`): the gateway's own spans go there; unset (and `GATEWAY_OTLP_ENDPOINT` unset), none are recorded (also read from `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`)", {
    shown: "unset",
    aliases: ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"],
  }),
  otlpEndpoint: text("GATEWAY_OTLP_ENDPOINT", "", "an OpenTelemetry collector's base URL (`http://collector:4318`), used where `GATEWAY_OTLP_TRACES_URL` is unset: over HTTP the spans go to its `/v1/traces`, over gRPC to it as written (also read from `OTEL_EXPORTER_OTLP_ENDPOINT`)", {
    shown: "unset",
    aliases: ["OTEL_EXPORTER_OTLP_ENDPOINT"],
  }),
  otlpProtocol: oneOf("GATEWAY_OTLP_PROTOCOL", "http/protobuf", otlpProtocols, "how spans are sent: `http/protobuf` (OTLP/HTTP, binary), `http/json` (OTLP/HTTP, JSON) or `grpc` (OTLP/gRPC over HTTP/2) (also read from `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL` and `OTEL_EXPORTER_OTLP_PROTOCOL`)", [
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
  ]),
  otlpCompression: oneOf("GATEWAY_OTLP_COMPRESSION", "none", ["none", "gzip"], "`gzip` compresses each batch of spans (also read from `OTEL_EXPORTER_OTLP_TRACES_COMPRESSION` and `OTEL_EXPORTER_OTLP_COMPRESSION`)", [
    "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION",
    "OTEL_EXPORTER_OTLP_COMPRESSION",
  ]),
  otlpTimeoutMs: whole("GATEWAY_OTLP_TIMEOUT_MS", defaultOtlpTracesOptions.timeoutMs, ms(1), "milliseconds", "one export request's limit; a batch is tried at most 5 times (also read from `OTEL_EXPORTER_OTLP_TRACES_TIMEOUT` and `OTEL_EXPORTER_OTLP_TIMEOUT`)", undefined, [
    "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
    "OTEL_EXPORTER_OTLP_TIMEOUT",
  ]),
  otlpHeaders: text(
    "GATEWAY_OTLP_HEADERS",
    "",
    "header fields every batch of spans is sent with, as OpenTelemetry writes them: `name=value` pairs, comma-separated, percent-encoded (`authorization=Bearer%20TOKEN`; also read from `OTEL_EXPORTER_OTLP_TRACES_HEADERS` and `OTEL_EXPORTER_OTLP_HEADERS`)",
    { shown: "unset", secret: true, aliases: ["OTEL_EXPORTER_OTLP_TRACES_HEADERS", "OTEL_EXPORTER_OTLP_HEADERS"] },
  ),
  otlpCertificate: text("GATEWAY_OTLP_CERTIFICATE", "", "PEM file of the certificate authorities an `https` collector's certificate is checked against, instead of the system's (also read from `OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE` and `OTEL_EXPORTER_OTLP_CERTIFICATE`)", {
    shown: "unset (the system's)",
    aliases: ["OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", "OTEL_EXPORTER_OTLP_CERTIFICATE"],
  }),
  otlpClientCertificate: text("GATEWAY_OTLP_CLIENT_CERTIFICATE", "", "PEM certificate the gateway shows an `https` collector that asks for one (mutual TLS), set together with `GATEWAY_OTLP_CLIENT_KEY` (also read from `OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE` and `OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE`)", {
    shown: "unset",
    aliases: ["OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE", "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE"],
  }),
  otlpClientKey: text("GATEWAY_OTLP_CLIENT_KEY", "", "that certificate's PEM private key (also read from `OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY` and `OTEL_EXPORTER_OTLP_CLIENT_KEY`)", {
    shown: "unset",
    aliases: ["OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY", "OTEL_EXPORTER_OTLP_CLIENT_KEY"],
  }),
  tracesExporter: text("GATEWAY_TRACES_EXPORTER", "otlp", "`none` records no spans whatever endpoint is set, as OpenTelemetry's SDKs do (a list naming `otlp`, such as `otlp,console`, is `otlp`) (also read from `OTEL_TRACES_EXPORTER`)", {
    aliases: ["OTEL_TRACES_EXPORTER"],
  }),
  resourceAttributes: text("GATEWAY_RESOURCE_ATTRIBUTES", "", "more attributes of the spans' resource, as OpenTelemetry writes them: `key=value` pairs, comma-separated, percent-encoded (`deployment.environment.name=prod,k8s.pod.name=gw-0`); they take precedence over the gateway's own, but `service.name` comes from `GATEWAY_SERVICE_NAME` where that is set (also read from `OTEL_RESOURCE_ATTRIBUTES`)", {
    shown: "unset",
    aliases: ["OTEL_RESOURCE_ATTRIBUTES"],
  }),
  traceSamplePerMille: whole("GATEWAY_TRACE_SAMPLE_PER_MILLE", 0, [0, 1000], "per 1,000 calls", "of the calls that send no `traceparent`, how many are traced, each as a trace of its own, where `GATEWAY_TRACES_SAMPLER` is unset; a call whose `traceparent` is sampled is always traced, one whose is not never"),
  tracesSampler: text("GATEWAY_TRACES_SAMPLER", "", "OpenTelemetry's sampler, for the calls that send no `traceparent` (a caller's sampled flag always decides for its own calls): `parentbased_always_on`, `parentbased_always_off`, `parentbased_traceidratio` (the share in `GATEWAY_TRACES_SAMPLER_ARG`, default 1.0), or `always_off` (no span at all) (also read from `OTEL_TRACES_SAMPLER`)", {
    shown: "unset (`GATEWAY_TRACE_SAMPLE_PER_MILLE` decides)",
    aliases: ["OTEL_TRACES_SAMPLER"],
  }),
  tracesSamplerArg: text("GATEWAY_TRACES_SAMPLER_ARG", "", "`parentbased_traceidratio`'s share of the calls without a `traceparent` that are traced, from 0 to 1 (also read from `OTEL_TRACES_SAMPLER_ARG`)", {
    shown: "unset (1.0)",
    aliases: ["OTEL_TRACES_SAMPLER_ARG"],
  }),
  serviceName: text("GATEWAY_SERVICE_NAME", defaultServiceName, "`service.name` of the spans (also read from `OTEL_SERVICE_NAME`)", { aliases: ["OTEL_SERVICE_NAME"] }),
  metricsToken: text("GATEWAY_METRICS_TOKEN", "", "bearer token `/metrics` requires; unset, anyone who reaches the port can scrape it", { shown: "unset", secret: true }),
  corsOrigins: text("GATEWAY_CORS_ORIGINS", defaultAppSettings.corsOrigins.join(","), "origins browsers may call from, comma-separated (`https://shop.example.com`); `*` any; empty turns CORS off"),
  rpcFastPath: oneOf("GATEWAY_RPC_FAST_PATH", "on", ["on", "off"], "the fast paths of catalogue calls over Connect (HTTP/1.1; before Fastify for a caller without `Origin`) and gRPC (HTTP/2, on the stream before Fastify); `off` sends every RPC through Fastify and connect-node, answering the same bytes more slowly"),
  alertHosts: text("GATEWAY_ALERT_HOSTS", "", "the hosts accounts' alert URLs may name, comma-separated: a name or address as written (`hooks.example.com`, `10.0.0.7`), or `.example.com` for it and every name under it; empty: any. A URL naming another is refused when alerts are set, and an alert to one set before is given up, not sent"),
  alerts: oneOf("GATEWAY_ALERTS", "on", ["on", "off"], "delivery of accounts' usage alerts (`accounts alerts`): `on` POSTs each alert the store records to its account's URL, signed, retrying for about 22 hours; `off` delivers none from this process (they wait in the store for a replica that does)"),
  legacyFastPath: oneOf("GATEWAY_LEGACY_FAST_PATH", "on", ["on", "off"], "the fast path of legacy `GET` calls without `Origin` or a body, on the HTTP/1.1 request before Fastify; `off` sends every legacy call through Fastify's route, answering the same bytes more slowly"),
  ledgerCommitMs: whole("GATEWAY_LEDGER_COMMIT_MS", defaultMeterOptions.commitIntervalMs, [0, 1000], "milliseconds", "longest wait of a ledger row for its group commit; 0 commits at the end of each event-loop turn"),
  adminToken: text("GATEWAY_ADMIN_TOKEN", "", "bearer token of the AdminService (16+ characters); unset, the AdminService takes only named admins' tokens (`gateway admins add`), and is off while there are none", { shown: "unset", secret: true }),
  upstreamUrl: text("GATEWAY_UPSTREAM_URL", "", "the upstream provider; set, every catalogue uses it unless `GATEWAY_SOURCES` says otherwise", { shown: "unset" }),
  upstreamKey: text("GATEWAY_UPSTREAM_KEY", "", "the gateway's own account at the provider", { shown: "unset" }),
  upstreamSecret: text("GATEWAY_UPSTREAM_SECRET", "", "that account's secret", { shown: "unset", secret: true }),
  upstreamSigning: oneOf("GATEWAY_UPSTREAM_SIGNING", upstream.signing, ["plain", "md5"], "`plain` (send the secret) or `md5` (dateline and sign)"),
  upstreamTimeoutMs: whole("GATEWAY_UPSTREAM_TIMEOUT_MS", upstream.attemptTimeoutMs, ms(1), "milliseconds", "one attempt's limit (4017 past it)"),
  upstreamDeadlineMs: whole("GATEWAY_UPSTREAM_DEADLINE_MS", upstream.deadlineMs, ms(1), "milliseconds", "a whole upstream call's limit, retries included"),
  upstreamConnections: whole("GATEWAY_UPSTREAM_CONNECTIONS", upstream.connections, [1, 4096], "connections", "keep-alive connections to the upstream provider, per catalogue: calls beyond them queue; set it to the provider's limit on the gateway's calls in flight (its 4008 past it). At most half wait for late answers"),
  upstreamMaxBodyBytes: whole("GATEWAY_UPSTREAM_MAX_BODY_BYTES", upstream.maxBodyBytes, [1024, 1 << 30], "bytes", "largest answer read from the upstream provider; past it 4002, uncharged, and the connection is dropped"),
  upstreamCatalogues: text("GATEWAY_UPSTREAM_CATALOGUES", "retail=taobao,wholesale=1688", "the provider's names for our catalogues"),
  sources: text("GATEWAY_SOURCES", "", "source per catalogue, e.g. `retail=upstream,wholesale=embedded`", { shown: "upstream if a URL is set, else embedded" }),
  memoryMb: whole("GATEWAY_MEMORY_MB", defaultMemoryMb, [minMemoryMb, 1_048_576], "MiB", "the memory budget: V8's heap limits and the response cache's bound come from it, and the RSS stays within it plus a fixed overhead (README, Configuration)"),
  cacheMaxBytes: whole("GATEWAY_CACHE_MAX_BYTES", -1, [-1, 2 ** 40], "bytes", "memory of the response cache (at most half the memory budget); 0 turns it off; -1 is the budget's share", "a quarter of `GATEWAY_MEMORY_MB`"),
  cacheTtlSeconds: text("GATEWAY_CACHE_TTL_SECONDS", "", "freshness of a found answer per operation, as `<catalogue>/<api_name>=SECONDS`; a bare api name sets every operation of that name; 0 stores nothing", { shown: "each operation's own (600)" }),
  cacheNotFoundTtlSeconds: whole("GATEWAY_CACHE_NOT_FOUND_TTL_SECONDS", defaultCachePolicy.notFoundTtlSeconds, [0, 31_536_000], "seconds", "freshness of a stored 2000"),
  cacheStaleIfErrorSeconds: whole("GATEWAY_CACHE_STALE_IF_ERROR_SECONDS", defaultCachePolicy.staleIfErrorSeconds, [0, 31_536_000], "seconds", "how long an expired answer may stand in for a failing source"),
  signatureWindowSeconds: whole("GATEWAY_SIGNATURE_WINDOW_SECONDS", defaultAuthenticationOptions.signatureWindowSeconds, [1, 86_400], "seconds", "how far a signed call's dateline or timestamp may be from the server's clock"),
  authSlowAfter: whole("GATEWAY_AUTH_SLOW_AFTER", defaultAddressLockoutOptions.slowAfterFailures, [1, 1_000_000], "failures", "failed authentications a minute from one address before its answers are slowed"),
  authLockAfter: whole("GATEWAY_AUTH_LOCK_AFTER", defaultAddressLockoutOptions.lockAfterFailures, [1, 1_000_000], "failures", "… and before it is refused (4008)"),
  authLockSeconds: whole("GATEWAY_AUTH_LOCK_SECONDS", defaultAddressLockoutOptions.lockSeconds, [0, 86_400], "seconds", "how long a refused address stays refused"),
  maxHeaderBytes: whole("GATEWAY_MAX_HEADER_BYTES", limits.maxHeaderBytes, [1024, 1_048_576], "bytes", "request line and headers, together"),
  requestTimeoutMs: whole("GATEWAY_REQUEST_TIMEOUT_MS", limits.requestTimeoutMs, ms(100), "milliseconds", "time a client has to send a whole request"),
  keepAliveTimeoutMs: whole("GATEWAY_KEEP_ALIVE_TIMEOUT_MS", limits.keepAliveTimeoutMs, ms(100), "milliseconds", "how long an idle connection stays open"),
  maxConnections: whole("GATEWAY_MAX_CONNECTIONS", limits.maxConnections, [1, 1_000_000], "connections", "open connections at once, and open HTTP/2 streams at once across connections; more are refused (a stream with REFUSED_STREAM, which clients may retry). `serve` lowers it to what the open-files limit holds beside 256 files of its own (a quarter under a limit of 1,024), and says so"),
  maxConnectionsPerAddress: whole("GATEWAY_MAX_CONNECTIONS_PER_ADDRESS", limits.maxConnectionsPerAddress, [0, 1_000_000], "connections", "open connections at once from one client address (0: no cap); more from it are closed as they are accepted, so one client cannot hold GATEWAY_MAX_CONNECTIONS for everyone. The address is the connection's own; GATEWAY_TRUSTED_PROXIES are not held to it"),
  http2MaxStreams: whole("GATEWAY_HTTP2_MAX_STREAMS", limits.http2MaxStreams, [1, 1_000_000], "streams", "HTTP/2 streams one connection may have open at once, advertised as SETTINGS_MAX_CONCURRENT_STREAMS (clients wait for a free one; a connection that opens more is ended)"),
  firstRequestTimeoutMs: whole("GATEWAY_FIRST_REQUEST_TIMEOUT_MS", limits.firstRequestTimeoutMs, ms(100), "milliseconds", "time a new connection has to send its first request head (or the whole HTTP/2 preface); silent ones are closed"),
  sendTimeoutMs: whole("GATEWAY_SEND_TIMEOUT_MS", limits.sendTimeoutMs, ms(100), "milliseconds", "time a client has to take some of an answer waiting to be written; an HTTP/1.1 connection whose client took none of it for this long is closed, an HTTP/2 stream reset"),
  hangUpCheck: oneOf("GATEWAY_HANG_UP_CHECK", "on", ["on", "off"], "an HTTP/1.1 or 1.0 caller that ends its side of the connection before its answer is sent the answer's first bytes (`HTTP/1.1 `) at once, so one that has hung up is told from one still reading (by the reset they meet) and not charged; `off`: nothing sent early, and such a caller is answered and charged"),
  translationEngine: oneOf("GATEWAY_TRANSLATION_ENGINE", "glossary", ["glossary", "libretranslate", "none"], "`glossary` (built in), `libretranslate` or `none`"),
  translateUrl: text("GATEWAY_TRANSLATE_URL", "", "a LibreTranslate-compatible server", { shown: "unset" }),
  translateApiKey: text("GATEWAY_TRANSLATE_API_KEY", translate.apiKey, "that server's API key", { shown: "unset", secret: true }),
  translateSource: text("GATEWAY_TRANSLATE_SOURCE", translate.source, "that server's code for Chinese"),
  translateTimeoutMs: whole("GATEWAY_TRANSLATE_TIMEOUT_MS", translate.timeoutMs, ms(1), "milliseconds", "limit of one translation, its wait for a place among the requests in flight included; past it the answer is untranslated"),
  translateConcurrency: whole("GATEWAY_TRANSLATE_CONCURRENCY", translate.concurrency, [1, 1000], "requests", "translation requests in flight at once"),
  storeMaxBytes: whole("GATEWAY_STORE_MAX_BYTES", 0, [0, 2 ** 50], "bytes", "largest size of `gateway.db` (0: no cap); past it the gateway behaves as on a full disk"),
  minFreeMb: whole("GATEWAY_MIN_FREE_MB", defaultMeterOptions.minFreeBytes / mib, [0, 1_000_000_000], "megabytes", "below this much free space in the data directory, calls that would be served answer 4000 before the disk fills; 0 turns it off"),
  ledgerRetentionDays: whole("GATEWAY_LEDGER_RETENTION_DAYS", 0, [0, 36_500], "days", "ledger rows older than this are folded into per-day totals (0: kept for ever)"),
  refusalAddressesPerDay: whole("GATEWAY_REFUSAL_ADDRESSES_PER_DAY", defaultMeterOptions.refusalAddressesPerDay, [1, 10_000_000], "addresses", "distinct client addresses counted per day for calls with no account; more count as `other`"),
} satisfies Record<string, Setting<string> | Setting<number>>;

type Settings = typeof settings;

/** Everything an operator can set: one field per row of `settings`. */
export type GatewayConfig = { -readonly [K in keyof Settings]: Settings[K]["default"] };

/** The configuration when nothing is set. */
export const defaultConfig: GatewayConfig = Object.fromEntries(Object.entries(settings).map(([k, s]) => [k, s.default])) as GatewayConfig;

export class ConfigError extends Error {
  override name = "ConfigError";
}

const settingRows = Object.entries(settings) as [keyof GatewayConfig, Setting<string> | Setting<number>][];

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
        if (k in settings) raw[k] = v;
        else problems.push(`${file}: unknown setting "${k}"; known: ${Object.keys(settings).join(", ")}`);
      }
    } catch (e) {
      problems.push(`GATEWAY_CONFIG=${file}: ${(e as Error).message}`);
    }
  }
  const config = { ...defaultConfig } as Record<keyof GatewayConfig, unknown>;
  for (const [k, setting] of settingRows) {
    const v = env[setting.env] || setting.aliases?.map((name) => env[name]).find((x) => x !== undefined && x !== "");
    if (v !== undefined && v !== "") raw[k] = v;
    const read = setting.read(raw[k]);
    if ("value" in read) config[k] = read.value;
    else problems.push(`${setting.env} (${k}) ${read.problem}`);
  }
  // A value that could not be read keeps its default here, so the checks below still run and every problem is named at once.
  problems.push(...crossChecks(config as GatewayConfig));
  if (problems.length > 0) throw new ConfigError(`bad configuration:\n  - ${problems.join("\n  - ")}`);
  const done = config as GatewayConfig;
  done.dataDir = isAbsolute(done.dataDir) ? done.dataDir : resolve(done.dataDir);
  return done;
}

/** What one row cannot say alone: forms of text values, and settings that go together. */
function crossChecks(config: GatewayConfig): string[] {
  const problems: string[] = [];
  const where = (k: keyof GatewayConfig) => `${settings[k].env} (${k})`;
  problems.push(...otlpPlan(config).problems);
  if (config.upstreamUrl !== "") {
    try {
      const u = new URL(config.upstreamUrl);
      if (u.protocol !== "http:" && u.protocol !== "https:") throw new Error();
    } catch {
      problems.push(`${where("upstreamUrl")} must be an http or https URL`);
    }
  }
  for (const [k, check] of [
    ["upstreamCatalogues", (v: string) => /^[A-Za-z0-9_-]+$/.test(v)],
    ["sources", (v: string) => v === "embedded" || v === "upstream"],
    ["cacheTtlSeconds", (v: string) => /^\d{1,8}$/.test(v)],
  ] as const) {
    try {
      for (const [name, value] of pairList(config[k])) {
        if (!check(value)) throw new Error(`${name}=${value} is not valid here`);
        const known = k === "cacheTtlSeconds" ? operationsNamed(name).length > 0 : catalogues.includes(name);
        if (!known) throw new Error(`${name} is not ${k === "cacheTtlSeconds" ? "an operation" : "a catalogue"} of this gateway (${k === "cacheTtlSeconds" ? "operations" : "catalogues"}: ${k === "cacheTtlSeconds" ? operationIds() : catalogues.join(", ")})`);
      }
    } catch (e) {
      problems.push(`${where(k)}: ${(e as Error).message}`);
    }
  }
  try {
    assertTimeZone(config.timeZone);
  } catch {
    problems.push(`${where("timeZone")} must be an IANA time zone such as Asia/Shanghai, not ${JSON.stringify(config.timeZone)}`);
  }
  if ((config.tlsCert === "") !== (config.tlsKey === "")) problems.push("GATEWAY_TLS_CERT and GATEWAY_TLS_KEY must be set together");
  if (config.nodeLabel !== "" && !/^[A-Za-z0-9_-]{1,32}$/.test(config.nodeLabel)) problems.push(`${where("nodeLabel")} must be 1 to 32 letters, digits, _ or -`);
  if ((config.databaseUrl === "") !== (config.redisUrl === "")) {
    problems.push(`shared mode needs both GATEWAY_DATABASE_URL and GATEWAY_REDIS_URL; ${config.databaseUrl === "" ? "GATEWAY_DATABASE_URL" : "GATEWAY_REDIS_URL"} is not set`);
  }
  if (config.databaseUrl !== "" && !/^postgres(ql)?:\/\/[^\s]+$/.test(config.databaseUrl)) problems.push(`${where("databaseUrl")} must be a postgres:// URL`);
  if (config.redisUrl !== "" && !/^rediss?:\/\/[^\s]+$/.test(config.redisUrl)) problems.push(`${where("redisUrl")} must be a redis:// URL`);
  for (const origin of corsOriginList(config)) {
    if (origin !== "*" && !/^https?:\/\/[^/\s]+$/.test(origin)) problems.push(`${where("corsOrigins")}: ${JSON.stringify(origin)} is not an origin such as https://shop.example.com`);
  }
  const upstreamUsed = catalogues.some((c) => sourceOf(config, c) === "upstream");
  if (upstreamUsed && config.upstreamUrl === "") problems.push("GATEWAY_SOURCES names the upstream but GATEWAY_UPSTREAM_URL is not set");
  if (upstreamUsed && (config.upstreamKey === "" || config.upstreamSecret === "")) problems.push("GATEWAY_UPSTREAM_KEY and GATEWAY_UPSTREAM_SECRET must be set to use the upstream");
  if (config.translationEngine === "libretranslate" && !/^https?:\/\//.test(config.translateUrl)) problems.push("GATEWAY_TRANSLATE_URL must be an http(s) URL to use libretranslate");
  const proxies = trustedProxyList(config);
  const proxyProblem = trustedProxiesProblem(proxies);
  if (proxyProblem !== undefined) problems.push(`${where("trustedProxies")}: ${proxyProblem}`);
  if (config.adminToken !== "" && config.adminToken.length < 16) problems.push(`${where("adminToken")} must be at least 16 characters`);
  if (config.cacheMaxBytes > (config.memoryMb * 1_048_576) / 2) {
    problems.push(`${where("cacheMaxBytes")} is more than half of the memory budget (${where("memoryMb")} = ${config.memoryMb}); raise the budget or lower the cache's bound`);
  }
  return problems;
}

/** The settings as the README's table: one line per setting, generated from the rows above. */
export function settingsTable(): string {
  const lines = ["| variable (JSON key) | default | what it does |", "|---|---|---|"];
  for (const [k, s] of settingRows) {
    const shown = s.shown ?? (s.default === "" ? "empty" : `\`${s.default}\``);
    lines.push(`| \`${s.env}\` (\`${k}\`) | ${shown} | ${s.doc} |`);
  }
  return lines.join("\n");
}

function operationIds(): string {
  return operations.map((op) => op.id).join(", ");
}

/** The trusted proxies as a list. */
export function trustedProxyList(config: Pick<GatewayConfig, "trustedProxies">): string[] {
  return config.trustedProxies.split(",").map((o) => o.trim()).filter((o) => o !== "");
}

/** The CORS origins as a list. */
export function alertHostList(config: Pick<GatewayConfig, "alertHosts">): string[] {
  return config.alertHosts
    .split(",")
    .map((h) => h.trim())
    .filter((h) => h !== "");
}

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

/** The response cache's bound: GATEWAY_CACHE_MAX_BYTES when set, else the memory budget's share. */
export function cacheBound(config: Pick<GatewayConfig, "cacheMaxBytes" | "memoryMb">): number {
  return config.cacheMaxBytes >= 0 ? config.cacheMaxBytes : memoryPlan(config.memoryMb).cacheMaxBytes;
}
