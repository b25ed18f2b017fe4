import type { Account } from "./accounts.ts";
import { rateBounds, rateStanding } from "./call-rate.ts";
import type { LimitRefusal } from "./gateway.ts";
import type { Admission, UsageSummary } from "./meter.ts";

/**
 * Where a call left its account's limits that refill by themselves: the
 * daily maximum and the rate. Transports advertise it to the caller's
 * software (the RateLimit-Policy and RateLimit header fields,
 * src/transports/quota-headers.ts) so a client can pace itself instead of
 * learning its limits from refusals.
 *
 * Each `left` is what the limit itself counted where the call reached it,
 * so it is exact across replicas: the daily maximum's count at admission
 * (charged calls and calls in flight, this one included), given back by
 * one when the call ended uncharged; the rate's place once the call took
 * it. A call that never reached a limit (refused before it) reads the
 * day's count from `api_info`'s figures, and says nothing of the rate.
 */
export interface QuotaStanding {
  readonly daily: {
    readonly max: number;
    /** Calls the daily maximum still admits today; undefined where nothing was counted. */
    readonly left: number | undefined;
    /** Ms until the account's day ends (midnight in its zone), when the count starts again. */
    readonly resetMs: number;
  };
  /** The account's rate, where it has one. */
  readonly rate?: {
    readonly calls: number;
    readonly seconds: number;
    /** Calls the rate would admit at once now; undefined where the call did not reach the rate. */
    readonly left: number | undefined;
    /** Ms until the rate's burst is whole again; undefined with `left`. */
    readonly resetMs: number | undefined;
  };
}

/** What the core knows of a call's passage through the limits, once it is recorded. */
export interface LimitsPassed {
  readonly admission: Admission | undefined;
  readonly refusedBy: LimitRefusal | undefined;
  /** The day's counts as `api_info` shows them, where they could be read. */
  readonly usage: UsageSummary | undefined;
  /** Whether the call was charged (else an admission's place was given back). */
  readonly charged: boolean;
  /** Ms until the account's day ends. */
  readonly dayEndsInMs: number;
}

export function quotaStanding(account: Account, passed: LimitsPassed): QuotaStanding {
  const { admission, refusedBy, usage } = passed;
  let used: number | undefined;
  if (refusedBy?.limit === "daily_max") used = account.dailyMax;
  else if (admission?.dayCount !== undefined) used = passed.charged ? admission.dayCount : admission.dayCount - 1;
  else used = usage?.today;
  const daily = { max: account.dailyMax, left: used === undefined ? undefined : Math.max(0, account.dailyMax - used), resetMs: passed.dayEndsInMs };
  const rate = account.rate;
  if (rate === undefined) return { daily };
  let standing: { left: number; resetMs: number } | undefined;
  if (admission?.rate !== undefined) standing = rateStanding(admission.rate.tat, admission.rate.at, rate);
  // Refused: nothing left until the next place, and the burst whole a tolerance after that.
  else if (refusedBy?.limit === "rate" && refusedBy.retryAfterMs !== undefined) standing = { left: 0, resetMs: refusedBy.retryAfterMs + Number(rateBounds(rate).tolerance) / 1e6 };
  return { daily, rate: { calls: rate.calls, seconds: rate.seconds, left: standing?.left, resetMs: standing?.resetMs } };
}
