import type pg from "pg";
import type { AccountChange, AccountEdit } from "../../core/account-history.ts";
import { ExternalIdTaken, type AccountListing, type AccountStore } from "../../core/account-store.ts";
import type { Account } from "../../core/accounts.ts";
import { readWithin } from "../../core/clock.ts";
import type { MaybeAsync } from "../../core/maybe-async.ts";
import { accountChangeFromRow, accountColumns, accountFromRow, accountToRow, changedColumns, changesToJson, type AccountChangeRow, type AccountRow } from "../account-row.ts";
import { callStatement, databaseFault, inTransaction } from "./postgres-database.ts";

/** How long a replica trusts what it read of an account: every replica sees a change within this. */
export const accountFreshMs = 1000;

const read = `SELECT a.key, a.name, a.secret_hash, a.secret_salt, a.legacy_signing_key, a.hmac_key, a.status, a.operations, a.daily_max::text AS daily_max,
    a.concurrency, a.prices, a.expires, a.zone, a.previous_secret, a.rate, a.allowed_from, a.alerts, a.alert_secret, a.previous_alert_secret, a.external_id, a.created_with, a.created_at::text AS created_at, b.micros::text AS balance
  FROM accounts a LEFT JOIN balances b ON b.account = a.key`;

interface Reading {
  done: Promise<Account | undefined>;
}

/**
 * Accounts in the shared store. A replica answers lookups from memory for
 * at most `accountFreshMs`, so a change made anywhere (the CLI, the
 * AdminService on another replica) applies everywhere within a second, and
 * a flood of unknown keys costs one query per key per second. The balance is
 * read beside the account; only the meter writes it.
 */
export class PostgresAccountStore implements AccountStore {
  private readonly pool: pg.Pool;
  private readonly now: () => number;
  private readonly cached = new Map<string, { account: Account | undefined; at: number }>();
  /** Lookups in flight, one per key. */
  private readonly reading = new Map<string, Reading>();

  constructor(pool: pg.Pool, now: () => number = Date.now) {
    this.pool = pool;
    this.now = now;
  }

  /** What this replica read of the account less than `accountFreshMs` ago at once (MaybeAsync), else a (shared) reread. */
  find(key: string): MaybeAsync<Account | undefined> {
    const known = this.cached.get(key);
    const now = this.now();
    if (known !== undefined && readWithin(known.at, now, accountFreshMs)) return known.account;
    // One query per key at a time: the calls that find an entry stale together share its reread.
    let reading = this.reading.get(key);
    if (reading === undefined) {
      reading = {} as Reading;
      this.reading.set(key, reading);
      reading.done = this.read(key, now, reading);
    }
    return reading.done;
  }

  /**
   * Reads an account and remembers it, unless `forget` dropped this read
   * meanwhile (this replica changed the account): its answer may predate
   * the change.
   */
  private async read(key: string, now: number, entry: Reading): Promise<Account | undefined> {
    const stillWanted = () => {
      const wanted = this.reading.get(key) === entry;
      if (wanted) this.reading.delete(key);
      return wanted;
    };
    let r: pg.QueryResult<AccountRow>;
    try {
      r = await this.pool.query<AccountRow>(callStatement(`${read} WHERE a.key = $1`, [key]));
    } catch (e) {
      stillWanted();
      throw databaseFault(e);
    }
    const account = r.rows[0] === undefined ? undefined : accountFromRow(r.rows[0]);
    if (stillWanted()) {
      if (this.cached.size >= 100_000) this.cached.clear();
      this.cached.set(key, { account, at: now });
    }
    return account;
  }

  async findByExternalId(externalId: string): Promise<Account | undefined> {
    const r = await this.pool.query<AccountRow>(`${read} WHERE a.external_id = $1`, [externalId]);
    return r.rows[0] === undefined ? undefined : accountFromRow(r.rows[0]);
  }

  async list(): Promise<Account[]> {
    // Keys by code unit ("C"), as the embedded store and JavaScript order them, not by the database's collation.
    return (await this.pool.query<AccountRow>(`${read} ORDER BY a.created_at, a.key COLLATE "C"`)).rows.map(accountFromRow);
  }

