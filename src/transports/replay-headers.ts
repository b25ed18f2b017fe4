import type { Outcome } from "../core/gateway.ts";
import { quotaHeaderPairs } from "./quota-headers.ts";

/**
 * A call answered again for its idempotency key (src/core/idempotency.ts),
 * and not charged, says so: `Idempotent-Replayed: true` (the field Stripe's
 * clients read) and `Original-Request-Id`, the request id of the charged
 * call it repeats (the one its ledger row and any support request name).
 * As the `RateLimit` fields: HTTP headers (legacy, Connect), gRPC response
 * metadata (headers, or an error's trailers), gRPC-Web's trailers.
 */
export const replayHeaderNames = { replayed: "idempotent-replayed", original: "original-request-id" } as const;

/** The header fields of a call's answer besides its protocol's own: the RateLimit fields (quota-headers.ts) and, on a replay, the two above. */
export function callHeaderPairs(outcome: Pick<Outcome, "quota" | "replayOf">): (readonly [string, string])[] {
  const pairs = quotaHeaderPairs(outcome.quota);
  if (outcome.replayOf !== undefined) pairs.push([replayHeaderNames.replayed, "true"], [replayHeaderNames.original, outcome.replayOf]);
  return pairs;
}
