import { getHeapStatistics } from "node:v8";
import { randomBytes } from "node:crypto";
import { demoRecords } from "../catalogue/demo-dataset.ts";
import type { Operation } from "../core/operation.ts";
import { operations } from "../operations/index.ts";
import { cacheBound, type GatewayConfig } from "../config.ts";
import { appOptions, demoAccount, openRuntime, seedDemoCatalogue, sharedMode } from "../runtime.ts";
import { lockDataDirectory } from "../stores/embedded/data-directory-lock.ts";
import { credentialHeaders } from "../transports/credentials.ts";
import { buildApp } from "../transports/server/app.ts";
import { createLogger, flushRepeatedLines, stdoutOutput } from "../transports/server/logger.ts";
import { TlsCertificateFiles } from "../transports/server/tls-certificate.ts";
import { listenError } from "./listen-error.ts";
import { fixedOverheadMb } from "../memory-budget.ts";
import { connectionCapUnder, openFilesLimit } from "../open-files.ts";

/** The request's JSON body for a call of `op` with `args` (proto JSON names). */
function jsonBody(op: Operation, args: Readonly<Record<string, string>>): string {
  const body: Record<string, string> = {};
  for (const [name, value] of Object.entries(args)) body[op.method.input.fields.find((f) => f.name === name)!.jsonName] = value;
  return JSON.stringify(body);
}

/** Ready-to-paste calls of every operation, with the demo account and an example from the demo catalogue. */
function banner(base: string, tls: boolean, demo: { key: string; secret: string }, adminToken: string | undefined, consoleOn: boolean): string {
  const lines = demoRecords();
  const examples = operations.flatMap((op) => {
    const args = op.example(lines);
    return args === undefined ? [] : [{ op, args }];
  });
  const auth = `key=${demo.key}&secret=${demo.secret}`;
  const h2 = tls ? "--http2" : "--http2-prior-knowledge";
  const headers = `-H '${credentialHeaders.key}: ${demo.key}' -H '${credentialHeaders.secret}: ${demo.secret}'`;
  const rpcPath = (op: Operation) => `${base}/${op.service.typeName}/${op.method.name}`;
  const first = examples[0];
  return [
    "",
    `Demo account   key: ${demo.key}   secret: ${demo.secret}`,
    "(the demo secret is replaced on every start)",
    "",
    "Legacy query-string calls:",
    ...examples.map(({ op, args }) => `  curl '${base}${op.path}?${auth}&${new URLSearchParams(args)}'`),
    "",
    "Connect (JSON over HTTP/1.1):",
    ...examples.flatMap(({ op, args }) => [`  curl -H 'content-type: application/json' ${headers} \\`, `    -d '${jsonBody(op, args)}' ${rpcPath(op)}`]),
    "",
    "The account's own standing (its day's calls, balance, plan; QueryMyUsage for its usage, ListMyCalls for each call, GetMyBalanceStatement for its balance), read with its key, not charged:",
    `  curl -H 'content-type: application/json' ${headers} \\`,
    `    -d '{}' ${base}/gateway.account.v1.AccountService/GetMyAccount`,
    "",
    ...(first === undefined
      ? []
      : [
          "gRPC (HTTP/2 on the same port):",
          `  npx buf curl --protocol grpc ${h2} --schema . ${headers} \\`,
          `    -d '${jsonBody(first.op, first.args)}' ${rpcPath(first.op)}`,
          "",
        ]),
    ...(adminToken === undefined
      ? []
      : [
          `Admin API (token for this run only; set GATEWAY_ADMIN_TOKEN to keep one): ${adminToken}`,
          `  curl -H 'content-type: application/json' -H 'authorization: Bearer ${adminToken}' -d '{}' ${base}/gateway.admin.v1.AdminService/ListAccounts`,
          "",
        ]),
    ...(consoleOn ? [`Console: ${base}/console/ (sign in with the admin token)`, ""] : []),
  ].join("\n");
}

