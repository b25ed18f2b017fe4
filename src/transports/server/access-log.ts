import { LogController, type FastifyBaseLogger, type FastifyReply, type FastifyRequest } from "fastify";
import type { CallLogFields } from "../../core/gateway.ts";
import { everyLine } from "./repeated-lines.ts";
import { Http2ServerResponse } from "node:http2";

declare module "fastify" {
  interface FastifyRequest {
    /** What the core and the RPC layer tell the access line of the request's call, once a route hands it on (callLogOf); null before. */
    callLog: AccessFields | null;
    /** The request as its one access line names it, taken as it arrives (its address may be gone by its end); null in `both` mode. */
    accessRequest: RequestFields | null;
    /** Whether its caller went before its answer was sent whole, and its last line was written for that (completeOnClose). */
    accessGone: boolean;
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
 *   ended in an error (AccessFields.rpcCode), any other request answered
 *   with an HTTP status of 400 or more, or a request whose caller went
 *   before its answer was sent whole (`callerGone`);
 * - `off`: none.
 * Lines of errors are written whatever the mode, and every access line is
 * at `info`, under GATEWAY_LOG_LEVEL.
 */
export type AccessLogMode = "both" | "completed" | "failures" | "off";

export const accessLogModes: readonly AccessLogMode[] = ["both", "completed", "failures", "off"];

/** Whether a request's last line is written under `failures`: a call that was not served, an RPC that ended in an error, another request refused, or a caller gone. */
function failed(statusCode: number, call: AccessFields | null | undefined, callerGone = false): boolean {
  // A caller that went before its answer was sent whole did not get what its code says.
  if (callerGone) return true;
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
    // Fastify writes the last line as the answer finishes, which an answer whose caller has gone never does.
    if (this.mode !== "off" && !this.isLogDisabled(request)) {
      // Over HTTP/2, the stream: a reset leaves Node's compatibility response finished, as if answered whole.
      completeOnClose(reply.raw instanceof Http2ServerResponse ? reply.raw.stream : reply.raw, () => request.callLog ?? undefined, (sent) => {
        if (sent === "whole") return; // Fastify's own line (requestCompleted)
        request.accessGone = true;
        const call = request.callLog;
        if (this.mode === "failures" && !failed(0, call ?? undefined, true)) return;
        const req = this.mode === "both" ? undefined : (request.accessRequest ?? request);
        const res = { statusCode: sentStatus(reply.raw.statusCode, sent) };
        reply.log.info({ req, res, responseTime: reply.elapsedTime, errorCode: call?.errorCode, rpcCode: call?.rpcCode, traceId: call?.traceId, spanId: call?.spanId, callerGone: true }, "request completed");
      });
    }
  }

  override requestCompleted(error: Error | null | undefined, request: FastifyRequest, reply: FastifyReply): void {
    // An HTTP/2 stream its caller reset: its last line is written as it closes (incomingRequest's completeOnClose).
    if (this.isLogDisabled(request) || request.accessGone || (reply.raw instanceof Http2ServerResponse && reply.raw.stream.aborted)) return;
    const call = request.callLog;
    // Without an `incoming request` line, the last one names the request (pino leaves out a field that is undefined).
    const req = this.mode === "both" ? undefined : (request.accessRequest ?? request);
    if (error) {
      // A request's access line: written every time, however often its error repeats.
      reply.log.error(everyLine({ req, res: reply, err: error, responseTime: reply.elapsedTime, ...call }), "request errored");
      return;
    }
    if (this.mode === "off" || (this.mode === "failures" && !failed(reply.statusCode, call))) return;
    reply.log.info({ req, res: reply, responseTime: reply.elapsedTime, errorCode: call?.errorCode, rpcCode: call?.rpcCode, traceId: call?.traceId, spanId: call?.spanId, callerGone: undefined }, "request completed");
  }
}

/** What a caller got of its answer before the answer's stream closed (completeOnClose). */
export type Sent = "whole" | "head" | "nothing";

/**
 * The HTTP status a last line names: the one sent, or, for a caller that
 * went before any was (`sent`: completeOnClose's), nginx's 499 ("client
 * closed request"), which log tools know; the call's own code (4017 for a
 * hang-up) is beside it.
 */
function sentStatus(statusCode: number, sent: Sent): number {
  return sent === "nothing" ? 499 : statusCode;
}

/**
 * Calls `completed` once the answer's stream has closed, with what its
 * caller got: the answer `whole`, or, gone first, its `head` or `nothing`
 * (as it stood at the close: an answer made after it is written nowhere,
 * though Node's response takes it as sent). While the core still runs the
 * request's call (`fields()`, CallLogFields.running), only once the call
 * ends (and the transport has made its answer), so that the line names the
 * code the call was recorded with: a caller that hung up during a purchase
 * is a 4017 in the ledger, and now in the log too (`callerGone`), where
 * before it had no last line at all.
 */
export function completeOnClose(
  stream: { once(event: "close", listener: () => void): unknown; readonly writableFinished: boolean; readonly headersSent: boolean; readonly aborted?: boolean },
  fields: () => AccessFields | undefined,
  completed: (sent: Sent) => void,
): void {
  stream.once("close", () => {
    const call = fields();
    // An HTTP/2 stream its caller reset is `aborted` (its writable side then counts as finished).
    const whole = stream.writableFinished && stream.aborted !== true && call?.running !== true;
    const sent = whole ? "whole" : stream.headersSent ? "head" : "nothing";
    // A turn later: the transport has made its answer by then (its RPC code), though none goes out.
    if (call?.running === true) call.onEnd = () => setImmediate(completed, sent);
    else completed(sent);
  });
}

/** A request's access lines once it has arrived: what the core tells of the call (CallInput.logFields), and the writer of the last line. */
export interface AccessEntry {
  readonly fields: AccessFields;
  /**
   * Writes the last line with the answer's HTTP status, given what its
   * caller got of it (`sent`, from completeOnClose; whole by default): short
   * of whole, the line says `callerGone`, and 499 if nothing was sent.
   */
  completed(statusCode: number, sent?: Sent): void;
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
        completed: (statusCode, sent = "whole") =>
          child.info(
            { res: { statusCode: sentStatus(statusCode, sent) }, responseTime: performance.now() - started, errorCode: fields.errorCode, rpcCode: fields.rpcCode, traceId: fields.traceId, spanId: fields.spanId, callerGone: sent === "whole" ? undefined : true },
            "request completed",
          ),
      };
    };
  }
  // One line, at the end: no child logger (its one binding is written as the line's first field instead).
  return (requestId, method, url, clientIp, traceparent) => {
    const started = performance.now();
    const fields: AccessFields = {};
    return {
      fields,
      completed: (statusCode, sent = "whole") => {
        const callerGone = sent !== "whole";
        if (mode === "failures" && !failed(statusCode, fields, callerGone)) return;
        const req = { method, url, clientIp, headers: { traceparent } };
        log.info({ requestId, req, res: { statusCode: sentStatus(statusCode, sent) }, responseTime: performance.now() - started, errorCode: fields.errorCode, rpcCode: fields.rpcCode, traceId: fields.traceId, spanId: fields.spanId, callerGone: callerGone || undefined }, "request completed");
      },
    };
  };
}
