/**
 * Rung by the meter after each group commit of ledger rows in this process,
 * so what follows the ledger as it grows (AdminService.WatchCalls) reads on at
 * once instead of on its next poll. Commits of other replicas ring no bell
 * here: in shared mode a follower still polls, and the bell only makes the
 * local case immediate.
 */
export class CommitBell {
  private waiters = new Set<() => void>();
  /** Whether every commit of the ledger rings it: the embedded store, which one process writes. Then nothing needs a poll. */
  readonly everyCommit: boolean;

  constructor(everyCommit = false) {
    this.everyCommit = everyCommit;
  }

  /** How many times it has rung: a follower notes it before it reads, and waits only if it has not moved since. */
  private rings = 0;

  get rung(): number {
    return this.rings;
  }

  ring(): void {
    this.rings++;
    if (this.waiters.size === 0) return;
    const waiting = this.waiters;
    this.waiters = new Set();
    for (const wake of waiting) wake();
  }

  /**
   * Resolves at the next ring, after `ms`, or when `signal` aborts, whichever comes first; nothing is left waiting after.
   * With `since` (what `rung` was before the caller last read), it resolves at once if a ring came since: a commit
   * between that read and this wait would otherwise ring nobody, and its rows wait for the next poll (a heartbeat).
   */
  wait(ms: number, signal: AbortSignal, since?: number): Promise<void> {
    if (signal.aborted || (since !== undefined && since !== this.rings)) return Promise.resolve();
    return new Promise<void>((resolve) => {
      const done = () => {
        clearTimeout(timer);
        signal.removeEventListener("abort", done);
        this.waiters.delete(done);
        resolve();
      };
      const timer = setTimeout(done, ms);
      signal.addEventListener("abort", done, { once: true });
      this.waiters.add(done);
    });
  }

  /** How many are waiting now (tests: a stream that ended leaves none). */
  get waiting(): number {
    return this.waiters.size;
  }
}
