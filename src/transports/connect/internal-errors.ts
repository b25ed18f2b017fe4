import { Code, ConnectError, type Interceptor } from "@connectrpc/connect";
import { StatusBlockSchema } from "../../gen/gateway/catalogue/v1/status_pb.js";
import { requestIdKey } from "./context.ts";

/**
 * Every `internal` answer leaves one error line with the request id and the
 * cause, and the caller gets the id to quote instead of the cause. Catalogue
 * refusals (they carry a status block) were logged by the core already.
 */
export function logInternalErrors(log: { error(obj: unknown, msg: string): void } | undefined): Interceptor {
  return (next) => async (req) => {
    try {
      return await next(req);
    } catch (e) {
      if (e instanceof ConnectError && (e.code !== Code.Internal || e.findDetails(StatusBlockSchema).length > 0)) throw e;
      const requestId = req.contextValues.get(requestIdKey);
      log?.error({ err: e, requestId, procedure: req.url }, "an RPC failed inside the gateway");
      throw new ConnectError(`internal error; quote request id ${requestId}`, Code.Internal);
    }
  };
}
