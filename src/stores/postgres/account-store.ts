import type pg from "pg";
import type { OperationId } from "../../contract/operations.ts";
import type { AccountStore } from "../../core/account-store.ts";
import type { Account, OperationState } from "../../core/accounts.ts";
import { databaseFault } from "./postgres-database.ts";

/** How long a replica trusts what it read of an account: every replica sees a change within this. */
export const accountFreshMs = 1000;

interface Row {
  key: string;
  name: string;
  secret_hash: string;
  secret_salt: string;
  legacy_signing_key: string | null;
  hmac_key: string | null;
  status: string;
  operations: Record<string, OperationState>;
  daily_max: string;
  concurrency: number;
  prices: Record<string, string>;
  expires: string;
  zone: string;
  created_at: string;
  balance: string | null;
}

/** The columns an account is written with, in the order of `params`. */
const columns = ["key", "name", "secret_hash", "secret_salt", "legacy_signing_key", "hmac_key", "status", "operations", "daily_max", "concurrency", "prices", "expires", "zone", "created_at"];
const read = `SELECT a.key, a.name, a.secret_hash, a.secret_salt, a.legacy_signing_key, a.hmac_key, a.status, a.operations, a.daily_max::text AS daily_max,
    a.concurrency, a.prices, a.expires, a.zone, a.created_at::text AS created_at, b.micros::text AS balance
  FROM accounts a LEFT JOIN balances b ON b.account = a.key`;

function fromRow(r: Row): Account {
  return {
    key: r.key,
    name: r.name,
    secretHash: r.secret_hash,
    secretSalt: r.secret_salt,
    legacySigningKey: r.legacy_signing_key ?? undefined,
    hmacKey: r.hmac_key ?? undefined,
    status: r.status === "stopped" ? "stopped" : "active",
    operations: new Map(Object.entries(r.operations)) as Map<OperationId, OperationState>,
    dailyMax: Number(r.daily_max),
    concurrency: r.concurrency,
    balance: r.balance === null ? undefined : BigInt(r.balance),
    prices: new Map(Object.entries(r.prices).map(([op, micros]) => [op as OperationId, BigInt(micros)])),
    expires: r.expires,
    zone: r.zone,
    createdAt: Number(r.created_at),
  };
}

function params(a: Omit<Account, "balance">): unknown[] {
  return [
    a.key, a.name, a.secretHash, a.secretSalt, a.legacySigningKey ?? null, a.hmacKey ?? null, a.status, JSON.stringify(Object.fromEntries(a.operations)), a.dailyMax,
    a.concurrency, JSON.stringify(Object.fromEntries([...a.prices].map(([op, micros]) => [op, micros.toString()]))), a.expires, a.zone, a.createdAt,
  ];
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

  constructor(pool: pg.Pool, now: () => number = Date.now) {
    this.pool = pool;
    this.now = now;
  }

  async find(key: string): Promise<Account | undefined> {
    const known = this.cached.get(key);
    const now = this.now();
    if (known !== undefined && now - known.at < accountFreshMs) return known.account;
    let r: pg.QueryResult<Row>;
    try {
      r = await this.pool.query<Row>(`${read} WHERE a.key = $1`, [key]);
    } catch (e) {
      throw databaseFault(e);
    }
    const account = r.rows[0] === undefined ? undefined : fromRow(r.rows[0]);
    if (this.cached.size >= 100_000) this.cached.clear();
    this.cached.set(key, { account, at: now });
    return account;
  }

  async list(): Promise<Account[]> {
    return (await this.pool.query<Row>(`${read} ORDER BY a.created_at, a.key`)).rows.map(fromRow);
  }

  async insert(account: Account): Promise<void> {
    await this.pool.query(`INSERT INTO accounts (${columns.join(", ")}) VALUES (${columns.map((_, i) => `$${i + 1}`).join(", ")})`, params(account));
    this.cached.delete(account.key);
  }

  async update(key: string, change: Partial<Omit<Account, "key" | "createdAt" | "balance">>): Promise<Account> {
    this.cached.delete(key);
    const current = await this.find(key);
    if (current === undefined) throw new Error(`no account has the key ${key}`);
    const next = { ...current, ...change };
    // created_at (the last column) never changes, so it is not sent.
    const values = params(next).slice(0, columns.length - 1);
    const sets = columns.map((c, i) => [c, i] as const).filter(([c]) => c !== "key" && c !== "created_at");
    await this.pool.query(`UPDATE accounts SET ${sets.map(([c, i]) => `${c} = $${i + 1}`).join(", ")} WHERE key = $1`, values);
    this.cached.delete(key);
    return next;
  }

  /** Drops what this replica remembers of an account (after its own balance moved). */
  forget(key: string): void {
    this.cached.delete(key);
  }
}
