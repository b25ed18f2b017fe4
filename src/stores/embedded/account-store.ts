import type { DatabaseSync, StatementSync } from "node:sqlite";
import type { AccountStore } from "../../core/account-store.ts";
import type { Account } from "../../core/accounts.ts";
import { accountColumns, accountFromRow, accountToRow, type AccountRow } from "../account-row.ts";
import type { ChangeWatch } from "./change-watch.ts";

/**
 * Accounts in the embedded SQLite store. Lookups are served from memory;
 * the cache is dropped when another process (the CLI) commits, so its
 * changes apply within the change watch's interval, and an entry is dropped
 * when this process changes that account (including balance deductions).
 */
export class SqliteAccountStore implements AccountStore {
  private readonly watch: ChangeWatch;
  private readonly cached = new Map<string, Account | undefined>();
  private seenVersion = -1;
  private readonly byKey: StatementSync;
  private readonly all: StatementSync;
  private readonly insertRow: StatementSync;
  private readonly replaceRow: StatementSync;

  constructor(db: DatabaseSync, watch: ChangeWatch) {
    this.watch = watch;
    // Balances are micro-units: read every integer as bigint, never as a float.
    // The balance is read beside the account; only the meter writes it.
    const read = "SELECT a.*, b.micros AS balance FROM accounts a LEFT JOIN balances b ON b.account = a.key";
    this.byKey = db.prepare(`${read} WHERE a.key = ?`);
    this.byKey.setReadBigInts(true);
    this.all = db.prepare(`${read} ORDER BY a.created_at, a.key`);
    this.all.setReadBigInts(true);
    this.insertRow = db.prepare(`INSERT INTO accounts (${accountColumns.join(", ")}) VALUES (${accountColumns.map((c) => `:${c}`).join(", ")})`);
    const settable = accountColumns.filter((c) => c !== "key" && c !== "created_at");
    this.replaceRow = db.prepare(`UPDATE accounts SET ${settable.map((c) => `${c} = :${c}`).join(", ")} WHERE key = :key`);
  }

  /** The account as this process knows it, reread once another process has committed. */
  find(key: string): Account | undefined {
    const version = this.watch.current();
    if (version !== this.seenVersion) {
      this.cached.clear();
      this.seenVersion = version;
    }
    if (this.cached.has(key)) return this.cached.get(key);
    const row = this.byKey.get(key) as AccountRow | undefined;
    const account = row === undefined ? undefined : accountFromRow(row);
    // Unknown keys are remembered too (bounded), so a flood of bad keys costs no query each.
    if (this.cached.size >= 100_000) this.cached.clear();
    this.cached.set(key, account);
    return account;
  }

  /** Drops what is remembered of an account, after this process changed it. */
  forget(key: string): void {
    this.cached.delete(key);
  }

  async list(): Promise<Account[]> {
    return (this.all.all() as unknown as AccountRow[]).map(accountFromRow);
  }

  async insert(account: Account): Promise<void> {
    this.insertRow.run(accountToRow(account));
    this.forget(account.key);
  }

  async update(key: string, change: Partial<Omit<Account, "key" | "createdAt" | "balance">>): Promise<Account> {
    const current = this.find(key);
    if (current === undefined) throw new Error(`no account has the key ${key}`);
    const next = { ...current, ...change };
    const { created_at: _created, ...settable } = accountToRow(next);
    this.replaceRow.run(settable);
    this.forget(key);
    return next;
  }

}
