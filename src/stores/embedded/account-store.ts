import type { DatabaseSync, StatementSync } from "node:sqlite";
import type { Account, AccountStore, OperationState } from "../../core/accounts.ts";
import type { OperationId } from "../../contract/operations.ts";

interface Row {
  key: string;
  name: string;
  secret_hash: string;
  secret_salt: string;
  status: string;
  operations: string;
  daily_max: number;
  expires: string;
  zone: string;
  created_at: number;
}

function fromRow(r: Row): Account {
  return {
    key: r.key,
    name: r.name,
    secretHash: r.secret_hash,
    secretSalt: r.secret_salt,
    status: r.status === "stopped" ? "stopped" : "active",
    operations: new Map(Object.entries(JSON.parse(r.operations) as Record<OperationId, OperationState>)) as Map<OperationId, OperationState>,
    dailyMax: r.daily_max,
    expires: r.expires,
    zone: r.zone,
    createdAt: r.created_at,
  };
}

function toParams(a: Account) {
  return {
    key: a.key,
    name: a.name,
    secret_hash: a.secretHash,
    secret_salt: a.secretSalt,
    status: a.status,
    operations: JSON.stringify(Object.fromEntries(a.operations)),
    daily_max: a.dailyMax,
    expires: a.expires,
    zone: a.zone,
    created_at: a.createdAt,
  };
}

/**
 * Accounts in the embedded SQLite store. Every lookup reads the table, so a
 * change made by the CLI in another process takes effect on the next call.
 */
export class SqliteAccountStore implements AccountStore {
  private readonly byKey: StatementSync;
  private readonly all: StatementSync;
  private readonly insertRow: StatementSync;
  private readonly replaceRow: StatementSync;

  constructor(db: DatabaseSync) {
    this.byKey = db.prepare("SELECT * FROM accounts WHERE key = ?");
    this.all = db.prepare("SELECT * FROM accounts ORDER BY created_at, key");
    const columns = "key, name, secret_hash, secret_salt, status, operations, daily_max, expires, zone, created_at";
    const values = ":key, :name, :secret_hash, :secret_salt, :status, :operations, :daily_max, :expires, :zone, :created_at";
    this.insertRow = db.prepare(`INSERT INTO accounts (${columns}) VALUES (${values})`);
    this.replaceRow = db.prepare(`INSERT OR REPLACE INTO accounts (${columns}) VALUES (${values})`);
  }

  find(key: string): Account | undefined {
    const row = this.byKey.get(key) as Row | undefined;
    return row === undefined ? undefined : fromRow(row);
  }

  list(): Account[] {
    return (this.all.all() as unknown as Row[]).map(fromRow);
  }

  insert(account: Account): void {
    this.insertRow.run(toParams(account));
  }

  update(key: string, change: Partial<Omit<Account, "key" | "createdAt">>): Account {
    const current = this.find(key);
    if (current === undefined) throw new Error(`no account has the key ${key}`);
    const next = { ...current, ...change };
    this.replaceRow.run(toParams(next));
    return next;
  }
}
