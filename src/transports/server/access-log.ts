import { LogController, type FastifyBaseLogger, type FastifyReply, type FastifyRequest } from "fastify";
import type { CallLogFields } from "../../core/gateway.ts";

declare module "fastify" {
  interface FastifyRequest {
    /** What the core tells the access line of the request's call, once a route hands it to the core (callLogOf); null before. */
    callLog: CallLogFields | null;
  }
}

/** A request's CallLogFields on Fastify's path: handed to the core with its call (CallInput.logFields), read by its `request completed` line. */
export function callLogOf(req: FastifyRequest): CallLogFields {
  return (req.callLog ??= {});
}

/**
 * Fastify's access lines, with what the core told of the call (its
 * four-digit code, its span) on the last one, as the fast paths' accessLog
 * writes it. The app decorates its requests with `callLog`.
 */
export class AccessLogController extends LogController {
  override requestCompleted(error: Error | null | undefined, request: FastifyRequest, reply: FastifyReply): void {
    if (this.isLogDisabled(request)) return;
    const call = request.callLog;
    if (error) reply.log.error({ res: reply, err: error, responseTime: reply.elapsedTime, ...call }, "request errored");
    else reply.log.info({ res: reply, responseTime: reply.elapsedTime, ...call }, "request completed");
  }
}

/** A request's access lines once the first is written: what the core tells of the call (CallInput.logFields), and the writer of the last. */
export interface AccessEntry {
  readonly fields: CallLogFields;
  completed(statusCode: number): void;
}

/**
 * Writes a request's first access line and returns its entry, or undefined when info lines are off.
 * `traceparent`: the request's header, whose trace id the line names (logger.ts).
 */
export type AccessLog = (requestId: string, method: string, url: string, clientIp: string, traceparent: string | string[] | undefined) => AccessEntry | undefined;

/** Whether the logger writes info lines (Fastify's no-op logger, with logging off, cannot say, and writes nothing). */
function infoEnabled(log: FastifyBaseLogger): boolean {
  const pinoLike = log as FastifyBaseLogger & { isLevelEnabled?: (level: string) => boolean };
  return typeof pinoLike.isLevelEnabled === "function" && pinoLike.isLevelEnabled("info");
}

/**
 * The two access lines Fastify writes for each request ("incoming request",
 * "request completed", on a child logger bound to the request id), for the
 * fast paths that answer before Fastify sees the request: the app's
 * logger, so its serializers (credentials redacted from the URL) apply.
 * The last carries what the core told of the call, as Fastify's own does
 * (AccessLogController).
 */
export function accessLog(log: FastifyBaseLogger): AccessLog {
  if (!infoEnabled(log)) return () => undefined;
  return (requestId, method, url, clientIp, traceparent) => {
    const started = performance.now();
    const child = log.child({ requestId });
    child.info({ req: { method, url, clientIp, headers: { traceparent } } }, "incoming request");
    const fields: CallLogFields = {};
    // One shape for every line (pino leaves out a field that is undefined), not a spread of what was set.
    return {
      fields,
      completed: (statusCode) =>
        child.info({ res: { statusCode }, responseTime: performance.now() - started, errorCode: fields.errorCode, traceId: fields.traceId, spanId: fields.spanId }, "request completed"),
    };
  };
}
