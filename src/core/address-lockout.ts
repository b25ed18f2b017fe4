import { lockedOut } from "./limit-refusals.ts";
import type { MaybeAsync } from "./maybe-async.ts";
import { MapSweep } from "./map-sweep.ts";

export interface AddressLockoutOptions {
  /** Failed authentications from one address before each answer is slowed… */
  readonly slowAfterFailures: number;
  /** …and before the address is refused for `lockSeconds`. */
  readonly lockAfterFailures: number;
  /** Failures count for this long. */
  readonly failureWindowSeconds: number;
  readonly lockSeconds: number;
}

export const defaultAddressLockoutOptions: AddressLockoutOptions = {
  slowAfterFailures: 5,
  lockAfterFailures: 20,
  failureWindowSeconds: 60,
  lockSeconds: 300,
};

interface FailureRecord {
  times: number[];
  lockedUntil: number;
}

/**
 * Failed authentications per client address, whatever was guessed (an
 * account's secret or the admin token): from the `slowAfterFailures`th in a
 * window each answer is held back longer, and from the `lockAfterFailures`th
 * the address is refused outright for a while, before any lookup. Shared by
 * replicas in shared mode, so an address cannot try N times the limit by
 * spreading its guesses.
 */
export interface AddressLockout {
  /** Refuses (4008) an address locked out for failing too often; at once where the failures are in this process (MaybeAsync). */
  check(clientIp: string, now: number): MaybeAsync<void>;
  /** Counts a failure; resolves to how long to hold the answer back, in ms. */
  failed(clientIp: string, now: number): Promise<number>;
}

/** How long to hold back the answer to the `failures`th failure in the window. */
export function holdMs(failures: number, options: Pick<AddressLockoutOptions, "slowAfterFailures">): number {
  const over = failures - options.slowAfterFailures;
  return over >= 0 ? Math.min(2000, 100 * (over + 1)) : 0;
}

/**
 * When a lock known to end at `until` ends, read at `now`: never further off
 * than a whole lock. One further off was set by a clock that read later
 * (this one stepped back since, or another replica's runs ahead), and would
 * otherwise hold the address for the whole difference too.
 */
export function lockEnd(until: number, now: number, options: Pick<AddressLockoutOptions, "lockSeconds">): number {
  return Math.min(until, now + options.lockSeconds * 1000);
}

/** Addresses held past which the sweep forgets any that is not locked, whatever its failures. */
const crowdedAt = 100_000;

/**
 * The lockout of one process. Addresses whose failures have all left the
 * window, and that are not locked, are forgotten by a sweep that looks at a
 * few for each address added (oldest first, about): the work a failure
 * costs stays the same however many addresses fail. Past 100,000 addresses
 * held, the sweep forgets any address it meets that is not locked, failures
 * or not: a caller with that many addresses gains nothing from the count of
 * any one of them, and a lock is never forgotten early.
 *
 * Before, once 100,000 addresses had failed within one window, each new one
 * looked at all of them, to forget none: failures from random loopback
 * addresses went from 6,000 a second to 340, the gateway's one thread busy
 * for every caller; forgetting only what had left the window, the heap held
 * 200-255 MB of addresses at 6,300 a second.
 */
export class MemoryAddressLockout implements AddressLockout {
  private readonly options: AddressLockoutOptions;
  private readonly failures = new Map<string, FailureRecord>();
  private readonly sweep = new MapSweep(this.failures);

  constructor(options: Partial<AddressLockoutOptions> = {}) {
    this.options = { ...defaultAddressLockoutOptions, ...options };
  }

  check(clientIp: string, now: number): void {
    const r = this.failures.get(clientIp);
    if (r !== undefined && r.lockedUntil > now) {
      r.lockedUntil = lockEnd(r.lockedUntil, now, this.options);
      throw lockedOut(r.lockedUntil - now);
    }
  }

  async failed(clientIp: string, now: number): Promise<number> {
    const o = this.options;
    let r = this.failures.get(clientIp);
    if (r === undefined) {
      this.forgetSome(now);
      r = { times: [], lockedUntil: 0 };
      this.failures.set(clientIp, r);
    }
    r.times = r.times.filter((t) => t > now - o.failureWindowSeconds * 1000);
    r.times.push(now);
    if (r.times.length >= o.lockAfterFailures) {
      r.lockedUntil = now + o.lockSeconds * 1000;
      r.times = [];
    }
    return holdMs(r.times.length, o);
  }

  /** Addresses with failures or a lock held: what the sweep has not yet forgotten. */
  get addresses(): number {
    return this.failures.size;
  }

  private forgetSome(now: number): void {
    const since = now - this.options.failureWindowSeconds * 1000;
    const crowded = this.failures.size >= crowdedAt;
    this.sweep.step((r) => r.lockedUntil <= now && (crowded || r.times.every((t) => t <= since)));
  }
}
