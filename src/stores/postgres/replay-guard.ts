import { createHash } from "node:crypto";
import type pg from "pg";
import type { ReplayGuard } from "../../core/replay-guard.ts";
import { callStatement } from "./postgres-database.ts";

/**
 * Used signatures in the shared store: one statement records an id, or takes
 * the place of an expired one; an unexpired one stays and says "seen". So a
 * sign or nonce is accepted once across every replica and every restart
 * (of a replica, or of Redis, which keeps nothing on disk here). Expired ids
 * are swept now and then.
 */
export class PostgresReplayGuard implements ReplayGuard {
  private readonly pool: pg.Pool;
  private nextSweep = 0;

  constructor(pool: pg.Pool) {
    this.pool = pool;
  }

  async seen(id: string, now: number, ttlMs: number): Promise<boolean> {
    if (now >= this.nextSweep) {
      this.nextSweep = now + 60_000;
      void this.pool.query("DELETE FROM used_signatures WHERE until <= $1", [now]).catch(() => {});
    }
    // Stored as a digest: ids join their parts with NUL, which PostgreSQL text cannot hold.
    const digest = createHash("sha256").update(id).digest("hex");
    const r = await this.pool.query(
      callStatement("INSERT INTO used_signatures (id, until) VALUES ($1, $2) ON CONFLICT (id) DO UPDATE SET until = excluded.until WHERE used_signatures.until <= $3", [digest, now + ttlMs, now]),
    );
    return r.rowCount === 0;
  }
}
