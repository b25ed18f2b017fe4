import type pg from "pg";
import { expiringAlerts, type AlertAttempt, type AlertOutbox, type AlertRecord, type DueAlert, type ExpiryWatch, type KeptAlertSecret } from "../../core/alerts.ts";
import { alertFromRow, dueAlertFromRow, type AlertRow } from "../alert-row.ts";
import { alertsKeptMs } from "../embedded/alert-outbox.ts";

const columns = "l.id::text AS id, l.account, l.kind, l.level::text AS level, l.value::text AS value, l.lim::text AS lim, l.day, l.at::text AS at, l.attempts, l.next_at::text AS next_at, l.delivered_at::text AS delivered_at, l.last_error";

/**
 * The shared store's alerts (schema step 18: its triggers record them in the
 * ledger's commits). Every replica delivers: a claim takes due alerts no
 * other replica holds (`FOR UPDATE SKIP LOCKED`) until `claimed_until`, so
 * each attempt is made by one replica, and one that dies mid-attempt leaves
 * the alert to another once its claim lapses. A claim's time is
 * PostgreSQL's (`gw_clock_ms()`, schema step 27), as a lease's: a replica
 * whose clock ran ahead took another's claim as lapsed and sent its alert
 * again. When an alert falls due stays on the replica's clock.
 */
export class PostgresAlertOutbox implements AlertOutbox {
  private readonly pool: pg.Pool;
  private prunedAt = 0;

  constructor(pool: pg.Pool) {
    this.pool = pool;
  }

  async claimDue(now: number, limit: number, claimMs: number): Promise<DueAlert[]> {
    if (now - this.prunedAt >= 3_600_000) {
      this.prunedAt = now;
      await this.pool.query(
        "DELETE FROM alerts WHERE next_at IS NULL AND at < $1 AND (kind <> 'expiry' OR day < to_char(to_timestamp($2 / 1000.0) AT TIME ZONE 'UTC' - interval '1 day', 'YYYY-MM-DD'))",
        [now - alertsKeptMs, now],
      );
    }
    const { rows } = await this.pool.query<AlertRow & { url: string | null; secret: string | null; previous: KeptAlertSecret | KeptAlertSecret[] | null }>(
      `WITH due AS (
         SELECT id FROM alerts WHERE next_at IS NOT NULL AND next_at <= $1 AND claimed_until <= (SELECT gw_clock_ms()) ORDER BY next_at, id LIMIT $2 FOR UPDATE SKIP LOCKED
       ), claimed AS (
         UPDATE alerts SET attempts = attempts + 1, claimed_until = (SELECT gw_clock_ms()) + $3 FROM due WHERE alerts.id = due.id RETURNING alerts.*
       )
       SELECT ${columns}, a.alerts ->> 'url' AS url, a.alert_secret AS secret, a.previous_alert_secret AS previous FROM claimed l LEFT JOIN accounts a ON a.key = l.account ORDER BY l.next_at, l.id`,
      [now, limit, claimMs],
    );
    return rows.map(dueAlertFromRow);
  }

  async settle(id: number, attempt: AlertAttempt, now: number, retryAt: number | undefined): Promise<void> {
    if (attempt.delivered) await this.pool.query("UPDATE alerts SET delivered_at = $1, next_at = NULL, claimed_until = 0, last_error = '' WHERE id = $2", [now, id]);
    else await this.pool.query("UPDATE alerts SET next_at = $1, claimed_until = 0, last_error = $2 WHERE id = $3", [retryAt ?? null, attempt.error, id]);
  }

  async recordExpiring(now: number): Promise<number> {
    const { rows } = await this.pool.query<ExpiryWatch>(
      "SELECT key, expires, zone, (alerts ->> 'expiryDays')::int AS \"expiryDays\" FROM accounts WHERE alerts ? 'expiryDays' AND status = 'active'",
    );
    const due = expiringAlerts(rows, now);
    if (due.length === 0) return 0;
    // Once per last day, whichever replica asks first (the unique index alerts_once).
    const r = await this.pool.query(
      `INSERT INTO alerts (account, kind, level, value, lim, day, at, next_at)
       SELECT account, 'expiry', days, lefts, 0, expires, $5, $5 FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::text[]) AS t (account, days, lefts, expires)
       ON CONFLICT (account, day, level) WHERE kind <> 'balance' DO NOTHING`,
      [due.map((d) => d.account), due.map((d) => d.days), due.map((d) => d.left), due.map((d) => d.expires), now],
    );
    return r.rowCount ?? 0;
  }

  async recent(account: string, limit: number): Promise<AlertRecord[]> {
    const { rows } = await this.pool.query<AlertRow>(`SELECT ${columns} FROM alerts l WHERE l.account = $1 ORDER BY l.id DESC LIMIT $2`, [account, limit]);
    return rows.map(alertFromRow);
  }
}
