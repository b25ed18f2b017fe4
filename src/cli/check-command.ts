import { accessSync, constants, existsSync, readFileSync, statSync } from "node:fs";
import { hostname } from "node:os";
import { dirname, join, resolve } from "node:path";
import { DatabaseSync } from "node:sqlite";
import { parseArgs } from "node:util";
import { cacheBound, type GatewayConfig } from "../config.ts";
import { otlpPlan, type OtlpPlan } from "../exporters/otlp-plan.ts";
import { OtlpTraceExporter } from "../exporters/otlp-traces.ts";
import { packageVersion } from "../package-version.ts";
import { databasePath, sharedMode } from "../runtime.ts";
import { migrations as embeddedSteps, schemaStep } from "../stores/embedded/sqlite-database.ts";
import { storeSpace } from "../stores/embedded/store-space.ts";
import { processUser } from "../stores/embedded/data-directory-lock.ts";
import { clockOffset, migrations as sharedSteps, openPostgres } from "../stores/postgres/postgres-database.ts";
import { probeRedis } from "../stores/redis/redis-client.ts";
import { TlsCertificateFiles, TlsFilesError } from "../transports/server/tls-certificate.ts";
import { ListenError, listenProbe } from "./listen-error.ts";
import { connectionCapUnder, openFilesLimit } from "../open-files.ts";

/**
 * `gateway check`: what `serve` would start with, looked at before it does,
 * as `nginx -t` or `kong check` do. It reads and never writes: the stores
 * are opened read-only (the embedded one) or only queried (PostgreSQL,
 * Redis), no schema step is applied, no lock taken, and the upstream
 * provider is not contacted (a request to it may be billed). Each finding
 * is `ok`, `warn` (serve starts, but look) or `fail` (serve would not
 * start, or would serve wrongly); the exit code is 1 with any `fail`, 0
 * otherwise, and 2 for a configuration that does not read, as for every
 * command. Secrets never appear: URLs are shown without their credentials.
 */

export type CheckStatus = "ok" | "warn" | "fail";

export interface Finding {
  readonly check: string;
  readonly status: CheckStatus;
  readonly detail: string;
}

/** A certificate that expires sooner than this is a warning: renewals (certbot, cert-manager) run 30 days ahead. */
const expirySoonDays = 14;

const day = 86_400_000;

/** What the TLS files would serve, if set. */
export function tlsFindings(config: GatewayConfig, now: number): Finding[] {
  if (config.tlsCert === "") return [{ check: "tls", status: "ok", detail: "off: cleartext HTTP/1.1 and h2c (GATEWAY_TLS_CERT unset)" }];
  let files: TlsCertificateFiles;
  try {
    files = TlsCertificateFiles.open({ cert: config.tlsCert, key: config.tlsKey }, { checkEveryMs: 0 });
  } catch (e) {
    if (!(e instanceof TlsFilesError)) throw e;
    return [{ check: "tls", status: "fail", detail: e.message }];
  }
  const { subject, fingerprint, notBefore, notAfter } = files.facts;
  const left = Math.floor((notAfter.getTime() - now) / day);
  const served = `${subject}, SHA-256 ${fingerprint}, valid until ${notAfter.toISOString()}`;
  const reread = config.tlsCheckSeconds > 0 ? `read again every ${config.tlsCheckSeconds} s and on SIGHUP` : "read again on SIGHUP";
  if (notAfter.getTime() <= now) return [{ check: "tls", status: "fail", detail: `${served}: expired; clients refuse it` }];
  if (notBefore.getTime() > now) return [{ check: "tls", status: "fail", detail: `${served}: not valid until ${notBefore.toISOString()}; clients refuse it` }];
  if (left < expirySoonDays) return [{ check: "tls", status: "warn", detail: `${served}: expires in ${left} day(s); renew it (${reread})` }];
  return [{ check: "tls", status: "ok", detail: `${served} (${left} days; ${reread})` }];
}

