import type { ErrorCode } from "../gen/gateway/catalogue/v1/status_pb.js";

/** A call that ends with a non-success code, with the reason the caller reads. */
export class GatewayError extends Error {
  readonly code: ErrorCode;

  /** `cause` is for the log, never for the caller. */
  constructor(code: ErrorCode, reason: string, options?: { cause?: unknown }) {
    super(reason, options);
    this.name = "GatewayError";
    this.code = code;
  }
}
