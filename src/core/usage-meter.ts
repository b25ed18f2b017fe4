/** Charged calls of one account: today, yesterday and every day before. */
export interface UsageSummary {
  readonly today: number;
  readonly yesterday: number;
  readonly before: number;
}

/**
 * Counts charged calls per account and day (the account's own day). The
 * embedded adapter is SQLite; exact reservations and the ledger build on it.
 */
export interface UsageMeter {
  recordCharged(accountKey: string, day: string): void;
  summary(accountKey: string, today: string, yesterday: string): UsageSummary;
}
