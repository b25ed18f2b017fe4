import type { DatabaseSync, StatementSync } from "node:sqlite";
import type { AccountChange, AccountEdit } from "../../core/account-history.ts";
import { ExternalIdTaken, type AccountListing, type AccountStore } from "../../core/account-store.ts";
import type { Account } from "../../core/accounts.ts";
import { accountChangeFromRow, accountColumns, accountFromRow, accountToRow, changedColumns, changesToJson, type AccountChangeRow, type AccountRow } from "../account-row.ts";
import type { ChangeWatch } from "./change-watch.ts";
import { writeTransaction } from "./sqlite-database.ts";
import { InThreadReader, type SqlReader } from "./sql-reader.ts";

/**
 * Accounts in the embedded SQLite store. Lookups are served from memory;
 * the cache is dropped when another process (the CLI) commits, so its
 * changes apply within the change watch's interval, and an entry is dropped
 * when this process changes that account (including balance deductions).
 */
export class SqliteAccountStore implements AccountStore {
  private readonly db: DatabaseSync;
  private readonly watch: ChangeWatch;
  private readonly cached = new Map<string, Account | undefined>();
  private seenVersion = -1;
  private readonly byKey: StatementSync;
  private readonly byExternalId: StatementSync;
  private readonly all: StatementSync;
  private readonly insertRow: StatementSync;
  /** An UPDATE per set of columns a change writes. */
  private readonly updates = new Map<string, StatementSync>();
  private readonly insertChange: StatementSync;
  private readonly changesOf: StatementSync;
  /** ListAccounts' statements, by the filter's shape. */
  private readonly listings = new Map<string, { rows: string; count: string }>();
  /** Where listings run (sql-reader.ts): a search reads every account. */
  private readonly reader: SqlReader;

