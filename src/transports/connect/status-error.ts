import { create } from "@bufbuild/protobuf";
import { DurationSchema } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError } from "@connectrpc/connect";
import { errorCodeInfo, fourDigits, type RpcStatus } from "../../contract/error-codes.ts";
import type { LimitRefusal, QuotaStanding, Transport } from "../../core/gateway.ts";
import { RetryInfoSchema } from "../../gen/google/rpc/error_details_pb.js";
import { StatusBlockSchema, type StatusBlock } from "../../gen/gateway/catalogue/v1/status_pb.js";
import { grpcPushbackMs, retryAfterSeconds } from "../retry-hints.ts";
import { callHeaderPairs } from "../replay-headers.ts";

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

/** What else an RPC error may say besides its status block. */
export interface StatusErrorOptions {
  /** The call said nothing of who the caller is (no key). */
  readonly unauthenticated?: boolean | undefined;
  /** The limit that refused the call: when to come back, as the call's protocol says it (src/transports/retry-hints.ts). */
  readonly refusedBy?: LimitRefusal | undefined;
  /** The call's protocol: a Connect error's metadata travels as HTTP headers, a gRPC or gRPC-Web one's as trailers. */
  readonly transport?: Transport | undefined;
  /** Where the call left its account's limits: `RateLimit` and `RateLimit-Policy` as metadata (src/transports/quota-headers.ts). */
  readonly quota?: QuotaStanding | undefined;
  /** A replay's original request id: `Idempotent-Replayed` and `Original-Request-Id` as metadata (src/transports/replay-headers.ts). */
  readonly replayOf?: string | undefined;
}

/**
 * A non-success outcome as an RPC error: the matching Code, and the status
 * block as detail. A call that says nothing of who the caller is is
 * `unauthenticated` whatever its four digits (4014 for a missing key). A
 * call a limit refused with a known wait also carries a
 * `google.rpc.RetryInfo` detail, and `Retry-After` (Connect) or
 * `grpc-retry-pushback-ms` (gRPC, gRPC-Web) as metadata. A call whose
 * account was identified carries `RateLimit` and `RateLimit-Policy` as
 * metadata too.
 */
export function statusError(status: StatusBlock, options: StatusErrorOptions = {}): ConnectError {
  const rpcStatus = errorCodeInfo(status.errorCode).rpcStatus;
  const code = options.unauthenticated === true ? Code.Unauthenticated : rpcStatus === "ok" ? Code.Internal : connectCodes[rpcStatus];
  const message = `${fourDigits(status.errorCode)} ${status.reason}`;
  return refusalError(message, code, options.refusedBy, options.transport, [{ desc: StatusBlockSchema, value: status }], callHeaderPairs(options));
}

type ErrorDetails = NonNullable<ConstructorParameters<typeof ConnectError>[3]>;

/**
 * An RPC error with `details`, and for a call a limit refused, when it may
 * come back: a `google.rpc.RetryInfo` detail where the wait is known, and
 * `Retry-After` (Connect: HTTP headers) or `grpc-retry-pushback-ms` (gRPC,
 * gRPC-Web: trailers) as metadata (src/transports/retry-hints.ts). `extra`:
 * more metadata the error carries whatever refused it (RateLimit).
 */
export function refusalError(
  message: string,
  code: Code,
  refusal: LimitRefusal | undefined,
  transport: Transport | undefined,
  details: ErrorDetails = [],
  extra: readonly (readonly [string, string])[] = [],
): ConnectError {
  if (refusal === undefined && extra.length === 0) return new ConnectError(message, code, undefined, details);
  const metadata = new Headers(extra as [string, string][]);
  if (refusal === undefined) return new ConnectError(message, code, metadata, details);
  const hint = transport === "connect" ? retryAfterSeconds(refusal) : grpcPushbackMs(refusal);
  if (hint !== undefined) metadata.set(transport === "connect" ? "retry-after" : "grpc-retry-pushback-ms", hint);
  const ms = refusal.retryAfterMs;
  if (ms === undefined) return new ConnectError(message, code, metadata, details);
  const retryDelay = create(DurationSchema, { seconds: BigInt(Math.floor(ms / 1000)), nanos: (ms % 1000) * 1_000_000 });
  return new ConnectError(message, code, metadata, [...details, { desc: RetryInfoSchema, value: { retryDelay } }]);
}

/** The RPC protocol of a call, from its content type, as the ledger names it. */
export function rpcTransportOf(contentType: string | null | undefined): Transport {
  const type = contentType ?? "";
  return type.startsWith("application/grpc-web") ? "grpc-web" : type.startsWith("application/grpc") ? "grpc" : "connect";
}