/** A store's schema step against this gateway's. */
function schemaFinding(check: string, where: string, found: number, known: number, after = ""): Finding {
  if (found === known) return { check, status: "ok", detail: `${where}: schema step ${found}, this gateway's${after}` };
  if (found === 0) return { check, status: "ok", detail: `${where}: no schema yet; serve creates it (step ${known})${after}` };
  if (found < known) return { check, status: "warn", detail: `${where}: schema step ${found} of ${known}; serve applies the ${known - found} step(s) left at start (back the store up first: gateway backup FILE, or pg_dump in shared mode)${after}` };
  return {
    check,
    status: "warn",
    detail: `${where}: schema step ${found}, written by a newer gateway (this one knows ${known}); serve runs on it as it is, without what the newer steps added: run the newer gateway${after}`,
  };
}

/** What the store's rows say: accounts, named admins, catalogue records. The same tables in both stores. */
interface StoreCounts {
  readonly active: number;
  readonly stopped: number;
  readonly admins: number;
  readonly catalogue: readonly { readonly catalogue: string; readonly records: number }[];
}

const countsSql = {
  accounts: "SELECT status, count(*) AS n FROM accounts GROUP BY status",
  admins: "SELECT count(*) AS n FROM admin_tokens WHERE revoked_at IS NULL",
  catalogue: "SELECT catalogue, count(*) AS n FROM catalogue_records GROUP BY catalogue ORDER BY catalogue",
};