  /** `reader`: where ListAccounts' listings run; by default on `db` itself. */
  constructor(db: DatabaseSync, watch: ChangeWatch, reader?: SqlReader) {
    this.db = db;
    this.watch = watch;
    this.reader = reader ?? new InThreadReader(db);
    // Balances are micro-units: read every integer as bigint, never as a float.
    // The balance is read beside the account; only the meter writes it.
    const read = "SELECT a.*, b.micros AS balance FROM accounts a LEFT JOIN balances b ON b.account = a.key";
    this.byKey = db.prepare(`${read} WHERE a.key = ?`);
    this.byKey.setReadBigInts(true);
    this.byExternalId = db.prepare(`${read} WHERE a.external_id = ?`);
    this.byExternalId.setReadBigInts(true);
    this.all = db.prepare(`${read} ORDER BY a.created_at, a.key`);
    this.all.setReadBigInts(true);
    this.insertRow = db.prepare(`INSERT INTO accounts (${accountColumns.join(", ")}) VALUES (${accountColumns.map((c) => `:${c}`).join(", ")})`);
    this.insertChange = db.prepare("INSERT INTO account_changes (account, at, kind, actor, changes) VALUES (?, ?, ?, ?, ?)");
    this.changesOf = db.prepare("SELECT at, kind, actor, changes FROM account_changes WHERE account = ? ORDER BY id");
    db.function("gw_lower", { deterministic: true }, (v) => (typeof v === "string" ? v.toLowerCase() : v));
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

  async findByExternalId(externalId: string): Promise<Account | undefined> {
    const row = this.byExternalId.get(externalId) as AccountRow | undefined;
    return row === undefined ? undefined : accountFromRow(row);
  }

  async list(): Promise<Account[]> {
    return (this.all.all() as unknown as AccountRow[]).map(accountFromRow);
  }

  async listing(ask: AccountListing): Promise<{ accounts: Account[]; total: number }> {
    const shape = `${ask.text !== ""}/${ask.status !== undefined}/${ask.after !== undefined}/${ask.limit > 0}`;
    let sql = this.listings.get(shape);
    if (sql === undefined) {
      const filter = ["1"];
      // SQLite's own lower() folds ASCII only: gw_lower is JavaScript's, as the text was lowered with.
      if (ask.text !== "") filter.push("(instr(gw_lower(a.key), :text) > 0 OR instr(gw_lower(a.name), :text) > 0 OR instr(gw_lower(coalesce(a.external_id, '')), :text) > 0)");
      if (ask.status !== undefined) filter.push("a.status = :status");
      const where = filter.join(" AND ");
      // A row value, which the index on (created_at, key) answers from where the last page ended.
      const after = ask.after !== undefined ? " AND (a.created_at, a.key) > (:createdAt, :key)" : "";
      sql = {
        rows: `SELECT a.*, b.micros AS balance FROM accounts a LEFT JOIN balances b ON b.account = a.key WHERE ${where}${after} ORDER BY a.created_at, a.key${ask.limit > 0 ? " LIMIT :limit" : ""}`,
        count: `SELECT count(*) AS n FROM accounts a WHERE ${where}`,
      };
      this.listings.set(shape, sql);
    }
    const { rows, count } = sql;
    const filterParams = { ...(ask.text !== "" ? { text: ask.text } : {}), ...(ask.status !== undefined ? { status: ask.status } : {}) };
    const rowParams = { ...filterParams, ...(ask.after !== undefined ? { createdAt: ask.after.createdAt, key: ask.after.key } : {}), ...(ask.limit > 0 ? { limit: ask.limit } : {}) };
    // One read: the page and the count as one moment left them.
    const [page, counted] = await this.reader.read([
      { sql: rows, params: rowParams, bigints: true },
      { sql: count, params: filterParams },
    ]);
    return { accounts: (page as unknown as AccountRow[]).map(accountFromRow), total: Number((counted![0] as { n: number | bigint }).n) };
  }

  async insert(account: Account, created: AccountChange): Promise<void> {
    try {
      writeTransaction(this.db, () => {
        this.insertRow.run(accountToRow(account));
        this.record(account.key, created);
      });
    } catch (e) {
      // SQLITE_CONSTRAINT_UNIQUE on the one unique column a new account can meet (its key is new).
      if (account.externalId !== undefined && (e as { errcode?: number }).errcode === 2067 && /external_id/.test((e as Error).message)) throw new ExternalIdTaken(account.externalId);
      throw e;
    }
    this.forget(account.key);
  }

  /**
   * The account is read from the file inside the write transaction, not
   * from memory: what this process remembers may be up to the change
   * watch's interval old, and a change written over it would undo one the
   * CLI (or another process) just made.
   */
  async change(key: string, edit: (current: Account) => AccountEdit | undefined): Promise<Account | undefined> {
    try {
      return writeTransaction(this.db, () => {
        const row = this.byKey.get(key) as AccountRow | undefined;
        if (row === undefined) return undefined;
        const current = accountFromRow(row);
        const made = edit(current);
        if (made === undefined) return current;
        const next: Account = { ...current, ...made.fields };
        const { columns, values } = changedColumns(current, next, made.fields);
        this.updateOf(columns).run(Object.fromEntries([["key", key], ...columns.map((c, i) => [c, values[i]])]));
        this.record(key, made.change);
        return next;
      });
    } finally {
      this.forget(key);
    }
  }

  async history(key: string): Promise<AccountChange[]> {
    return (this.changesOf.all(key) as unknown as AccountChangeRow[]).map(accountChangeFromRow);
  }

  private record(key: string, change: AccountChange): void {
    this.insertChange.run(key, change.at, change.kind, change.by, changesToJson(change));
  }

  private updateOf(columns: readonly string[]): StatementSync {
    const id = columns.join(",");
    let update = this.updates.get(id);
    if (update === undefined) {
      update = this.db.prepare(`UPDATE accounts SET ${columns.map((c) => `${c} = :${c}`).join(", ")} WHERE key = :key`);
      this.updates.set(id, update);
    }
    return update;
  }

}
