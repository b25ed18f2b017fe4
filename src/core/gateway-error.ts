import type { ErrorCode } from "../gen/gateway/catalogue/v1/status_pb.js";

/**
 * Which limit refused a call: the account's calls in flight, its rate, its
 * daily maximum or its balance, or the caller's address, locked out for
 * failed authentications (src/core/limit-refusals.ts makes each refusal);
 * or the upstream provider, which asked the gateway to wait (its
 * Retry-After, sources/upstream/upstream-source.ts).
 */
export type Limit = "concurrency" | "rate" | "daily_max" | "balance" | "address_locked" | "upstream";

export interface GatewayErrorOptions {
  /** For the log, never for the caller. */
  readonly cause?: unknown;
  /** The limit that refused the call, if one did. */
  readonly limit?: Limit | undefined;
  /** How long until that limit admits a call again, in ms, where that is known. */
  readonly retryAfterMs?: number | undefined;
}

/** A call that ends with a non-success code, with the reason the caller reads. */
export class GatewayError extends Error {
  readonly code: ErrorCode;
  readonly limit: Limit | undefined;
  readonly retryAfterMs: number | undefined;

  constructor(code: ErrorCode, reason: string, options?: GatewayErrorOptions) {
    super(reason, options?.cause === undefined ? undefined : { cause: options.cause });
    this.name = "GatewayError";
    this.code = code;
    this.limit = options?.limit;
    this.retryAfterMs = options?.retryAfterMs;
  }
}
