import type { FastifyInstance } from "fastify";
import type { Readiness } from "../../core/health.ts";

/**
 * `GET /healthz` (liveness: the process serves requests) and `GET /readyz`
 * (readiness: every store answers and takes writes, and the gateway is not
 * draining), each a small JSON body naming its checks; 503 names the failing
 * one. A failing store the gateway serves without (Redis) leaves it ready,
 * named under `degraded`. Probes need no key and are neither metered nor ledgered; their access
 * lines are left out of the log below `warn`.
 */
export function installProbes(app: FastifyInstance, readiness: Readiness): void {
  app.get("/healthz", { logLevel: "warn" }, async (_req, reply) =>
    reply.code(200).header("cache-control", "no-store").send({ status: "ok", checks: { process: { ok: true } } }),
  );
  app.get("/readyz", { logLevel: "warn" }, async (_req, reply) => {
    const report = await readiness.report();
    const checks = Object.fromEntries(report.checks.map((c) => [c.name, c.ok ? { ok: true } : { ok: false, reason: c.reason }]));
    const failing = report.checks.filter((c) => !c.ok && c.degradesOnly !== true).map((c) => c.name);
    const degraded = report.checks.filter((c) => !c.ok && c.degradesOnly === true).map((c) => c.name);
    const also = degraded.length > 0 ? { degraded } : {};
    return reply
      .code(report.ready ? 200 : 503)
      .header("cache-control", "no-store")
      .send(report.ready ? { status: "ready", ...also, checks } : { status: "unready", failing, ...also, checks });
  });
}
