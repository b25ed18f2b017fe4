import { Code, ConnectError, type ConnectRouter } from "@connectrpc/connect";
import type { Readiness, ReadinessReport } from "../../core/health.ts";
import { Health, HealthCheckResponse_ServingStatus as ServingStatus } from "../../gen/grpc/health/v1/health_pb.js";
import { callerEndedKey } from "./context.ts";

const statusOf = (report: ReadinessReport) => (report.ready ? ServingStatus.SERVING : ServingStatus.NOT_SERVING);

/**
 * The standard gRPC health service (`grpc.health.v1.Health`): the server as a
 * whole ("") and each mounted service by name, all serving exactly when the
 * gateway is ready (`/readyz`). Check answers NOT_FOUND for a service it does
 * not serve; Watch answers SERVICE_UNKNOWN and keeps the stream open, as the
 * protocol asks, and sends each change of status until the caller hangs up
 * (and, to find out whether it has, its status again once an HTTP/1.x caller
 * ends its side of the connection).
 */
export function healthRoutes(readiness: Readiness, services: () => readonly string[], endedCallerRepeatMs = 15_000): (router: ConnectRouter) => void {
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
        const aborted = new Promise<void>((resolve) => ctx.signal.addEventListener("abort", () => resolve(), { once: true }));
        // An HTTP/1.x caller that ends its side is sent the status it has again at once, and then every
        // `endedCallerRepeatMs` while nothing changes: one that has closed its socket meets it with a reset and
        // the stream ends, rather than at the next change, which may never come (hang-up-check.ts).
        const callerEnded = ctx.values.get(callerEndedKey)();
        const ended = new Promise<void>((resolve) => {
          if (callerEnded?.aborted === true) resolve();
          else callerEnded?.addEventListener("abort", () => resolve(), { once: true });
        });
        /** Resolves when the status should be sent again to a caller that ended its side: at once, then each repeat. */
        let repeat: Promise<void> = ended;
        const repeated = () => {
          repeat = ended.then(() => new Promise<void>((resolve) => setTimeout(resolve, endedCallerRepeatMs).unref()));
        };
        if (!known(req.service)) {
          yield { status: ServingStatus.SERVICE_UNKNOWN };
          for (;;) {
            await Promise.race([aborted, repeat]);
            if (ctx.signal.aborted) return;
            repeated();
            yield { status: ServingStatus.SERVICE_UNKNOWN };
          }
        }
        // Changes arrive through a queue, so none is lost between two sends.
        const queue: ServingStatus[] = [];
        let wake: (() => void) | undefined;
        const stop = readiness.watch((report) => {
          queue.push(statusOf(report));
          wake?.();
        });
        try {
          let last = statusOf(await readiness.report());
          yield { status: last };
          if (readiness.draining) return;
          while (!ctx.signal.aborted) {
            let again = false;
            const woken = [new Promise<void>((resolve) => (wake = resolve)), aborted];
            if (queue.length === 0) await Promise.race(callerEnded === undefined ? woken : [...woken, repeat.then(() => (again = true))]);
            wake = undefined;
            if (again && queue.length === 0 && !ctx.signal.aborted) {
              repeated();
              yield { status: last };
              continue;
            }
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
