import type { CallRate } from "./call-rate.ts";
import { rateTake } from "./call-rate.ts";
import { ownReadsReached } from "./limit-refusals.ts";
import { MapSweep } from "./map-sweep.ts";

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
  private readonly sweep = new MapSweep(this.due);

  /** Takes a read of `account` at `nowMs`, or throws 4008 with when the next one fits. */
  take(account: string, nowMs: number): void {
    const taken = rateTake(this.due.get(account), nowMs, ownReadRate);
    if ("waitMs" in taken) throw ownReadsReached(ownReadRate, taken.waitMs);
    if (this.due.size >= maxRemembered && !this.due.has(account)) this.forgetSome(nowMs);
    this.due.set(account, taken.next);
  }

  /**
   * A few settled accounts forgotten, and, still full, the oldest: the same
   * cost for each account added. Before, each one added to a full map looked
   * at all of them when every one was still in its burst.
   */
  private forgetSome(nowMs: number): void {
    const now = BigInt(nowMs) * 1_000_000n;
    this.sweep.step((next) => next <= now);
    // Every one looked at still in its burst: the oldest goes (a forgotten account starts with its full burst again).
    if (this.due.size >= maxRemembered) this.due.delete(this.due.keys().next().value!);
  }
}
