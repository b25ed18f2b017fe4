import type { ErrorCode } from "../gen/gateway/catalogue/v1/status_pb.js";

/** A call that ends with a non-success code, with the reason the caller reads. */
export class GatewayError extends Error {
  readonly code: ErrorCode;

  constructor(code: ErrorCode, reason: string) {
    super(reason);
    this.name = "GatewayError";
    this.code = code;
  }
}