function countsFinding(counts: StoreCounts, config: GatewayConfig): Finding[] {
  const catalogue = counts.catalogue.map((c) => `${c.catalogue} ${c.records}`).join(", ");
  const findings: Finding[] = [
    {
      check: "accounts",
      status: counts.active > 0 ? "ok" : "warn",
      detail: counts.active > 0 ? `${counts.active} active, ${counts.stopped} stopped` : `none active (${counts.stopped} stopped): every catalogue call is refused (4001) until one is made (gateway accounts create)`,
    },
  ];
  if (catalogue !== "") findings.push({ check: "catalogue", status: "ok", detail: `records: ${catalogue}${config.upstreamUrl !== "" ? "; and the upstream provider" : ""}` });
  else if (config.upstreamUrl === "" && config.sources === "") findings.push({ check: "catalogue", status: "warn", detail: "no catalogue records and no upstream provider: every item is answered 2000 (not found); gateway import FILE.ndjson, or GATEWAY_UPSTREAM_URL" });
  findings.push(
    config.adminToken === "" && counts.admins === 0
      ? { check: "admin", status: "ok", detail: "the AdminService and console are off (no GATEWAY_ADMIN_TOKEN, no named admins): the CLI only" }
      : { check: "admin", status: "ok", detail: `the AdminService takes ${[config.adminToken !== "" ? "GATEWAY_ADMIN_TOKEN" : "", counts.admins > 0 ? `${counts.admins} named admin(s)' tokens` : ""].filter(Boolean).join(" and ")}` },
  );
  return findings;
}

/** Whether a gateway serves from this data directory now, from the name its lock's holder left. */
function lockHolder(dataDir: string): string {
  try {
    const o = JSON.parse(readFileSync(join(dataDir, "serve.owner"), "utf8")) as { pid: number; host: string; since: string };
    if (o.host !== hostname()) return `; serve.owner names process ${o.pid} on ${o.host} (since ${o.since}), another host`;
    try {
      process.kill(o.pid, 0);
      return `; served now by process ${o.pid} (since ${o.since})`;
    } catch {
      return "; not served now";
    }
  } catch {
    return "; not served now";
  }
}

/** A size as people read it: 1.5 GiB, 153.2 MiB, 152 KiB. */
function size(bytes: number): string {
  if (bytes >= 1024 ** 3) return `${(bytes / 1024 ** 3).toFixed(1)} GiB`;
  if (bytes >= 1024 ** 2) return `${(bytes / 1024 ** 2).toFixed(1)} MiB`;
  return `${Math.round(bytes / 1024)} KiB`;
}

/** Warn before less free space than this, or twice the floor where that is more: room for a day of calls and a backup. */
const freeSpaceWarnBytes = 1024 * 1_048_576;

/**
 * The embedded store's room against its two limits: past either, every
 * call that would be served answers 4000 (a fail); near either, a warning.
 */
export function spaceFindings(config: GatewayConfig): Finding[] {
  const space = storeSpace(databasePath(config), config.dataDir);
  const findings: Finding[] = [];
  const floor = config.minFreeMb * 1_048_576;
  if (space.freeBytes === undefined) findings.push({ check: "disk", status: "warn", detail: `the free space in ${config.dataDir} cannot be measured` });
  else {
    const free = `${size(space.freeBytes)} free in ${config.dataDir}`;
    const refusedBelow = floor > 0 ? `; calls are refused (4000) below ${size(floor)} (GATEWAY_MIN_FREE_MB)` : "; GATEWAY_MIN_FREE_MB is 0: a full disk fails commits as they come";
    if (floor > 0 && space.freeBytes < floor) findings.push({ check: "disk", status: "fail", detail: `${free}: under GATEWAY_MIN_FREE_MB (${size(floor)}), so every call that would be served is refused (4000)` });
    else if (space.freeBytes < Math.max(freeSpaceWarnBytes, 2 * floor)) findings.push({ check: "disk", status: "warn", detail: `${free}${refusedBelow}` });
    else findings.push({ check: "disk", status: "ok", detail: `${free}${refusedBelow}` });
  }
  if (config.storeMaxBytes > 0) {
    const used = `${size(space.bytes)} of its ${size(config.storeMaxBytes)} cap (GATEWAY_STORE_MAX_BYTES)`;
    if (space.bytes >= config.storeMaxBytes) findings.push({ check: "disk", status: "fail", detail: `the store holds ${used}: full, so every call that would be served is refused (4000)` });
    else if (space.bytes >= 0.9 * config.storeMaxBytes) findings.push({ check: "disk", status: "warn", detail: `the store holds ${used}: raise the cap, or shorten GATEWAY_LEDGER_RETENTION_DAYS` });
    else findings.push({ check: "disk", status: "ok", detail: `the store holds ${used}` });
  }
  return findings;
}

/** The embedded store, opened read-only: its schema step, counts and whether a gateway serves it now. */
export function embeddedFindings(config: GatewayConfig): Finding[] {
  const path = databasePath(config);
  const unwritable = dataDirectoryFinding(config.dataDir);
  if (!existsSync(path)) return [...unwritable, { check: "store", status: "warn", detail: `embedded: ${path} does not exist yet; serve creates it empty (no accounts, no catalogue)` }, ...spaceFindings(config)];
  let db: DatabaseSync | undefined;
  try {
    db = new DatabaseSync(path, { readOnly: true });
    const found = schemaStep(db);
    const findings = [schemaFinding("store", `embedded: ${path}`, found, embeddedSteps.length, lockHolder(config.dataDir))];
    // Counts read tables that every step since named admins (11) has.
    if (found >= 11) {
      const all = (sql: string) => db!.prepare(sql).all() as Rows;
      findings.push(...countsFinding(countsOf({ accounts: all(countsSql.accounts), admins: all(countsSql.admins), catalogue: all(countsSql.catalogue) }), config));
    }
    return [...unwritable, ...findings, ...spaceFindings(config)];
  } catch (e) {
    return [{ check: "store", status: "fail", detail: `embedded: ${path} cannot be read (${(e as { code?: string }).code ?? (e as Error).message})` }];
  } finally {
    db?.close();
  }
}

/**
 * A data directory serve could not make or write, as the user `check` runs
 * as (run it as the gateway's own: `sudo -u gateway npx gateway check`):
 * nothing when it could. Only asked, never written.
 */
export function dataDirectoryFinding(dataDir: string): Finding[] {
  // The directory, or where it would be made: its nearest existing parent.
  let dir = resolve(dataDir);
  while (!existsSync(dir) && dirname(dir) !== dir) dir = dirname(dir);
  try {
    if (!statSync(dir).isDirectory()) throw Object.assign(new Error(`${dir} is a file`), { code: "ENOTDIR" });
    accessSync(dir, constants.W_OK);
    return [];
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code ?? "";
    const user = processUser();
    const what = dir === resolve(dataDir) ? dataDir : `${dir}, where ${dataDir} would be made,`;
    const why = code === "ENOTDIR" ? `is a file, not a directory` : `is not writable by ${user} (${code === "EROFS" ? "a read-only file system" : code})`;
    return [{ check: "data directory", status: "fail", detail: `${what} ${why}: serve would not start` }];
  }
}

type Rows = Record<string, unknown>[];

/** The counts from the rows of `countsSql`'s three queries, as either store returns them. */
function countsOf(rows: { readonly accounts: Rows; readonly admins: Rows; readonly catalogue: Rows }): StoreCounts {
  const byStatus = new Map(rows.accounts.map((r) => [String(r.status), Number(r.n)]));
  return {
    active: byStatus.get("active") ?? 0,
    stopped: byStatus.get("stopped") ?? 0,
    admins: Number(rows.admins[0]?.n ?? 0),
    catalogue: rows.catalogue.map((r) => ({ catalogue: String(r.catalogue), records: Number(r.n) })),
  };
}

/** Why a server could not be reached or read, in words that quote no URL (a URL may hold a password). */
function whyUnreachable(e: unknown): string {
  const code = (e as { code?: string }).code;
  const words: Record<string, string> = {
    ECONNREFUSED: "connection refused",
    ENOTFOUND: "no such host",
    ETIMEDOUT: "it did not answer in time",
    "3D000": "the database does not exist",
    "28P01": "the password was refused",
    "28000": "the role may not connect",
    "42501": "the role may not read the gateway's tables",
  };
  if (code !== undefined) return words[code] ?? code;
  const message = (e as Error).message ?? String(e);
  return /timeout/i.test(message) ? "it did not answer in time" : message.replace(/\b[a-z]+:\/\/\S+/gi, "(URL)");
}

/** A URL as it may be shown: its host, port and path, never its user or password. */
export function shownUrl(url: string): string {
  const u = new URL(url);
  return `${u.protocol}//${u.host}${u.pathname === "/" ? "" : u.pathname}`;
}

/** The shared stores: PostgreSQL's version, schema step and counts; Redis's version. Only queries. */
export async function sharedFindings(config: GatewayConfig): Promise<Finding[]> {
  const findings: Finding[] = [];
  const where = `PostgreSQL ${shownUrl(config.databaseUrl)}`;
  const pool = openPostgres(config.databaseUrl, { max: 1 });
  try {
    const version = (await pool.query<{ server_version: string }>("SHOW server_version")).rows[0]!.server_version;
    const exists = (await pool.query<{ t: string | null }>("SELECT to_regclass('schema_migrations')::text AS t")).rows[0]!.t !== null;
    const found = exists ? Number((await pool.query<{ v: number | null }>("SELECT max(version) AS v FROM schema_migrations")).rows[0]!.v ?? 0) : 0;
    findings.push(schemaFinding("store", `shared: ${where} (server ${version})`, found, sharedSteps.length));
    findings.push(clockFinding(await clockOffset(pool, Date.now)));
    if (found >= 9) {
      const all = async (sql: string) => (await pool.query(sql)).rows as Rows;
      findings.push(...countsFinding(countsOf({ accounts: await all(countsSql.accounts), admins: await all(countsSql.admins), catalogue: await all(countsSql.catalogue) }), config));
    }
  } catch (e) {
    findings.push({ check: "store", status: "fail", detail: `shared: ${where} cannot be reached or read (${whyUnreachable(e)})` });
  } finally {
    await pool.end().catch(() => {});
  }
  const cache = `Redis ${shownUrl(config.redisUrl)}`;
  try {
    findings.push({ check: "cache", status: "ok", detail: `shared: ${cache} (server ${(await probeRedis(config.redisUrl)).version})` });
  } catch (e) {
    findings.push({ check: "cache", status: "warn", detail: `shared: ${cache} cannot be reached (${whyUnreachable(e)}); serve starts and serves without it until it answers (README: Running several replicas)` });
  }
  return findings;
}

/** Past this, a replica's clock is too far from the shared database's for its rate limits and days to agree with the others'. */
export const clockOffsetWarnMs = 1000;

/** This machine's clock against PostgreSQL's (clockOffset): a warning past `clockOffsetWarnMs`. */
export function clockFinding(measured: { readonly offsetMs: number; readonly withinMs: number }): Finding {
  const ms = Math.round(Math.abs(measured.offsetMs));
  const within = `±${Math.max(1, Math.ceil(measured.withinMs))} ms`;
  if (ms <= clockOffsetWarnMs) return { check: "clock", status: "ok", detail: `this machine's clock is within ${ms} ms of PostgreSQL's (${within})` };
  const by = ms >= 10_000 ? `${(ms / 1000).toFixed(1)} s` : `${ms} ms`;
  return {
    check: "clock",
    status: "warn",
    detail: `this machine's clock is ${by} ${measured.offsetMs > 0 ? "ahead of" : "behind"} PostgreSQL's (${within}): each replica decides rate limits, each call's day and signed calls' time windows on its own clock, so replicas that disagree let accounts through faster than their rates and count calls near midnight on different days; keep every replica's clock in step (NTP)`,
  };
}

const loopback = new Set(["127.0.0.1", "::1", "localhost"]);

/**
 * What the settings expose, or leave open, beyond this machine; `listening`,
 * what `listenProbe` found of the address: a port another process holds is a
 * warning (the gateway itself, already serving?), one that cannot be had a failure.
 */
export function exposureFindings(config: GatewayConfig, listening?: unknown): Finding[] {
  const findings: Finding[] = [];
  const reachable = !loopback.has(config.host);
  const where = `${config.host}:${config.port}${reachable ? "" : " (this machine only)"}`;
  if (listening === undefined) findings.push({ check: "listen", status: "ok", detail: where });
  else if (listening instanceof ListenError && listening.exitCode === 1) findings.push({ check: "listen", status: "warn", detail: `${listening.message} (if it is this gateway, already serving, that is expected)` });
  else findings.push({ check: "listen", status: "fail", detail: listening instanceof Error ? listening.message : String(listening) });
  if (reachable && config.tlsCert === "") findings.push({ check: "listen", status: "warn", detail: `cleartext on ${config.host}: keys and secrets cross the network unencrypted unless a proxy in front terminates TLS (GATEWAY_TLS_CERT, or the proxy's)` });
  if (reachable && config.metricsToken === "") findings.push({ check: "metrics", status: "warn", detail: `/metrics answers anyone who reaches ${config.host}:${config.port} (GATEWAY_METRICS_TOKEN unset)` });
  if (config.upstreamUrl !== "") findings.push({ check: "upstream", status: "ok", detail: `${shownUrl(config.upstreamUrl)}; not contacted (a request to it may be billed)` });
  findings.push({ check: "memory", status: "ok", detail: `budget ${config.memoryMb} MiB; the response cache holds at most ${Math.round(cacheBound(config) / 1_048_576)} MiB` });
  return findings;
}

/** Whether the open-files limit, as this process has it (serve started the same way has the same), holds GATEWAY_MAX_CONNECTIONS beside the gateway's own files. */
export function connectionsFindings(config: GatewayConfig, limit: number | undefined): Finding[] {
  const fitted = connectionCapUnder(config.maxConnections, limit);
  if (limit === undefined) return [{ check: "connections", status: "ok", detail: `up to ${config.maxConnections} (the open-files limit cannot be read here)` }];
  if (!fitted.lowered) return [{ check: "connections", status: "ok", detail: `up to ${config.maxConnections}; the open-files limit, ${limit}, holds them and ${fitted.reserve} more for the gateway's own work` }];
  return [
    {
      check: "connections",
      status: "warn",
      detail: `the open-files limit, ${limit}, holds ${fitted.cap} connections beside the ${fitted.reserve} files kept for the gateway's own work, not GATEWAY_MAX_CONNECTIONS (${config.maxConnections}): serve lowers the cap to ${fitted.cap}; raise the limit (LimitNOFILE= under systemd, a container's nofile ulimit) to keep ${config.maxConnections}`,
    },
  ];
}

/** A collector's credentials sent in cleartext off this machine. */
export function cleartextCredentials(plan: Pick<OtlpPlan, "url" | "headers">): Finding[] {
  const u = new URL(plan.url);
  const host = u.hostname.replace(/^\[|\]$/g, "");
  const here = loopback.has(host) || /^127\./.test(host);
  if (u.protocol !== "http:" || here || Object.keys(plan.headers).length === 0) return [];
  return [{ check: "traces", status: "warn", detail: `the collector's header fields (GATEWAY_OTLP_HEADERS, credentials) cross the network to ${u.host} in cleartext: use https` }];
}

/**
 * Where the gateway's spans go: an empty export sent once (no span is
 * billed or stored), so a wrong endpoint, protocol or token shows before a
 * deploy rather than as `gateway_spans_total{outcome="dropped"}` after it.
 */
export async function tracesFindings(config: GatewayConfig): Promise<Finding[]> {
  const plan = otlpPlan(config).plan;
  if (plan === undefined) {
    const named = config.otlpTracesUrl !== "" || config.otlpEndpoint !== "";
    return [{ check: "traces", status: "ok", detail: named ? "off (GATEWAY_TRACES_EXPORTER=none): no span is recorded" : "off: no collector named (GATEWAY_OTLP_ENDPOINT)" }];
  }
  const how = `spans to ${shownUrl(plan.url)} over ${plan.protocol}${plan.gzip ? ", gzip" : ""}${plan.tls.cert !== undefined ? ", with a client certificate" : ""}`;
  const findings = cleartextCredentials(plan);
  const exporter = new OtlpTraceExporter({ ...plan, instanceId: config.nodeLabel || "check", serviceVersion: packageVersion() });
  const refused = await exporter.probe();
  findings.unshift(
    refused === undefined
      ? { check: "traces", status: "ok", detail: `${how}; the collector took an empty export` }
      : { check: "traces", status: "warn", detail: `${how}; an empty export was not taken (${refused}): serve would start, and drop every span` },
  );
  return findings;
}

export async function checkCommand(config: GatewayConfig, args: string[]): Promise<number> {
  const { values } = parseArgs({ args, options: { json: { type: "boolean", default: false } } });
  const findings: Finding[] = [
    { check: "configuration", status: "ok", detail: `read${process.env.GATEWAY_CONFIG ? ` from ${process.env.GATEWAY_CONFIG} and` : " from"} the environment; ${sharedMode(config) ? "shared mode" : "embedded mode"}` },
    ...tlsFindings(config, Date.now()),
    ...(sharedMode(config) ? await sharedFindings(config) : embeddedFindings(config)),
    ...exposureFindings(config, await listenProbe(config.host, config.port)),
    ...connectionsFindings(config, openFilesLimit()),
    ...(await tracesFindings(config)),
  ];
  const failed = findings.some((f) => f.status === "fail");
  // console.log, as every command writes: a reader that stops early (`| head`) ends the output quietly (EPIPE).
  if (values.json) console.log(JSON.stringify({ ok: !failed, findings }, null, 2));
  else {
    for (const f of findings) console.log(`${f.status.padEnd(5)} ${f.check.padEnd(14)} ${f.detail}`);
    const warned = findings.filter((f) => f.status === "warn").length;
    console.log(failed ? "serve would not start, or would serve wrongly: see fail above" : `serve would start${warned > 0 ? ` (${warned} warning(s) above)` : ""}`);
  }
  return failed ? 1 : 0;
}
