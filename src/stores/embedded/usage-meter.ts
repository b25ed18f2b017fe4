import type { DatabaseSync, StatementSync } from "node:sqlite";
import type { UsageMeter, UsageSummary } from "../../core/usage-meter.ts";

/** Charged-call counts per account and day in the embedded SQLite store. */
export class SqliteUsageMeter implements UsageMeter {
  private readonly bump: StatementSync;
  private readonly sums: StatementSync;

  constructor(db: DatabaseSync) {
    this.bump = db.prepare(
      "INSERT INTO usage_daily (account, day, charged) VALUES (?, ?, 1) ON CONFLICT (account, day) DO UPDATE SET charged = charged + 1",
    );
    this.sums = db.prepare(`SELECT
        coalesce(sum(CASE WHEN day = :today THEN charged END), 0) AS today,
        coalesce(sum(CASE WHEN day = :yesterday THEN charged END), 0) AS yesterday,
        coalesce(sum(CASE WHEN day < :yesterday THEN charged END), 0) AS before
      FROM usage_daily WHERE account = :account`);
  }

  recordCharged(accountKey: string, day: string): void {
    this.bump.run(accountKey, day);
  }

  summary(accountKey: string, today: string, yesterday: string): UsageSummary {
    return this.sums.get({ account: accountKey, today, yesterday }) as unknown as UsageSummary;
  }
}
