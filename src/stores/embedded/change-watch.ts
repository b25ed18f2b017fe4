import type { DatabaseSync, StatementSync } from "node:sqlite";
import { readWithin } from "../../core/clock.ts";

/**
 * Tells whether another connection (the CLI, another tool) has committed to
 * the store since a reader last looked, from SQLite's `PRAGMA data_version`,
 * read at most every `intervalMs`. Readers that keep rows in memory drop
 * them when it moves, so an outside change applies within that interval;
 * their own writes they apply themselves.
 */
export class ChangeWatch {
  private readonly pragma: StatementSync;
  private readonly intervalMs: number;
  private readonly now: () => number;
  private checkedAt = Number.NEGATIVE_INFINITY;
  private version = 0;

  constructor(db: DatabaseSync, intervalMs = 100, now: () => number = Date.now) {
    this.pragma = db.prepare("PRAGMA data_version");
    this.intervalMs = intervalMs;
    this.now = now;
  }

  /** A number that changes after every outside commit (checked at most every interval). */
  current(): number {
    const t = this.now();
    if (!readWithin(this.checkedAt, t, this.intervalMs)) {
      this.checkedAt = t;
      this.version = Number((this.pragma.get() as { data_version: number }).data_version);
    }
    return this.version;
  }
}
