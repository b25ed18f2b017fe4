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
  /** GATEWAY_LEDGER_COMMIT_MS: how long a ledger row may wait for its group commit. */
  ledgerCommitMs: number;
  /** GATEWAY_ADMIN_TOKEN: bearer token of the AdminService; empty turns it off. */
  adminToken: string;
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
  ledgerCommitMs: 2,
  adminToken: "",
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
  for (const k of ["host", "dataDir", "timeZone", "zoneLabel", "nodeLabel", "tlsCert", "tlsKey", "logLevel", "corsOrigins", "adminToken"] as const) {
    if (typeof raw[k] === "string") config[k] = raw[k];
    else problems.push(`${where(k)} must be text`);
  }
  const port = integer(raw.port, 0, 65535);
  if (port === undefined) problems.push(`${where("port")} must be a whole number from 0 to 65535, not ${JSON.stringify(raw.port)}`);
  else config.port = port;
  const body = integer(raw.maxBodyBytes, 1024, 1 << 30);
  if (body === undefined) problems.push(`${where("maxBodyBytes")} must be a whole number of bytes from 1024 to 1073741824`);
  else config.maxBodyBytes = body;
  const commit = integer(raw.ledgerCommitMs, 0, 1000);
  if (commit === undefined) problems.push(`${where("ledgerCommitMs")} must be a whole number of milliseconds up to 1000`);
  else config.ledgerCommitMs = commit;
  const grace = integer(raw.shutdownGraceMs, 0, 600000);
  if (grace === undefined) problems.push(`${where("shutdownGraceMs")} must be a whole number of milliseconds up to 600000`);
  else config.shutdownGraceMs = grace;
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
  if (config.adminToken !== "" && config.adminToken.length < 16) problems.push(`${where("adminToken")} must be at least 16 characters`);
  if (problems.length > 0) throw new ConfigError(`bad configuration:\n  - ${problems.join("\n  - ")}`);
  config.dataDir = isAbsolute(config.dataDir) ? config.dataDir : resolve(config.dataDir);
  return config;
}

/** The CORS origins as a list. */
export function corsOriginList(config: Pick<GatewayConfig, "corsOrigins">): string[] {
  return config.corsOrigins.split(",").map((o) => o.trim()).filter((o) => o !== "");
}