  async listing(ask: AccountListing): Promise<{ accounts: Account[]; total: number }> {
    const params: unknown[] = [];
    const filter = ["true"];
    if (ask.text !== "") {
      params.push(ask.text);
      filter.push(`(strpos(lower(a.key), $${params.length}) > 0 OR strpos(lower(a.name), $${params.length}) > 0 OR strpos(lower(coalesce(a.external_id, '')), $${params.length}) > 0)`);
    }
    if (ask.status !== undefined) {
      params.push(ask.status);
      filter.push(`a.status = $${params.length}`);
    }
    const where = filter.join(" AND ");
    const rowParams = [...params];
    let after = "";
    if (ask.after !== undefined) {
      rowParams.push(ask.after.createdAt, ask.after.key);
      after = ` AND (a.created_at, a.key COLLATE "C") > ($${rowParams.length - 1}::bigint, $${rowParams.length}::text COLLATE "C")`;
    }
    let limit = "";
    if (ask.limit > 0) {
      rowParams.push(ask.limit);
      limit = ` LIMIT $${rowParams.length}`;
    }
    // The page and the count in one statement: as one moment left them.
    // (An empty page is one row of nulls beside the count.)
    const r = await this.pool.query<AccountRow & { total: string }>(
      `SELECT t.total, p.* FROM (SELECT count(*)::text AS total FROM accounts a WHERE ${where}) t
       LEFT JOIN LATERAL (${read} WHERE ${where}${after} ORDER BY a.created_at, a.key COLLATE "C"${limit}) p ON true`,
      rowParams,
    );
    // In list()'s order (the join need not keep the page's).
    const rows = r.rows.filter((row) => row.key !== null).sort((x, y) => Number(x.created_at) - Number(y.created_at) || (x.key < y.key ? -1 : x.key > y.key ? 1 : 0));
    return { accounts: rows.map(accountFromRow), total: Number(r.rows[0]?.total ?? 0) };
  }

  async insert(account: Account, created: AccountChange): Promise<void> {
    const row = accountToRow(account);
    const n = accountColumns.length;
    // The account and the record of its creation in one statement, so one transaction.
    try {
      await this.pool.query(
        `WITH made AS (INSERT INTO accounts (${accountColumns.join(", ")}) VALUES (${accountColumns.map((_, i) => `$${i + 1}`).join(", ")}) RETURNING key)
         INSERT INTO account_changes (account, at, kind, actor, changes) SELECT key, $${n + 1}, $${n + 2}, $${n + 3}, $${n + 4}::jsonb FROM made`,
        [...accountColumns.map((c) => row[c]), String(created.at), created.kind, created.by, changesToJson(created)],
      );
    } catch (e) {
      const fault = e as { code?: string; constraint?: string };
      // unique_violation on the one unique column a new account can meet (its key is new).
      if (fault.code === "23505" && fault.constraint === "accounts_external_id") throw new ExternalIdTaken(account.externalId ?? "");
      throw e;
    }
    this.forget(account.key);
  }

  /**
   * Reads the account with `FOR UPDATE`, so a change of it on another
   * replica (or the CLI) waits for this one's commit and then reads what it
   * wrote: neither is lost, and a rotation is never undone by a change that
   * had read the secret before it. Only the columns the change names are written.
   */
  async change(key: string, edit: (current: Account) => AccountEdit | undefined): Promise<Account | undefined> {
    this.forget(key);
    try {
      return await inTransaction(this.pool, async (client) => {
        const r = await client.query<AccountRow>(`${read} WHERE a.key = $1 FOR UPDATE OF a`, [key]);
        const current = r.rows[0] === undefined ? undefined : accountFromRow(r.rows[0]);
        const made = current === undefined ? undefined : edit(current);
        if (current === undefined || made === undefined) return current;
        const next: Account = { ...current, ...made.fields };
        const { columns, values } = changedColumns(current, next, made.fields);
        await client.query(`UPDATE accounts SET ${columns.map((c, i) => `${c} = $${i + 2}`).join(", ")} WHERE key = $1`, [key, ...values]);
        await client.query("INSERT INTO account_changes (account, at, kind, actor, changes) VALUES ($1, $2, $3, $4, $5::jsonb)", [
          key,
          String(made.change.at),
          made.change.kind,
          made.change.by,
          changesToJson(made.change),
        ]);
        return next;
      });
    } finally {
      this.forget(key);
    }
  }

  async history(key: string): Promise<AccountChange[]> {
    const r = await this.pool.query<AccountChangeRow>("SELECT at::text AS at, kind, actor, changes FROM account_changes WHERE account = $1 ORDER BY id", [key]);
    return r.rows.map(accountChangeFromRow);
  }

  /** Drops what this replica remembers of an account (after its own balance moved). */
  forget(key: string): void {
    this.cached.delete(key);
    this.reading.delete(key);
  }
}
