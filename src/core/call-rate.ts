/**
 * An account's rate limit: on average at most `calls` calls every `seconds`,
 * and at most `burst` at once after a quiet spell. A call past it answers
 * 4008 ("API rate limit exceeded"), as one past the concurrency limit does.
 *
 * Enforced as GCRA (the generic cell rate algorithm: a token bucket kept as
 * one time per account). Each admitted call moves the account's theoretical
 * arrival time (`tat`) on by one interval (`seconds / calls`); a call is
 * admitted while that time is at most `burst − 1` intervals ahead of now.
 * Only an admitted call moves it: a call refused for the rate, or for any
 * other limit, costs nothing, so a caller over its rate is let through
 * again as soon as the rate allows, however hard it keeps asking. Both
 * meters decide it in the step that decides the other limits (the embedded
 * one in this process, the shared one in its PostgreSQL statement, with the
 * same arithmetic).
 */
export interface CallRate {
  /** Calls allowed every `seconds`, on average: a whole number, 1 or more. */
  readonly calls: number;
  /** The period: 1 (a second), 60 (a minute) or 3600 (an hour). */
  readonly seconds: number;
  /** Calls allowed at once after a quiet spell: a whole number, 1 or more (by default `calls`). */
  readonly burst: number;
}

const units: Record<string, number> = { s: 1, min: 60, h: 3600 };
const unitOf = new Map(Object.entries(units).map(([unit, seconds]) => [seconds, unit]));

/** The most calls a rate may name, or burst: far past what one account can send. */
const maxCalls = 1_000_000_000;

/**
 * Times are whole nanoseconds (a millisecond clock times 10^6), as bigint
 * here and in PostgreSQL: floating-point milliseconds near 1.8 × 10^12 are
 * spaced 0.24 µs apart, and an interval summed over a long burst drifted by
 * a call. The only rounding is the interval's, to the nanosecond.
 */
const nsPerMs = 1_000_000n;

/**
 * The rate in nanoseconds: between two calls (`interval`), and how far
 * ahead of now the theoretical arrival time may be for a call to be
 * admitted (`tolerance`, `burst − 1` intervals). What the shared meter's
 * statement is given.
 */
export function rateBounds(rate: CallRate): { readonly interval: bigint; readonly tolerance: bigint } {
  const interval = (BigInt(rate.seconds) * 1_000_000_000n + BigInt(rate.calls) / 2n) / BigInt(rate.calls);
  return { interval, tolerance: interval * BigInt(rate.burst - 1) };
}

/**
 * A call arriving at `nowMs` (a millisecond clock), given the account's
 * theoretical arrival time (ns; undefined: no call yet): admitted, with the
 * time to keep from then on (`next`), or refused, with how many ms until a
 * call would fit (`waitMs`).
 *
 * The time kept is never more than `tolerance + interval` ahead of the
 * clock that admitted its call (an admitted call starts at most `tolerance`
 * ahead). One further ahead was left by a clock that read later than this
 * one. A little later is the ordinary case: a call reads its clock before
 * it is admitted, and calls are admitted in the order they reach the store,
 * not the order they read their clocks (in shared mode a replica's
 * statement waits its turn behind the account's lock, up to 5 s); so up to
 * `rateSkewNs` further is taken as it is. Much further, this clock stepped
 * back (an NTP correction, a VM resumed from a snapshot), or another
 * replica's runs ahead. Taken as it is, that would refuse the account for
 * the whole step, an hour for an hour, though it made no call. It is read
 * instead as the burst spent up to now: this call is admitted, and the next
 * waits an interval. So a step back lets at most one call more through than
 * the rate; refusing until the step has passed would hold every rated
 * account for its length.
 */
/**
 * How much further ahead than a clock could have left it an arrival time
 * is still taken as it is (rateTake): calls admitted in another order than
 * they read their clocks. Before, any time further ahead was read as a step
 * back, and such a call let one call more through than the burst each time:
 * three replicas saw 26 calls admitted for a burst of 25.
 */
export const rateSkewNs = 5_000_000_000n;

export function rateTake(tat: bigint | undefined, nowMs: number, rate: CallRate): { readonly next: bigint } | { readonly waitMs: number } {
  const now = BigInt(nowMs) * nsPerMs;
  const { interval, tolerance } = rateBounds(rate);
  const from = tat === undefined || tat <= now ? now : tat - now > tolerance + interval + rateSkewNs ? now + tolerance : tat;
  const over = from - now - tolerance;
  return over > 0n ? { waitMs: Number(over) / 1e6 } : { next: from + interval };
}

/** A rate as text: `10/s`, `600/min, burst 50`; `none` for no limit. The burst is shown where it is not `calls`. */
export function formatRate(rate: CallRate | undefined): string {
  if (rate === undefined) return "none";
  const text = `${rate.calls}/${unitOf.get(rate.seconds) ?? `${rate.seconds}s`}`;
  return rate.burst === rate.calls ? text : `${text}, burst ${rate.burst}`;
}

/** Thrown for a rate or burst that cannot be used. */
export class CallRateError extends Error {}

/**
 * A rate from its text (`10/s`, `600/min`, `5000/h`; `none` for no limit)
 * and a burst (undefined: as many as `calls`). Throws CallRateError saying
 * what is wrong.
 */
export function parseRate(text: string, burst?: number): CallRate | undefined {
  if (text === "none") {
    if (burst !== undefined) throw new CallRateError("a burst needs a rate");
    return undefined;
  }
  const m = /^([0-9]+)\/(s|min|h)$/.exec(text);
  if (m === null) throw new CallRateError(`a rate is calls per s, min or h, as 10/s or 600/min (or none), not ${text}`);
  return checkRate({ calls: Number(m[1]), seconds: units[m[2]!]!, burst: burst ?? Number(m[1]) });
}

/** The rate if it can be used, else a CallRateError saying why. */
export function checkRate(rate: CallRate): CallRate {
  const whole = (n: number) => Number.isSafeInteger(n) && n >= 1 && n <= maxCalls;
  if (!whole(rate.calls)) throw new CallRateError(`a rate's calls must be a whole number from 1 to ${maxCalls}`);
  if (!unitOf.has(rate.seconds)) throw new CallRateError("a rate's period must be a second, a minute or an hour (1, 60 or 3600 s)");
  if (!whole(rate.burst)) throw new CallRateError(`a burst must be a whole number from 1 to ${maxCalls}`);
  return rate;
}

/**
 * Where the rate leaves an account once a call was admitted, given the
 * theoretical arrival time that call left (ns) and the clock it was decided
 * at (ms): how many more calls it would admit at once (`left`, at most
 * `burst − 1` right after a quiet spell), and in how many ms the burst is
 * whole again (`resetMs`).
 */
export function rateStanding(tat: bigint, atMs: number, rate: CallRate): { readonly left: number; readonly resetMs: number } {
  const ahead = tat - BigInt(atMs) * nsPerMs;
  if (ahead <= 0n) return { left: rate.burst, resetMs: 0 };
  const { interval, tolerance } = rateBounds(rate);
  const left = ahead > tolerance ? 0 : Number((tolerance - ahead) / interval) + 1;
  return { left: Math.min(left, rate.burst), resetMs: Number(ahead) / 1e6 };
}
