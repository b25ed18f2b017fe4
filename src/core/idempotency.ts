import { createHash } from "node:crypto";
import { ErrorCode } from "../gen/gateway/catalogue/v1/status_pb.js";
import { GatewayError } from "./gateway-error.ts";
import type { Args, Operation } from "./operation.ts";

/**
 * Idempotency keys: a caller that may send the same call twice (a retry
 * after its answer was lost, a gRPC hedged call) names it with a key of its
 * own, and is charged for it once.
 *
 * The key comes in the `Idempotency-Key` header (gRPC metadata
 * `idempotency-key`), as the IETF's draft-ietf-httpapi-idempotency-key-header
 * writes it (a structured-field string, `"…"`) or bare, and belongs to the
 * caller's account. The store takes it in one atomic step before the limits
 * (`Meter.claim`):
 *
 * - a key new to the account (or last used more than `keptMs` ago) is taken
 *   for the call, which then runs as any call: admitted or refused by the
 *   limits, charged or not;
 * - a charged call keeps its key for `keptMs`, written in the commit that
 *   writes its ledger row, so a crash after that commit cannot lose it; any
 *   other outcome gives the key back, so a retry of a call that was not
 *   charged (a refusal, a source's failure) runs again for real;
 * - the same key again, while kept, with the same request: the call is
 *   answered again, from the response cache, and not charged or counted
 *   against the day or the balance (its ledger row says `uncharged`, with
 *   the code it was answered), and the answer says so (`Idempotent-Replayed`
 *   and `Original-Request-Id`);
 * - the same key while the call that took it is still in flight: 4008,
 *   retry once it is answered;
 * - the same key with another request (operation, arguments or options):
 *   4003.
 */

/** A key a call took: `Meter.record` keeps it with the call's row where the call is charged, and gives it back otherwise. */
export type TakenKey = Extract<KeyClaim, { readonly kind: "taken" }>;

/** How long a charged call's key is kept: a retry within this is answered again, not charged. */
export const keptMs = 24 * 3_600_000;

/** A caller's key and what it names: the request it was first sent with (`fingerprint`). */
export interface IdempotencyKey {
  readonly key: string;
  /** The operation, its arguments and options, hashed: the same key with another request is refused. */
  readonly fingerprint: string;
}

/**
 * The store's answer to a key (`Meter.claim`): taken for this call (its
 * `token` names this taking, so only the call that took it settles it);
 * kept for a call already charged (`requestId`: that call's); held by a
 * call still in flight; or kept for another request.
 */
export type KeyClaim =
  | { readonly kind: "taken"; readonly key: IdempotencyKey; readonly token: string }
  | { readonly kind: "replay"; readonly requestId: string }
  | { readonly kind: "in_flight" }
  | { readonly kind: "other_request" };

/** The longest key accepted (the draft sets none; Stripe's is 255). */
export const maxKeyLength = 255;

const bare = /^[\x21-\x2b\x2d-\x7e]+$/;
const quoted = /^"((?:[\x20-\x21\x23-\x5b\x5d-\x7e]|\\["\\])*)"$/;

/**
 * The key of a request's `Idempotency-Key` (a repeated header joined with
 * ", ", as Node joins it), undefined where none was sent. A key that cannot
 * be one (empty, too long, not printable ASCII, two keys) is a 4003: a
 * caller that meant to send one must not be charged twice because it was
 * ignored.
 */
export function idempotencyKeyOf(header: string | undefined): string | undefined {
  if (header === undefined) return undefined;
  const value = header.trim();
  const q = quoted.exec(value);
  const key = q !== null ? q[1]!.replace(/\\(["\\])/g, "$1") : bare.test(value) && !value.startsWith('"') ? value : undefined;
  if (key === undefined || key.length === 0 || key.length > maxKeyLength) {
    throw new GatewayError(ErrorCode.PARAM_ERROR, `Idempotency-Key must be one key of 1 to ${maxKeyLength} printable ASCII characters, bare (no comma) or as a quoted string`);
  }
  return key;
}

/** The key with the request it names: the operation, its arguments as checked and the options, in a fixed order. */
export function idempotencyKey(key: string, operation: Operation, args: Args, options: { readonly useCache: boolean; readonly lang: string }): IdempotencyKey {
  const hash = createHash("sha256").update(operation.id);
  for (const arg of operation.args) hash.update(`\u0000${arg.name}=${args[arg.name] ?? ""}`);
  hash.update(`\u0000cache=${options.useCache ? "yes" : "no"}\u0000lang=${options.lang}`);
  return { key, fingerprint: hash.digest("base64url") };
}

/** The refusal of a key a call still in flight holds. */
export function keyInFlight(): GatewayError {
  return new GatewayError(ErrorCode.RATE_LIMIT_EXCEEDED, "a call with this Idempotency-Key is still in flight; retry once it is answered");
}

/** The refusal of a key kept for another request. */
export function keyForOtherRequest(): GatewayError {
  return new GatewayError(ErrorCode.PARAM_ERROR, "this Idempotency-Key was used with another request (operation, arguments or options) in the last 24 hours");
}
