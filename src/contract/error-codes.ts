import { Charge, ErrorCode } from "../gen/gateway/catalogue/v1/status_pb.js";

/**
 * How a call with this outcome is billed (spec section 7): `charged` calls
 * count against the daily maximum and the balance; `uncharged` are the
 * gateway's or the source's fault; `ignored` are the caller's own mistakes.
 */
export type ChargeClass = "charged" | "uncharged" | "ignored";

/** Each charge class as the RPC services' `Charge` says it. */
export const chargeOf: Readonly<Record<ChargeClass, Charge>> = { charged: Charge.CHARGED, uncharged: Charge.UNCHARGED, ignored: Charge.IGNORED };

/** The canonical gRPC status names this contract uses (grpc/status codes, as Connect spells them). */
export type RpcStatus =
  | "ok"
  | "not_found"
  | "internal"
  | "unavailable"
  | "invalid_argument"
  | "unauthenticated"
  | "permission_denied"
  | "resource_exhausted"
  | "unimplemented"
  | "deadline_exceeded"
  | "unknown";

export interface ErrorCodeInfo {
  /** Status text of the spec's table, e.g. "Param error". */
  readonly statusText: string;
  /** Short kebab-case label for the status block's `error` field. */
  readonly label: string;
  readonly charge: ChargeClass;
  /** The gRPC status an RPC caller sees, by its canonical name (the transport maps it to its library's code). */
  readonly rpcStatus: RpcStatus;
}

/** The error-code table of the spec, one row per code. */
export const errorCodes: ReadonlyMap<ErrorCode, ErrorCodeInfo> = new Map([
  [ErrorCode.SUCCESS, { statusText: "success", label: "", charge: "charged", rpcStatus: "ok" }],
  [ErrorCode.NO_RESULT, { statusText: "Search success but no result", label: "item-not-found", charge: "charged", rpcStatus: "not_found" }],
  [ErrorCode.SERVER_INTERNAL_ERROR, { statusText: "Server internal error", label: "server-internal-error", charge: "uncharged", rpcStatus: "internal" }],
  [ErrorCode.NETWORK_ERROR, { statusText: "Network error", label: "network-error", charge: "uncharged", rpcStatus: "unavailable" }],
  [ErrorCode.TARGET_SERVER_ERROR, { statusText: "Target server error", label: "target-server-error", charge: "uncharged", rpcStatus: "unavailable" }],
  [ErrorCode.PARAM_ERROR, { statusText: "Param error", label: "param-error", charge: "ignored", rpcStatus: "invalid_argument" }],
  [ErrorCode.ACCOUNT_NOT_FOUND, { statusText: "Account not found", label: "account-not-found", charge: "ignored", rpcStatus: "unauthenticated" }],
  [ErrorCode.INVALID_CREDENTIALS, { statusText: "Invalid authentication credentials", label: "invalid-credentials", charge: "ignored", rpcStatus: "unauthenticated" }],
  [ErrorCode.API_STOPPED, { statusText: "API stopped", label: "api-stopped", charge: "ignored", rpcStatus: "permission_denied" }],
  [ErrorCode.ACCOUNT_STOPPED, { statusText: "Account stopped", label: "account-stopped", charge: "ignored", rpcStatus: "permission_denied" }],
  [ErrorCode.RATE_LIMIT_EXCEEDED, { statusText: "API rate limit exceeded", label: "rate-limit-exceeded", charge: "ignored", rpcStatus: "resource_exhausted" }],
  [ErrorCode.API_MAINTENANCE, { statusText: "API maintenance", label: "api-maintenance", charge: "ignored", rpcStatus: "unavailable" }],
  [ErrorCode.API_NOT_FOUND, { statusText: "API not found with these values", label: "api-not-found", charge: "ignored", rpcStatus: "unimplemented" }],
  [ErrorCode.API_NOT_ADDED, { statusText: "Please add api first", label: "api-not-added", charge: "ignored", rpcStatus: "permission_denied" }],
  [ErrorCode.CALLS_EXCEEDED, { statusText: "Number of calls exceeded", label: "calls-exceeded", charge: "ignored", rpcStatus: "resource_exhausted" }],
  [ErrorCode.MISSING_URL_PARAM, { statusText: "Missing url param", label: "missing-url-param", charge: "ignored", rpcStatus: "invalid_argument" }],
  [ErrorCode.WRONG_PAGE_TOKEN, { statusText: "Wrong pageToken", label: "wrong-page-token", charge: "ignored", rpcStatus: "invalid_argument" }],
  [ErrorCode.INSUFFICIENT_BALANCE, { statusText: "Insufficient balance", label: "insufficient-balance", charge: "ignored", rpcStatus: "resource_exhausted" }],
  [ErrorCode.TIMEOUT, { statusText: "timeout error", label: "timeout-error", charge: "uncharged", rpcStatus: "deadline_exceeded" }],
  [ErrorCode.UNKNOWN_ERROR, { statusText: "unknown error", label: "unknown-error", charge: "uncharged", rpcStatus: "unknown" }],
]);

export function errorCodeInfo(code: ErrorCode): ErrorCodeInfo {
  const info = errorCodes.get(code);
  if (info === undefined) throw new Error(`no row for error code ${code}`);
  return info;
}

/** The four-digit legacy text of a code: the enum number padded with zeros. */
export function fourDigits(code: ErrorCode): string {
  return String(code).padStart(4, "0");
}