export async function serveCommand(config: GatewayConfig, options: { demo: boolean }): Promise<number> {
  // First of all: a second gateway on an embedded store must not seed, rotate the demo secret or serve.
  // In shared mode every replica serves the same stores; that is what they are for.
  const shared = sharedMode(config);
  const lock = shared ? undefined : lockDataDirectory(config.dataDir);
  // One logger for the runtime and the app, so every error line (a ledger that cannot be written, an internal RPC) is seen.
  stdoutOutput({ maxBacklogBytes: config.logBacklogKb * 1024 });
  const log = createLogger({ level: config.logLevel, repeatWindowSeconds: config.logRepeatSeconds });
  // Starting, listening and stopping are always told, as JSON lines, whatever the log level.
  const lifecycle = log.isLevelEnabled("info") ? log : createLogger({ level: "info" });
  // SIGHUP never ends the process (below); while it starts, the files it reads are being read anyway.
  let hangup = () => {};
  process.on("SIGHUP", () => hangup());
  const runtime = await openRuntime(config, { log, deliverAlerts: config.alerts === "on", retention: true });
  // What stdout's reader or disk could not take is counted (log-output.ts); an error writing stderr (a reader gone) is not the process's end.
  runtime.metrics.watchLogOutput(stdoutOutput());
  process.stderr.on("error", () => {});
  if (options.demo && (await seedDemoCatalogue(runtime))) lifecycle.info({ into: shared ? "the shared database" : config.dataDir }, "seeded the demo catalogue");
  // A demo without a configured admin token gets one for this run, printed below.
  const adminToken = config.adminToken === "" && options.demo ? randomBytes(24).toString("base64url") : config.adminToken;
  let appSettings: ReturnType<typeof appOptions>;
  try {
    appSettings = appOptions(config, runtime, { logger: log, adminToken, demo: options.demo });
  } catch (e) {
    // TLS files that cannot serve: nothing is left open behind the one line that says so.
    await runtime.close();
    lock?.release();
    throw e;
  }
  // A cap the open-files limit cannot hold is lowered to what it can, keeping files for the gateway's own work (open-files.ts).
  const openFiles = openFilesLimit();
  const fitted = connectionCapUnder(config.maxConnections, openFiles);
  appSettings = { ...appSettings, openFiles: { limit: openFiles, maxConnectionsSet: fitted.lowered ? config.maxConnections : undefined } };
  if (fitted.lowered) {
    appSettings = { ...appSettings, limits: { ...appSettings.limits, maxConnections: fitted.cap } };
    lifecycle.warn(
      { maxConnections: config.maxConnections, openFilesLimit: openFiles, keptForOwnWork: fitted.reserve, connectionCap: fitted.cap },
      `GATEWAY_MAX_CONNECTIONS (${config.maxConnections}) is lowered to ${fitted.cap}: this process may hold ${openFiles} open files, and keeps ${fitted.reserve} for its store, logs and connections to the provider, database and Redis. Past the limit the system would close clients' connections as they came, unseen, and fail the gateway's own; raise the limit (LimitNOFILE= under systemd, a container's nofile ulimit) to keep ${config.maxConnections}`,
    );
  }
  const tls = appSettings.tls !== undefined;
  const app = await buildApp(appSettings);
  runtime.metrics.watchMemory(config.memoryMb * 1_048_576, (config.memoryMb + fixedOverheadMb) * 1_048_576);
  try {
    await app.listen({ host: config.host, port: config.port });
  } catch (e) {
    // A port it cannot have: one line that says why and what to set, not a stack; nothing left open behind it.
    await app.close();
    await runtime.close();
    lock?.release();
    throw listenError(e, config.host, config.port);
  }
  const address = app.server.address();
  const port = typeof address === "object" && address !== null ? address.port : config.port;
  const host = config.host.includes(":") ? `[${config.host}]` : config.host;
  const base = `${tls ? "https" : "http"}://${host}:${port}`;
  // What the memory budget came to in this process: the heap limit V8 runs with (see bin/gateway.js) and the cache's bound.
  const memory = { memoryMb: config.memoryMb, heapLimitMb: Math.round(getHeapStatistics().heap_size_limit / 1_048_576), cacheMaxBytes: cacheBound(config) };
  lifecycle.info({ url: base, mode: shared ? "shared" : "embedded", node: runtime.gateway.nodeLabel, memory, connections: { maxConnections: fitted.cap, openFilesLimit: openFiles ?? null } }, `gateway listening on ${base} (legacy GET, Connect, gRPC-Web and gRPC on one port)`);
  if (options.demo) {
    let demo: { key: string; secret: string } | undefined;
    try {
      demo = await demoAccount(runtime);
    } catch (e) {
      // A store that cannot be written (a full disk) still serves; the demo account waits for space.
      log.error({ err: e }, "the demo account could not be written; the gateway serves without one");
    }
    // The one human text: the demo's ready-to-paste calls, on stdout as the demo has always printed them.
    if (demo !== undefined) stdoutOutput().write(`${banner(base, tls, demo, adminToken === config.adminToken ? undefined : adminToken, appSettings.console === true)}\n`);
  }

  await new Promise<void>((resolve) => {
    const stop = (signal: string) => {
      // Readiness turns first, so load balancers stop sending calls; every call is still served meanwhile.
      runtime.readiness.drain();
      lifecycle.info({ signal, drainDelayMs: config.drainDelayMs, graceMs: config.shutdownGraceMs }, "stopping: not ready from now on; in-flight calls finish, then the gateway exits");
      const force = setTimeout(() => {
        flushRepeatedLines(log);
        log.error({ graceMs: config.shutdownGraceMs }, "in-flight calls did not finish in time; stopping anyway");
        process.exit(1);
      }, config.drainDelayMs + config.shutdownGraceMs);
      force.unref();
      void new Promise((r) => setTimeout(r, config.drainDelayMs))
        .then(() => app.close())
        .then(() => runtime.close())
        .then(() => {
          lock?.release();
          // What was held back is counted before the last line.
          flushRepeatedLines(log);
          lifecycle.info("stopped");
          resolve();
        });
    };
    process.once("SIGTERM", () => stop("SIGTERM"));
    // SIGHUP (`systemctl reload`, ExecReload) reads the TLS certificate and key files again (a renewal), as nginx
    // and HAProxy do, and the OTLP collector's client certificate, where they are set. Without any, there is
    // nothing to read again; the gateway says so and serves on. Node's default (the process ends at once, calls
    // in flight cut, and systemd counts a SIGHUP as a clean exit, so it would not restart it) is never right here.
    const files = appSettings.tls;
    const exporter = runtime.renewExporterTls;
    hangup = () => {
      if (files instanceof TlsCertificateFiles) void files.reload("SIGHUP");
      exporter?.();
      if (!(files instanceof TlsCertificateFiles) && exporter === undefined) {
        lifecycle.info({ signal: "SIGHUP" }, "SIGHUP: no TLS or collector certificate files are set, so there is nothing to read again; serving on");
      }
    };
    process.once("SIGINT", () => stop("SIGINT"));
    // Started through npm or npx, the gateway runs under `sh -c`, which does not pass SIGTERM on:
    // a supervisor's SIGTERM ends npm and the shell and would leave the gateway running alone.
    // So when the process that started it is gone, it stops as on SIGTERM.
    if (process.env.npm_command !== undefined) {
      const parent = process.ppid;
      const watch = setInterval(() => {
        if (process.ppid === parent) return;
        clearInterval(watch);
        stop("parent exited");
      }, 500);
      watch.unref();
    }
  });
  // A reader of stdout that stopped reading holds a stop no longer than this; what it did not take is dropped.
  if (!(await stdoutOutput().settle(logSettleMs))) process.exit(0);
  return 0;
}

/** How long a stop waits for the log lines its stdout's reader has not taken yet. */
const logSettleMs = 2_000;
