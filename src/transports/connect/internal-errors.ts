import { Code, ConnectError, type Interceptor } from "@connectrpc/connect";
import { StatusBlockSchema } from "../../gen/gateway/catalogue/v1/status_pb.js";
import { requestIdKey } from "./context.ts";
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
      throw callerError(e, req.contextValues.get(requestIdKey), req.url, log);
    }
  };
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
 */
export function callerError(e: unknown, requestId: string | undefined, procedure: string, log: InternalErrorLog | undefined): ConnectError {
  if (e instanceof ConnectError) e = undecodableFixed(e);
  if (e instanceof ConnectError && (e.code !== Code.Internal || e.findDetails(StatusBlockSchema).length > 0 || unreadableRequest(e))) return e;
  log?.error({ err: e, requestId, procedure }, "an RPC failed inside the gateway");
  return new ConnectError(`internal error; quote request id ${requestId}`, Code.Internal);
}
