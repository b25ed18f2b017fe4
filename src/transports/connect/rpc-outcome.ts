import { ConnectError, type Interceptor } from "@connectrpc/connect";
import { codeToString } from "@connectrpc/connect/protocol-connect";
import { callLogKey } from "./context.ts";

/**
 * Tells a call's access line the Connect/gRPC code it ended with, when it
 * ended in an error (AccessFields.rpcCode): the error a handler or another
 * interceptor threw, or, for a server stream, the error its messages ended
 * with. The outermost interceptor, so it sees the code the caller gets.
 */
export const recordRpcCode: Interceptor = (next) => async (req) => {
  const fields = req.contextValues.get(callLogKey);
  if (fields === undefined) return next(req);
  const record = (e: unknown): never => {
    fields.rpcCode = codeToString(ConnectError.from(e).code);
    throw e;
  };
  const res = await next(req).catch(record);
  if (!res.stream) return res;
  const messages = res.message;
  async function* watched() {
    try {
      yield* messages;
    } catch (e) {
      record(e);
    }
  }
  return { ...res, message: watched() };
};
