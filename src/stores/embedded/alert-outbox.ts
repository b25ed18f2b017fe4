import type { DatabaseSync, StatementSync } from "node:sqlite";
import { expiringAlerts, type AlertAttempt, type AlertOutbox, type AlertRecord, type DueAlert, type ExpiryWatch } from "../../core/alerts.ts";
import { alertFromRow, dueAlertFromRow, type AlertRow } from "../alert-row.ts";
import { writeTransaction } from "./sqlite-database.ts";

/**
 * Alerts delivered or given up are kept this long, then pruned (at most once
 * an hour); a key's expiry alert at least until its last day has passed, so
 * one asked for more than this many days ahead is not recorded again.
 */
export const alertsKeptMs = 30 * 86_400_000;

/**
 * The embedded store's alerts (schema step 20: its triggers record them in
 * the ledger's commits). One gateway serves a data directory, so a claim
 * only keeps an attempt from being made twice while it runs.
 */
export class SqliteAlertOutbox implements AlertOutbox {
  private readonly db: DatabaseSync;
  private readonly due: StatementSync;
  private readonly claim: StatementSync;
  private readonly delivered: StatementSync;
  private readonly failed: StatementSync;
  private readonly byAccount: StatementSync;
  private readonly prune: StatementSync;
  private readonly watched: StatementSync;
  private readonly expiring: StatementSync;
  private prunedAt = 0;

  constructor(db: DatabaseSync) {
    this.db = db;
    this.due = db.prepare(
      `SELECT l.*, json_extract(a.alerts, '$.url') AS url, a.alert_secret AS secret, a.previous_alert_secret AS previous FROM alerts l LEFT JOIN accounts a ON a.key = l.account
       WHERE l.next_at IS NOT NULL AND l.next_at <= :now AND l.claimed_until <= :now ORDER BY l.next_at, l.id LIMIT :limit`,
    );
    this.due.setReadBigInts(true);
    this.claim = db.prepare("UPDATE alerts SET attempts = attempts + 1, claimed_until = ? WHERE id = ?");
    this.delivered = db.prepare("UPDATE alerts SET delivered_at = ?, next_at = NULL, claimed_until = 0, last_error = '' WHERE id = ?");
    this.failed = db.prepare("UPDATE alerts SET next_at = ?, claimed_until = 0, last_error = ? WHERE id = ?");
    this.byAccount = db.prepare("SELECT * FROM alerts WHERE account = ? ORDER BY id DESC LIMIT ?");
    this.byAccount.setReadBigInts(true);
    this.prune = db.prepare("DELETE FROM alerts WHERE next_at IS NULL AND at < ?1 AND (kind <> 'expiry' OR day < date(?2 / 1000, 'unixepoch', '-1 day'))");
    this.watched = db.prepare(
      "SELECT key, expires, zone, CAST(json_extract(alerts, '$.expiryDays') AS INTEGER) AS expiryDays FROM accounts WHERE alerts IS NOT NULL AND status = 'active' AND json_extract(alerts, '$.expiryDays') IS NOT NULL",
    );
    this.expiring = db.prepare("INSERT OR IGNORE INTO alerts (account, kind, level, value, lim, day, at, next_at) VALUES (?, 'expiry', ?, ?, 0, ?, ?, ?)");
  }

  recordExpiring(now: number): Promise<number> {
    return Promise.resolve(
      writeTransaction(this.db, () => {
        let recorded = 0;
        for (const e of expiringAlerts(this.watched.all() as unknown as ExpiryWatch[], now)) recorded += Number(this.expiring.run(e.account, e.days, e.left, e.expires, now, now).changes);
        return recorded;
      }),
    );
  }

  claimDue(now: number, limit: number, claimMs: number): Promise<DueAlert[]> {
    const prune = now - this.prunedAt >= 3_600_000;
    const due = () => this.due.all({ now, limit }) as unknown as (AlertRow & { url: string | null; secret: string | null; previous: string | null })[];
    // Looked for once a second on the connection that serves calls: with nothing due and nothing to prune, a read
    // is all it takes, not the write lock. This process is the only one that claims, so what it read is still due.
    const read = prune ? undefined : due();
    if (read?.length === 0) return Promise.resolve([]);
    return Promise.resolve(
      writeTransaction(this.db, () => {
        if (prune) {
          this.prunedAt = now;
          this.prune.run(now - alertsKeptMs, now);
        }
        // With a prune, what is due is read after it, in the same transaction.
        const rows = read ?? due();
        for (const r of rows) this.claim.run(now + claimMs, r.id);
        return rows.map((r) => ({ ...dueAlertFromRow(r), attempts: Number(r.attempts) + 1 }));
      }),
    );
  }

  settle(id: number, attempt: AlertAttempt, now: number, retryAt: number | undefined): Promise<void> {
    if (attempt.delivered) this.delivered.run(now, id);
    else this.failed.run(retryAt ?? null, attempt.error, id);
    return Promise.resolve();
  }

  recent(account: string, limit: number): Promise<AlertRecord[]> {
    return Promise.resolve((this.byAccount.all(account, limit) as unknown as AlertRow[]).map(alertFromRow));
  }
}
