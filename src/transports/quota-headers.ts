import type { QuotaStanding } from "../core/gateway.ts";

/**
 * Where a call left its account's limits, as the caller's software reads
 * it: the `RateLimit-Policy` and `RateLimit` header fields of the IETF's
 * draft-ietf-httpapi-ratelimit-headers-10 (HTTP structured-field lists, one
 * member per limit, named by a quoted policy id):
 *
 *     RateLimit-Policy: "daily";q=10000;w=86400, "rate";q=10;w=1
 *     RateLimit: "daily";r=9998;t=30137, "rate";r=9;t=1
 *
 * - `"daily"`, the daily maximum: `q` calls a day (`w`), `r` still admitted
 *   today, `t` seconds until the account's day ends and the count starts
 *   again;
 * - `"rate"`, the rate (where the plan has one): `q` calls every `w`
 *   seconds on average, `r` admitted at once now (its burst, less what
 *   recent calls took), `t` seconds until the burst is whole again.
 *
 * Seconds are whole, rounded up (as `Retry-After`), so waiting `t` is
 * enough. A member whose limit the call did not reach is in the policy but
 * not in `RateLimit`. Sent on every answer to a call whose account was
 * identified, success or refusal, on every transport: as HTTP headers
 * (legacy, Connect), gRPC response metadata (headers, or with the trailers
 * of an error), and gRPC-Web's. Calls with no account carry neither.
 */
export interface QuotaHeaders {
  /** `RateLimit-Policy`. */
  readonly policy: string;
  /** `RateLimit`; undefined where no limit was reached. */
  readonly current: string | undefined;
}

/** The fields' names as they are written (lowercase, as HTTP/2 and gRPC metadata require). */
export const quotaHeaderNames = { policy: "ratelimit-policy", current: "ratelimit" } as const;

const seconds = (ms: number): number => Math.max(0, Math.ceil(ms / 1000));

export function quotaHeaders(quota: QuotaStanding | undefined): QuotaHeaders | undefined {
  if (quota === undefined) return undefined;
  const { daily, rate } = quota;
  let policy = `"daily";q=${daily.max};w=86400`;
  let current = daily.left === undefined ? "" : `"daily";r=${daily.left};t=${seconds(daily.resetMs)}`;
  if (rate !== undefined) {
    policy += `, "rate";q=${rate.calls};w=${rate.seconds}`;
    if (rate.left !== undefined) current += `${current === "" ? "" : ", "}"rate";r=${rate.left};t=${seconds(rate.resetMs ?? 0)}`;
  }
  return { policy, current: current === "" ? undefined : current };
}

/** The fields as name and value pairs, in their names' order (as a fetch `Headers` iterates them). */
export function quotaHeaderPairs(quota: QuotaStanding | undefined): (readonly [string, string])[] {
  const h = quotaHeaders(quota);
  if (h === undefined) return [];
  return h.current === undefined ? [[quotaHeaderNames.policy, h.policy]] : [[quotaHeaderNames.current, h.current], [quotaHeaderNames.policy, h.policy]];
}
