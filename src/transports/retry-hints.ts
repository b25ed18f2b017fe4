import type { LimitRefusal } from "../core/gateway.ts";

/**
 * When a caller a limit refused may come back, as each kind of caller reads
 * it. The status block's reason says it in words; these say it to the
 * caller's software:
 * - `Retry-After` (RFC 9110), whole seconds rounded up, so waiting that long
 *   is enough: on every legacy answer and every Connect unary answer (HTTP
 *   429 there) a limit refused with a known wait;
 * - `grpc-retry-pushback-ms` (gRFC A6), the trailer a gRPC client with a
 *   retry policy obeys: the wait in ms; `-1`, "do not retry", for a balance
 *   that does not cover the price (a retry cannot pass until someone tops
 *   it up); none for a full concurrency (a place frees when any call in
 *   flight ends, so the client's own backoff fits);
 * - the `google.rpc.RetryInfo` error detail, beside the status block, on
 *   every RPC protocol: the wait to the millisecond.
 * Nothing is said where the wait is not known.
 */
export function retryAfterSeconds(refusal: LimitRefusal | undefined): string | undefined {
  const ms = refusal?.retryAfterMs;
  return ms === undefined ? undefined : String(Math.ceil(ms / 1000));
}

/** `grpc-retry-pushback-ms` for a refusal (retryAfterSeconds above says when). */
export function grpcPushbackMs(refusal: LimitRefusal | undefined): string | undefined {
  if (refusal === undefined) return undefined;
  if (refusal.limit === "balance") return "-1";
  return refusal.retryAfterMs === undefined ? undefined : String(refusal.retryAfterMs);
}
