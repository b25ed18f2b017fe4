import { mkdtempSync, rmSync } from "node:fs";
import type { Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { FastifyInstance } from "fastify";
import { defaultConfig, type GatewayConfig } from "../../src/config.ts";
import type { AccountPlan } from "../../src/core/account-admin.ts";
import type { CatalogueSource } from "../../src/core/catalogue-source.ts";
import type { Clock } from "../../src/core/clock.ts";
import { CachedCatalogue } from "../../src/core/cached-catalogue.ts";
import { Gateway } from "../../src/core/gateway.ts";
import type { Tracer } from "../../src/core/tracing.ts";
import { demoExampleIds, demoRecords } from "../../src/catalogue/demo-dataset.ts";
import { appOptions, openRuntime, seedDemoCatalogue, type Runtime, type RuntimeOptions } from "../../src/runtime.ts";
import { buildApp, type AppOptions } from "../../src/transports/server/app.ts";
import { createLogger } from "../../src/transports/server/logger.ts";

export interface GatewayFixture {
  readonly base: string;
  readonly port: number;
  readonly app: FastifyInstance;
  readonly runtime: Runtime;
  readonly config: GatewayConfig;
  /** An active account with both operations. */
  readonly account: { readonly key: string; readonly secret: string };
  newAccount(plan?: Partial<AccountPlan> & { externalId?: string }): Promise<{ key: string; secret: string }>;
  /** A core over this fixture's real stores, with other catalogue sources and no response cache. */
  gatewayWith(sources: ReadonlyMap<string, CatalogueSource>, log?: { error(obj: unknown, msg: string): void }, tracer?: Tracer): Gateway;
  close(): Promise<void>;
}

export const demo = demoExampleIds(demoRecords());

/** The AdminService token of every fixture. */
export const adminToken = "test-admin-token-0123456789";

/** How long a fixture's close waits for open connections before cutting them: `serve`'s default grace. */
const closeGraceMs = defaultConfig.shutdownGraceMs;

/** The real app on a real loopback port, over a fresh embedded store seeded with the demo catalogue. */
export async function startGateway(
  options: { clock?: Clock; app?: Partial<AppOptions>; config?: Partial<GatewayConfig>; logLines?: string[]; dataDir?: string; deliverAlerts?: RuntimeOptions["deliverAlerts"] } = {},
): Promise<GatewayFixture> {
  // A given data directory is the caller's (e.g. to restart on it); a fresh one is removed on close.
  const dataDir = options.dataDir ?? mkdtempSync(join(tmpdir(), "gateway-test-"));
  const config: GatewayConfig = { ...defaultConfig, dataDir, port: 0, ...options.config };
  const lines = options.logLines;
  // As `serve` does: one logger for the runtime and the app (when the test reads the lines).
  const logger = lines ? createLogger({ level: options.app?.logLevel || "info", stream: { write: (line: string) => lines.push(line) } as unknown as NodeJS.WritableStream }) : undefined;
  const runtime = await openRuntime(config, {
    ...(options.clock ? { clock: options.clock } : {}),
    ...(logger ? { log: logger } : {}),
    ...(options.deliverAlerts !== undefined ? { deliverAlerts: options.deliverAlerts } : {}),
    retention: true,
  });
  await seedDemoCatalogue(runtime);
  // The app as `serve` builds it from the same configuration; a test's own app options come last.
  const app = await buildApp({ ...appOptions(config, runtime, { ...(logger ? { logger } : {}), adminToken }), ...(logger ? {} : { logLevel: false as const }), ...options.app });
  await app.listen({ host: "127.0.0.1", port: 0 });
  const port = (app.server.address() as { port: number }).port;
  // Every connection, so that a close can cut what its test left open (below).
  const sockets = new Set<Socket>();
  app.server.on("connection", (socket: Socket) => {
    sockets.add(socket);
    socket.once("close", () => sockets.delete(socket));
  });
  const newAccount = async (plan: Partial<AccountPlan> & { externalId?: string } = {}) => {
    const { account, secret } = await runtime.admin.create(plan);
    return { key: account.key, secret };
  };
  return {
    base: `http://127.0.0.1:${port}`,
    port,
    app,
    runtime,
    config,
    account: await newAccount({ name: "test" }),
    newAccount,
    gatewayWith: (sources, log, tracer) =>
      new Gateway({ accounts: runtime.accounts, meter: runtime.meter, switches: runtime.switches, catalogue: new CachedCatalogue(sources, undefined), ...(log ? { log } : {}), ...(tracer ? { tracer } : {}) }),
    async close() {
      // A graceful close waits for every open connection's request. A test that left one half sent (a
      // hostile request) would hold it until the request timeout or longer; `serve` bounds the wait with
      // its grace (GATEWAY_SHUTDOWN_GRACE_MS, 10 s by default), and so does this, then cuts what is left.
      const cut = setTimeout(() => {
        process.stderr.write(`gateway fixture: the graceful close still waited after ${closeGraceMs} ms; cutting ${sockets.size} connection(s)\n`);
        for (const socket of sockets) socket.destroy();
      }, closeGraceMs);
      await app.close();
      clearTimeout(cut);
      await runtime.close();
      if (options.dataDir === undefined) rmSync(dataDir, { recursive: true, force: true });
    },
  };
}

/** A legacy GET: the raw body and the parsed JSON. */
export async function legacyGet(base: string, path: string, params: Record<string, string>): Promise<{ status: number; body: string; json: Record<string, unknown>; headers: Headers }> {
  const res = await fetch(`${base}${path}?${new URLSearchParams(params)}`);
  const body = await res.text();
  return { status: res.status, body, json: JSON.parse(body) as Record<string, unknown>, headers: res.headers };
}
