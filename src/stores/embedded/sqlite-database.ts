import { mkdirSync } from "node:fs";
import { dirname } from "node:path";
import { DatabaseSync } from "node:sqlite";

/**
 * The schema, as the steps that build it: a store at version n runs steps
 * n+1… on open, each in its own transaction, so a data directory made by an
 * older gateway is brought up to date in place.
 */
const migrations: readonly string[] = [
  // 1: accounts, daily usage, the embedded catalogue.
  `CREATE TABLE IF NOT EXISTS accounts (
    key TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    secret_hash TEXT NOT NULL,
    secret_salt TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('active', 'stopped')),
    operations TEXT NOT NULL,
    daily_max INTEGER NOT NULL,
    expires TEXT NOT NULL,
    zone TEXT NOT NULL,
    created_at INTEGER NOT NULL
  ) STRICT;
  CREATE TABLE IF NOT EXISTS usage_daily (
    account TEXT NOT NULL,
    day TEXT NOT NULL,
    charged INTEGER NOT NULL,
    PRIMARY KEY (account, day)
  ) STRICT, WITHOUT ROWID;
  CREATE TABLE IF NOT EXISTS retail_items (
    num_iid TEXT PRIMARY KEY,
    detail BLOB NOT NULL,
    obtainable INTEGER NOT NULL,
    stored_at INTEGER NOT NULL
  ) STRICT;
  CREATE TABLE IF NOT EXISTS wholesale_peers (
    num_iid TEXT NOT NULL,
    sid TEXT NOT NULL,
    items BLOB NOT NULL,
    stored_at INTEGER NOT NULL,
    PRIMARY KEY (num_iid, sid)
  ) STRICT;`,
  // 2: plans (concurrency, prepaid balance, prices), the usage ledger, maintenance switches.
  `ALTER TABLE accounts ADD COLUMN concurrency INTEGER NOT NULL DEFAULT 20;
  ALTER TABLE accounts ADD COLUMN balance INTEGER;
  ALTER TABLE accounts ADD COLUMN prices TEXT NOT NULL DEFAULT '{}';
  CREATE TABLE ledger (
    request_id TEXT PRIMARY KEY,
    at INTEGER NOT NULL,
    day TEXT NOT NULL,
    account TEXT,
    operation TEXT,
    error_code INTEGER NOT NULL,
    charge TEXT NOT NULL CHECK (charge IN ('charged', 'uncharged', 'ignored')),
    price INTEGER NOT NULL,
    cache_hit INTEGER NOT NULL,
    latency_us INTEGER NOT NULL,
    transport TEXT NOT NULL
  ) STRICT;
  CREATE INDEX ledger_by_account_day ON ledger (account, day);
  CREATE INDEX ledger_by_day ON ledger (day);
  CREATE TABLE maintenance (operation TEXT PRIMARY KEY) STRICT, WITHOUT ROWID;`,
  // 3: what signed calls need, derived from the secret (never the secret itself).
  `ALTER TABLE accounts ADD COLUMN legacy_signing_key TEXT;
  ALTER TABLE accounts ADD COLUMN hmac_key TEXT;`,
];

/**
 * Opens (and creates or upgrades) the embedded store: one SQLite file under
 * the data directory, in WAL mode so the CLI can write while the server
 * reads. With WAL, a committed transaction survives the process being
 * killed; synchronous=NORMAL trades only power-loss durability for speed.
 */
export function openDatabase(path: string): DatabaseSync {
  if (path !== ":memory:") mkdirSync(dirname(path), { recursive: true });
  const db = new DatabaseSync(path);
  db.exec("PRAGMA journal_mode = WAL");
  db.exec("PRAGMA synchronous = NORMAL");
  db.exec("PRAGMA busy_timeout = 5000");
  const userVersion = () => Number((db.prepare("PRAGMA user_version").get() as { user_version: number }).user_version);
  while (userVersion() < migrations.length) {
    // The version is read again inside the write lock: the server and the CLI may open the store at once.
    db.exec("BEGIN IMMEDIATE");
    try {
      const v = userVersion();
      // A store from before versioning already has step 1's tables; IF NOT EXISTS covers it.
      if (v < migrations.length) {
        db.exec(migrations[v]!);
        db.exec(`PRAGMA user_version = ${v + 1}`);
      }
      db.exec("COMMIT");
    } catch (e) {
      db.exec("ROLLBACK");
      throw e;
    }
  }
  return db;
}
