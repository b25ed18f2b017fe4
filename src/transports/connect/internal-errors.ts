import { Code, ConnectError, type Interceptor } from "@connectrpc/connect";
import { StatusBlockSchema } from "../../gen/gateway/catalogue/v1/status_pb.js";
import { callerGoneKey, requestIdKey } from "./context.ts";
import { undecodableFixed, unreadableRequest } from "./refused-requests.ts";

/**
 * Every `internal` answer leaves one error line with the request id and the
 * cause, and the caller gets the id to quote instead of the cause. Catalogue
 * refusals (they carry a status block) were logged by the core already.
 */
export function logInternalErrors(log: InternalErrorLog | undefined): Interceptor {
  return (next) => async (req) => {
    try {
      return await next(req);
    } catch (e) {
      throw callerError(e, req.contextValues.get(requestIdKey), req.url, log, callerLeft(req.signal, req.contextValues.get(callerGoneKey)));
    }
  };
}

/** Whether a call's caller has gone: connect-node's signal aborted other than by the deadline, or the request says so itself (callerGoneKey). */
function callerLeft(signal: AbortSignal, gone: () => boolean): boolean {
  return (signal.aborted && ConnectError.from(signal.reason).code !== Code.DeadlineExceeded) || gone();
}

export type InternalErrorLog = { error(obj: unknown, msg: string): void };

/**
 * What the caller gets for an error a call ended with: a ConnectError that is
 * not `internal`, or carries a status block, as it is; anything else logged
 * once with the request id and the procedure, and answered as `internal`
 * with the id to quote. The interceptor and the RPC fast paths both use it.
 *
 * A streaming method's request is decoded as the implementation reads it,
 * inside the interceptor, so bytes that do not decode arrive here as
 * connect-es's `internal`: they are the caller's fault, `invalid_argument`
 * with the decoder's words, as a unary request's are (refusedRequests), and
 * not an error line a caller could fill the log with. A message flagged
 * compressed with no encoding keeps gRPC's `internal`, in connect-es's words.
 *
 * A call whose caller went away (`left`: it reset its stream, or closed its
 * connection) ends `canceled`, with no error line, whatever reading the rest
 * of its request threw: Node's "aborted" or "Premature close", or the
 * decoder's premature end of a message cut short. Before, a caller of a
 * method connect-node serves that left while its request was still arriving
 * left an error line that blamed the gateway ("Premature close" over
 * HTTP/2, "aborted" over HTTP/1.1). A refusal with a status block keeps its
 * code: the ledger has it.
 */
export function callerError(e: unknown, requestId: string | undefined, procedure: string, log: InternalErrorLog | undefined, left = false): ConnectError {
  if (e instanceof ConnectError && e.findDetails(StatusBlockSchema).length > 0) return e;
  if (left) return e instanceof ConnectError && e.code === Code.Canceled ? e : new ConnectError("the caller went away", Code.Canceled);
  if (e instanceof ConnectError) e = undecodableFixed(e);
  if (e instanceof ConnectError && (e.code !== Code.Internal || unreadableRequest(e))) return e;
  log?.error({ err: e, requestId, procedure }, "an RPC failed inside the gateway");
  return new ConnectError(`internal error; quote request id ${requestId}`, Code.Internal);
}
