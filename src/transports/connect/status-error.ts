import { Code, ConnectError } from "@connectrpc/connect";
import { errorCodeInfo, fourDigits, type RpcStatus } from "../../contract/error-codes.ts";
import { StatusBlockSchema, type StatusBlock } from "../../gen/gateway/catalogue/v1/status_pb.js";

/** The contract's gRPC status names as connect-es codes: the one place the contract meets the library. */
const connectCodes: Readonly<Record<Exclude<RpcStatus, "ok">, Code>> = {
  not_found: Code.NotFound,
  internal: Code.Internal,
  unavailable: Code.Unavailable,
  invalid_argument: Code.InvalidArgument,
  unauthenticated: Code.Unauthenticated,
  permission_denied: Code.PermissionDenied,
  resource_exhausted: Code.ResourceExhausted,
  unimplemented: Code.Unimplemented,
  deadline_exceeded: Code.DeadlineExceeded,
  unknown: Code.Unknown,
};

/**
 * A non-success outcome as an RPC error: the matching Code, and the status
 * block as detail. A call that says nothing of who the caller is is
 * `unauthenticated` whatever its four digits (4014 for a missing key).
 */
export function statusError(status: StatusBlock, unauthenticated = false): ConnectError {
  const rpcStatus = errorCodeInfo(status.errorCode).rpcStatus;
  const code = unauthenticated ? Code.Unauthenticated : rpcStatus === "ok" ? Code.Internal : connectCodes[rpcStatus];
  return new ConnectError(`${fourDigits(status.errorCode)} ${status.reason}`, code, undefined, [{ desc: StatusBlockSchema, value: status }]);
}
