import { Code, ConnectError, type ConnectRouter } from "@connectrpc/connect";
import type { Readiness, ReadinessReport } from "../../core/health.ts";
import { Health, HealthCheckResponse_ServingStatus as ServingStatus } from "../../gen/grpc/health/v1/health_pb.js";

const statusOf = (report: ReadinessReport) => (report.ready ? ServingStatus.SERVING : ServingStatus.NOT_SERVING);

/**
 * The standard gRPC health service (`grpc.health.v1.Health`): the server as a
 * whole ("") and each mounted service by name, all serving exactly when the
 * gateway is ready (`/readyz`). Check answers NOT_FOUND for a service it does
 * not serve; Watch answers SERVICE_UNKNOWN and keeps the stream open, as the
 * protocol asks, and sends each change of status until the caller hangs up.
 */
export function healthRoutes(readiness: Readiness, services: () => readonly string[]): (router: ConnectRouter) => void {
  const known = (name: string) => name === "" || services().includes(name);
  return (router) => {
    router.service(Health, {
      async check(req) {
        if (!known(req.service)) throw new ConnectError(`no service ${JSON.stringify(req.service)} on this server`, Code.NotFound);
        return { status: statusOf(await readiness.report()) };
      },
      async list() {
        const status = statusOf(await readiness.report());
        return { statuses: Object.fromEntries(["", ...services()].map((name) => [name, { status }])) };
      },
      async *watch(req, ctx) {
        if (!known(req.service)) {
          yield { status: ServingStatus.SERVICE_UNKNOWN };
          await new Promise<void>((resolve) => ctx.signal.addEventListener("abort", () => resolve(), { once: true }));
          return;
        }
        // Changes arrive through a queue, so none is lost between two sends.
        const queue: ServingStatus[] = [];
        let wake: (() => void) | undefined;
        const stop = readiness.watch((report) => {
          queue.push(statusOf(report));
          wake?.();
        });
        const aborted = new Promise<void>((resolve) => ctx.signal.addEventListener("abort", () => resolve(), { once: true }));
        try {
          let last = statusOf(await readiness.report());
          yield { status: last };
          if (readiness.draining) return;
          while (!ctx.signal.aborted) {
            if (queue.length === 0) await Promise.race([new Promise<void>((resolve) => (wake = resolve)), aborted]);
            wake = undefined;
            for (const status of queue.splice(0)) {
              if (status === last) continue;
              last = status;
              yield { status };
            }
            // A draining server has said NOT_SERVING; the stream ends so the server can close.
            if (readiness.draining && last === ServingStatus.NOT_SERVING) return;
          }
        } finally {
          stop();
        }
      },
    });
  };
}
