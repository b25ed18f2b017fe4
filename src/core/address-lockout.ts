import { ErrorCode } from "../gen/gateway/catalogue/v1/status_pb.js";
import { GatewayError } from "./gateway-error.ts";

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
 * the address is refused outright for a while, before any lookup.
 */
export class AddressLockout {
  private readonly options: AddressLockoutOptions;
  private readonly failures = new Map<string, FailureRecord>();

  constructor(options: Partial<AddressLockoutOptions> = {}) {
    this.options = { ...defaultAddressLockoutOptions, ...options };
  }

  /** Refuses (4008) an address locked out for failing too often. */
  check(clientIp: string, now: number): void {
    const r = this.failures.get(clientIp);
    if (r !== undefined && r.lockedUntil > now) {
      const wait = Math.ceil((r.lockedUntil - now) / 1000);
      throw new GatewayError(ErrorCode.RATE_LIMIT_EXCEEDED, `too many failed authentications from this address; try again in ${wait} s`);
    }
  }

  /** Counts a failure; returns how long to hold the answer back, in ms. */
  failed(clientIp: string, now: number): number {
    const o = this.options;
    let r = this.failures.get(clientIp);
    if (r === undefined) {
      if (this.failures.size > 100_000) this.forgetOld(now);
      r = { times: [], lockedUntil: 0 };
      this.failures.set(clientIp, r);
    }
    r.times = r.times.filter((t) => t > now - o.failureWindowSeconds * 1000);
    r.times.push(now);
    if (r.times.length >= o.lockAfterFailures) {
      r.lockedUntil = now + o.lockSeconds * 1000;
      r.times = [];
    }
    const over = r.times.length - o.slowAfterFailures;
    return over >= 0 ? Math.min(2000, 100 * (over + 1)) : 0;
  }

  private forgetOld(now: number): void {
    for (const [ip, r] of this.failures) {
      if (r.lockedUntil <= now && r.times.every((t) => t <= now - this.options.failureWindowSeconds * 1000)) this.failures.delete(ip);
    }
  }
}
