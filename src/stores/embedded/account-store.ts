import type { DatabaseSync, StatementSync } from "node:sqlite";
import type { AccountStore } from "../../core/account-store.ts";
import type { Account, OperationState } from "../../core/accounts.ts";
import type { OperationId } from "../../contract/operations.ts";
import type { ChangeWatch } from "./change-watch.ts";

interface Row {
  key: string;
  name: string;
  secret_hash: string;
  secret_salt: string;
  status: string;
  operations: string;
  daily_max: bigint;
  concurrency: bigint;
  balance: bigint | null;
  prices: string;
  expires: string;
  zone: string;
  created_at: bigint;
  legacy_signing_key: string | null;
  hmac_key: string | null;
}

function fromRow(r: Row): Account {
  return {
    key: r.key,
    name: r.name,
    secretHash: r.secret_hash,
    secretSalt: r.secret_salt,
    legacySigningKey: r.legacy_signing_key ?? undefined,
    hmacKey: r.hmac_key ?? undefined,
    status: r.status === "stopped" ? "stopped" : "active",
    operations: new Map(Object.entries(JSON.parse(r.operations) as Record<OperationId, OperationState>)) as Map<OperationId, OperationState>,
    dailyMax: Number(r.daily_max),
    concurrency: Number(r.concurrency),
    balance: r.balance ?? undefined,
    prices: new Map(Object.entries(JSON.parse(r.prices) as Record<OperationId, string>).map(([op, micros]) => [op as OperationId, BigInt(micros)])),
    expires: r.expires,
    zone: r.zone,
    createdAt: Number(r.created_at),
  };
}

function toParams(a: Account) {
  return {
    key: a.key,
    name: a.name,
    secret_hash: a.secretHash,
    secret_salt: a.secretSalt,
    legacy_signing_key: a.legacySigningKey ?? null,
    hmac_key: a.hmacKey ?? null,
    status: a.status,
    operations: JSON.stringify(Object.fromEntries(a.operations)),
    daily_max: a.dailyMax,
    concurrency: a.concurrency,
    prices: JSON.stringify(Object.fromEntries([...a.prices].map(([op, micros]) => [op, micros.toString()]))),
    expires: a.expires,
    zone: a.zone,
    created_at: a.createdAt,
  };
}

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
    const columns = "key, name, secret_hash, secret_salt, legacy_signing_key, hmac_key, status, operations, daily_max, concurrency, prices, expires, zone, created_at";
    const values = ":key, :name, :secret_hash, :secret_salt, :legacy_signing_key, :hmac_key, :status, :operations, :daily_max, :concurrency, :prices, :expires, :zone, :created_at";
    this.insertRow = db.prepare(`INSERT INTO accounts (${columns}) VALUES (${values})`);
    const settable = columns.split(", ").filter((c) => c !== "key" && c !== "created_at");
    this.replaceRow = db.prepare(`UPDATE accounts SET ${settable.map((c) => `${c} = :${c}`).join(", ")} WHERE key = :key`);
  }

  async find(key: string): Promise<Account | undefined> {
    return this.findNow(key);
  }

  /** The account as this process knows it, reread once another process has committed. */
  private findNow(key: string): Account | undefined {
    const version = this.watch.current();
    if (version !== this.seenVersion) {
      this.cached.clear();
      this.seenVersion = version;
    }
    if (this.cached.has(key)) return this.cached.get(key);
    const row = this.byKey.get(key) as Row | undefined;
    const account = row === undefined ? undefined : fromRow(row);
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
    return (this.all.all() as unknown as Row[]).map(fromRow);
  }

  async insert(account: Account): Promise<void> {
    this.insertRow.run(toParams(account));
    this.forget(account.key);
  }

  async update(key: string, change: Partial<Omit<Account, "key" | "createdAt" | "balance">>): Promise<Account> {
    const current = this.findNow(key);
    if (current === undefined) throw new Error(`no account has the key ${key}`);
    const next = { ...current, ...change };
    const { created_at: _created, ...settable } = toParams(next);
    this.replaceRow.run(settable);
    this.forget(key);
    return next;
  }

}
