import type { CallRate } from "./call-rate.ts";
import { rateTake } from "./call-rate.ts";
import { ownReadsReached } from "./limit-refusals.ts";

/**
 * How often one account may read its own state (the AccountService) from
 * one process: 20 reads a second, 20 at once. The reads are not calls, so
 * no plan limits them; but each reads the store (the balance and, for
 * usage, the ledger), so a key in a loop must not be able to load it. The
 * same GCRA as an account's rate (call-rate.ts), kept in memory: a replica
 * bounds what it is asked.
 */
export const ownReadRate: CallRate = { calls: 20, seconds: 1, burst: 20 };

/** Accounts remembered at most; past it, those whose reads have all fallen due are forgotten. */
const maxRemembered = 100_000;

export class OwnReads {
  private readonly due = new Map<string, bigint>();

  /** Takes a read of `account` at `nowMs`, or throws 4008 with when the next one fits. */
  take(account: string, nowMs: number): void {
    const taken = rateTake(this.due.get(account), nowMs, ownReadRate);
    if ("waitMs" in taken) throw ownReadsReached(ownReadRate, taken.waitMs);
    if (this.due.size >= maxRemembered && !this.due.has(account)) this.forgetSettled(nowMs);
    this.due.set(account, taken.next);
  }

  private forgetSettled(nowMs: number): void {
    const now = BigInt(nowMs) * 1_000_000n;
    for (const [account, next] of this.due) if (next <= now) this.due.delete(account);
    // Every one still in its burst: the oldest go (a forgotten account starts with its full burst again).
    for (const account of this.due.keys()) {
      if (this.due.size < maxRemembered) break;
      this.due.delete(account);
    }
  }
}
