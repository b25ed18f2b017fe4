import { ErrorCode } from "../gen/gateway/catalogue/v1/status_pb.js";
import type { Account } from "./accounts.ts";
import { formatRate, type CallRate } from "./call-rate.ts";
import { GatewayError } from "./gateway-error.ts";
import { formatMoney } from "./money.ts";

// The refusals of the limits, one place for every store that decides them (the embedded meter, the shared one,
// both address lockouts): the same code, the same words and the same limit, whichever decided.

/** 4008: the account has as many calls in flight as its concurrency allows; one frees when any of them ends. */
export function concurrencyReached(inFlight: number | string): GatewayError {
  return new GatewayError(ErrorCode.RATE_LIMIT_EXCEEDED, `this account already has ${inFlight} calls in flight, its limit`, { limit: "concurrency" });
}

/** 4013: today's calls are the account's daily maximum; the core knows when its day ends (`Gateway.call`). */
export function dailyMaxReached(account: Pick<Account, "dailyMax" | "zone">): GatewayError {
  return new GatewayError(ErrorCode.CALLS_EXCEEDED, `the daily maximum of ${account.dailyMax} calls is reached; it resets at midnight ${account.zone}`, { limit: "daily_max" });
}

/** 4016: what the balance has left, less what calls in flight will take, does not cover the operation's price. */
export function balanceShort(available: bigint, price: bigint, operation: string): GatewayError {
  return new GatewayError(ErrorCode.INSUFFICIENT_BALANCE, `the balance ${formatMoney(available)} does not cover the price ${formatMoney(price)} of ${operation}`, { limit: "balance" });
}

/** 4008: the account's rate is used up; the next call fits in `waitMs`. */
export function rateReached(rate: CallRate, waitMs: number): GatewayError {
  const ms = Math.max(1, Math.ceil(waitMs));
  return new GatewayError(ErrorCode.RATE_LIMIT_EXCEEDED, `this account's rate limit of ${formatRate(rate)} is reached; the next call is admitted in ${ms} ms`, { limit: "rate", retryAfterMs: ms });
}

/** 4008: an account read its own state (the AccountService) faster than `rate` allows. */
export function ownReadsReached(rate: CallRate, waitMs: number): GatewayError {
  const ms = Math.max(1, Math.ceil(waitMs));
  return new GatewayError(ErrorCode.RATE_LIMIT_EXCEEDED, `an account may read its own state at most ${formatRate(rate)}; the next read is admitted in ${ms} ms`, { limit: "rate", retryAfterMs: ms });
}

/** 4008: the caller's address is locked out for failed authentications, for `ms` more. */
export function lockedOut(ms: number): GatewayError {
  const left = Math.max(1, Math.ceil(ms));
  return new GatewayError(ErrorCode.RATE_LIMIT_EXCEEDED, `too many failed authentications from this address; try again in ${Math.ceil(left / 1000)} s`, { limit: "address_locked", retryAfterMs: left });
}
