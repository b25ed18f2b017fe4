import type { DatabaseSync, StatementSync } from "node:sqlite";
import type { ReplayGuard } from "../../core/replay-guard.ts";

/**
 * Used signatures in the embedded store, so a signed URL stays used across a
 * restart for its whole window. Each check is one statement: the id goes in,
 * or takes the place of an expired one; an unexpired one stays and says "seen".
 * Expired ids are swept now and then. A write that fails throws: the caller
 * refuses the call rather than risk a replay.
 */
export class SqliteReplayGuard implements ReplayGuard {
  private readonly use: StatementSync;
  private readonly sweep: StatementSync;
  private nextSweep = 0;

  constructor(db: DatabaseSync) {
    this.use = db.prepare(
      "INSERT INTO used_signatures (id, until) VALUES (?, ?) ON CONFLICT (id) DO UPDATE SET until = excluded.until WHERE used_signatures.until <= ?",
    );
    this.sweep = db.prepare("DELETE FROM used_signatures WHERE until <= ?");
  }

  async seen(id: string, now: number, ttlMs: number): Promise<boolean> {
    if (now >= this.nextSweep) {
      this.sweep.run(now);
      this.nextSweep = now + 60_000;
    }
    return Number(this.use.run(id, now + ttlMs, now).changes) === 0;
  }
}
