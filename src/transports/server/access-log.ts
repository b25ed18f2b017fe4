import { LogController, type FastifyBaseLogger, type FastifyReply, type FastifyRequest } from "fastify";
import type { CallLogFields } from "../../core/gateway.ts";
import { everyLine } from "./repeated-lines.ts";

declare module "fastify" {
  interface FastifyRequest {
    /** What the core and the RPC layer tell the access line of the request's call, once a route hands it on (callLogOf); null before. */
    callLog: AccessFields | null;
    /** The request as its one access line names it, taken as it arrives (its address may be gone by its end); null in `both` mode. */
    accessRequest: RequestFields | null;
  }
}

/** A request as an access line names it (logger.ts serializes it as `req`). */
interface RequestFields {
  readonly method: string;
  readonly url: string;
  readonly clientIp: string;
  readonly headers: { readonly traceparent: string | string[] | undefined };
}

/**
 * What a request's last access line says of its call: what the core told
 * (CallLogFields: its four-digit code, its span), and, for an RPC that
 * ended in an error, its Connect/gRPC code (`rpcCode`, as Connect names it:
 * `unauthenticated`, `resource_exhausted`…), which a gRPC caller gets in
 * trailers after an HTTP 200, and which is the only code an RPC outside
 * the catalogue has (the AdminService, health, reflection).
 */
export interface AccessFields extends CallLogFields {
  rpcCode?: string;
}

/**
 * Which access lines are written (`GATEWAY_ACCESS_LOG`):
 * - `both`: `incoming request` as a request arrives and `request completed`
 *   as its answer finishes (Fastify's own pair);
 * - `completed`: only the second, which then carries the request's fields
 *   too (`req`: method, URL with credentials redacted, address, the
 *   caller's trace id): one line per request, as most proxies write;
 * - `failures`: that one line, only for a request that failed: a call whose
 *   four-digit code is neither 0000 nor 2000 (a served answer), an RPC that
 *   ended in an error (AccessFields.rpcCode), or any other request answered
 *   with an HTTP status of 400 or more;
 * - `off`: none.
 * Lines of errors are written whatever the mode, and every access line is
 * at `info`, under GATEWAY_LOG_LEVEL.
 */
export type AccessLogMode = "both" | "completed" | "failures" | "off";

export const accessLogModes: readonly AccessLogMode[] = ["both", "completed", "failures", "off"];

/** Whether a request's last line is written under `failures`: a call that was not served, an RPC that ended in an error, or another request refused. */
function failed(statusCode: number, call: AccessFields | null | undefined): boolean {
  const code = call?.errorCode;
  return code === undefined ? statusCode >= 400 || call?.rpcCode !== undefined : code !== "0000" && code !== "2000";
}

/** A request's AccessFields on Fastify's path: handed to the core with its call (CallInput.logFields) and to connect-node's handlers, read by its `request completed` line. */
export function callLogOf(req: FastifyRequest): AccessFields {
  return (req.callLog ??= {});
}

/**
 * Fastify's access lines as the mode asks, with what the core told of the
 * call (its four-digit code, its span) on the last one, as the fast paths'
 * accessLog writes them. The app decorates its requests with `callLog`.
 */
export class AccessLogController extends LogController {
  private readonly mode: AccessLogMode;

  constructor(options: ConstructorParameters<typeof LogController>[0] & { readonly mode?: AccessLogMode | undefined }) {
    super(options);
    this.mode = options?.mode ?? "both";
  }

  override incomingRequest(request: FastifyRequest, reply: FastifyReply): void {
    if (this.mode === "both") super.incomingRequest(request, reply);
    else if (this.mode !== "off" && !this.isLogDisabled(request)) {
      request.accessRequest = { method: request.method, url: request.url, clientIp: request.clientIp, headers: { traceparent: request.headers.traceparent } };
    }
  }

  override requestCompleted(error: Error | null | undefined, request: FastifyRequest, reply: FastifyReply): void {
    if (this.isLogDisabled(request)) return;
    const call = request.callLog;
    // Without an `incoming request` line, the last one names the request (pino leaves out a field that is undefined).
    const req = this.mode === "both" ? undefined : (request.accessRequest ?? request);
    if (error) {
      // A request's access line: written every time, however often its error repeats.
      reply.log.error(everyLine({ req, res: reply, err: error, responseTime: reply.elapsedTime, ...call }), "request errored");
      return;
    }
    if (this.mode === "off" || (this.mode === "failures" && !failed(reply.statusCode, call))) return;
    reply.log.info({ req, res: reply, responseTime: reply.elapsedTime, errorCode: call?.errorCode, rpcCode: call?.rpcCode, traceId: call?.traceId, spanId: call?.spanId }, "request completed");
  }
}

/** A request's access lines once it has arrived: what the core tells of the call (CallInput.logFields), and the writer of the last line. */
export interface AccessEntry {
  readonly fields: AccessFields;
  completed(statusCode: number): void;
}

/**
 * Starts a request's access lines (writing the first, where the mode has
 * one) and returns its entry, or undefined when no access line is written.
 * `traceparent`: the request's header, whose trace id the line names (logger.ts).
 */
export type AccessLog = (requestId: string, method: string, url: string, clientIp: string, traceparent: string | string[] | undefined) => AccessEntry | undefined;

/** Whether the logger writes info lines (Fastify's no-op logger, with logging off, cannot say, and writes nothing). */
function infoEnabled(log: FastifyBaseLogger): boolean {
  const pinoLike = log as FastifyBaseLogger & { isLevelEnabled?: (level: string) => boolean };
  return typeof pinoLike.isLevelEnabled === "function" && pinoLike.isLevelEnabled("info");
}

/**
 * The access lines Fastify writes for each request (AccessLogController),
 * for the fast paths that answer before Fastify sees the request: the same
 * lines in the same mode, through the app's logger, so its serializers
 * (credentials redacted from the URL) apply.
 */
export function accessLog(log: FastifyBaseLogger, mode: AccessLogMode = "both"): AccessLog {
  if (mode === "off" || !infoEnabled(log)) return () => undefined;
  if (mode === "both") {
    return (requestId, method, url, clientIp, traceparent) => {
      const started = performance.now();
      const child = log.child({ requestId });
      child.info({ req: { method, url, clientIp, headers: { traceparent } } }, "incoming request");
      const fields: AccessFields = {};
      // One shape for every line (pino leaves out a field that is undefined), not a spread of what was set.
      return {
        fields,
        completed: (statusCode) =>
          child.info({ res: { statusCode }, responseTime: performance.now() - started, errorCode: fields.errorCode, rpcCode: fields.rpcCode, traceId: fields.traceId, spanId: fields.spanId }, "request completed"),
      };
    };
  }
  // One line, at the end: no child logger (its one binding is written as the line's first field instead).
  return (requestId, method, url, clientIp, traceparent) => {
    const started = performance.now();
    const fields: AccessFields = {};
    return {
      fields,
      completed: (statusCode) => {
        if (mode === "failures" && !failed(statusCode, fields)) return;
        const req = { method, url, clientIp, headers: { traceparent } };
        log.info({ requestId, req, res: { statusCode }, responseTime: performance.now() - started, errorCode: fields.errorCode, rpcCode: fields.rpcCode, traceId: fields.traceId, spanId: fields.spanId }, "request completed");
      },
    };
  };
}
