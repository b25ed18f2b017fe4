import { mkdirSync } from "node:fs";
import { dirname } from "node:path";
import { DatabaseSync } from "node:sqlite";

/**
 * The schema, as the steps that build it: a store at version n runs steps
 * n+1… on open, each in its own transaction, so a data directory made by an
 * older gateway is brought up to date in place.
 */
export const migrations: readonly string[] = [
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
  // 4: calls with no account counted rather than stored; per-day totals of rows past retention; used signatures.
  `CREATE TABLE refusals (
    day TEXT NOT NULL,
    operation TEXT NOT NULL,
    error_code INTEGER NOT NULL,
    charge TEXT NOT NULL,
    client_ip TEXT NOT NULL,
    transport TEXT NOT NULL,
    calls INTEGER NOT NULL,
    PRIMARY KEY (day, operation, error_code, client_ip, transport)
  ) STRICT, WITHOUT ROWID;
  CREATE TABLE ledger_daily_totals (
    day TEXT NOT NULL,
    account TEXT NOT NULL,
    operation TEXT NOT NULL,
    error_code INTEGER NOT NULL,
    charge TEXT NOT NULL,
    calls INTEGER NOT NULL,
    amount INTEGER NOT NULL,
    PRIMARY KEY (day, account, operation, error_code, charge)
  ) STRICT, WITHOUT ROWID;
  CREATE TABLE used_signatures (id TEXT PRIMARY KEY, until INTEGER NOT NULL) STRICT, WITHOUT ROWID;`,
  // 5: one catalogue table for every record kind an operation reads, keyed by catalogue, kind and the
  // operation's record key; the two tables of step 1 move into it (their rows as the record kinds they were).
  `CREATE TABLE catalogue_records (
    catalogue TEXT NOT NULL,
    kind TEXT NOT NULL,
    key TEXT NOT NULL,
    record BLOB NOT NULL,
    obtainable INTEGER NOT NULL,
    stored_at INTEGER NOT NULL,
    PRIMARY KEY (catalogue, kind, key)
  ) STRICT;
  INSERT INTO catalogue_records SELECT 'retail', 'item_detail', num_iid, detail, obtainable, stored_at FROM retail_items;
  INSERT INTO catalogue_records SELECT 'wholesale', 'peer_viewed', num_iid || '/' || sid, items, 1, stored_at FROM wholesale_peers;
  DROP TABLE retail_items;
  DROP TABLE wholesale_peers;`,
  // 6: the balance is the meter's (charged calls deduct from it in the ledger's commit, top-ups add to
  // it), so it moves out of the accounts table into one of its own, as in the shared store's schema.
  `CREATE TABLE balances (account TEXT PRIMARY KEY, micros INTEGER NOT NULL CHECK (micros >= 0)) STRICT, WITHOUT ROWID;
  INSERT INTO balances SELECT key, balance FROM accounts WHERE balance IS NOT NULL;
  ALTER TABLE accounts DROP COLUMN balance;`,
  // 7: how many of a day's folded calls were answered from the cache, so usage keeps its cache-hit share past retention.
  `ALTER TABLE ledger_daily_totals ADD COLUMN cache_hits INTEGER NOT NULL DEFAULT 0;`,
  // 8: every change of a balance that is not a call's price (an opening balance, a top-up), with the
  // balance it left, written in the transaction that makes it. A balance held before this step is
  // recorded as carried over, at the time of the upgrade.
  `CREATE TABLE balance_changes (
    id INTEGER PRIMARY KEY,
    account TEXT NOT NULL,
    at INTEGER NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('opening', 'top-up', 'carried', 'unbilled')),
    amount INTEGER NOT NULL,
    balance INTEGER
  ) STRICT;
  CREATE INDEX balance_changes_by_account ON balance_changes (account, id);
  INSERT INTO balance_changes (account, at, kind, amount, balance)
    SELECT account, CAST(unixepoch('subsec') * 1000 AS INTEGER), 'carried', micros, micros FROM balances ORDER BY account;`,
  // 9: a replaced secret still accepted for a while after a rotation (JSON: its hash, salt, signing keys and until when).
  `ALTER TABLE accounts ADD COLUMN previous_secret TEXT;`,
  // 10: each change of an account's settings, with who made it and what it moved (JSON: [field, before, after]
  // triples), written in the transaction that makes it; and who made each balance change (none for older rows).
  `CREATE TABLE account_changes (
    id INTEGER PRIMARY KEY,
    account TEXT NOT NULL,
    at INTEGER NOT NULL,
    kind TEXT NOT NULL,
    actor TEXT NOT NULL,
    changes TEXT NOT NULL
  ) STRICT;
  CREATE INDEX account_changes_by_account ON account_changes (account, id);
  ALTER TABLE balance_changes ADD COLUMN actor TEXT;`,
  // 11: named admins, each with a token of its own (only its SHA-256 is kept); a revoked one stays, so a
  // name in a history always means the same holder.
  `CREATE TABLE admin_tokens (
    name TEXT PRIMARY KEY,
    token_hash TEXT NOT NULL UNIQUE,
    created_at INTEGER NOT NULL,
    created_by TEXT NOT NULL,
    revoked_at INTEGER,
    revoked_by TEXT
  ) STRICT;`,
  // 12: each switch of an operation into or out of maintenance, with who made it, written in its transaction.
  `CREATE TABLE maintenance_changes (
    id INTEGER PRIMARY KEY,
    at INTEGER NOT NULL,
    operation TEXT NOT NULL,
    switched_on INTEGER NOT NULL,
    actor TEXT NOT NULL
  ) STRICT;`,
  // 13: an account's rate limit (JSON: calls, seconds, burst), or none.
  `ALTER TABLE accounts ADD COLUMN rate TEXT;`,
  // 14: accounts in the order ListAccounts pages them (made, then key), so a page is read from where the last ended.
  `CREATE INDEX accounts_in_order ON accounts (created_at, key);`,
  // 15: the addresses and networks an account's key works from (JSON list), or anywhere.
  `ALTER TABLE accounts ADD COLUMN allowed_from TEXT;`,
  // 16: the address each call came from (as its status block's client_ip), so a team can see where its key
  // was used; none for the rows written before.
  `ALTER TABLE ledger ADD COLUMN client_ip TEXT;`,
  // 17: each rated account's theoretical arrival time (ns, src/core/call-rate.ts), written with the ledger rows of
  // its calls, so a restart does not hand every account a fresh burst (the shared store's is PostgreSQL step 11).
  `CREATE TABLE rate_arrivals (account TEXT PRIMARY KEY, tat INTEGER NOT NULL);`,
  // 18: the idempotency key of each charged call that sent one (src/core/idempotency.ts), written with its ledger
  // row and kept a day: a retry with the same key is answered again, not charged (the shared store's is PostgreSQL step 16).
  `CREATE TABLE idempotency_keys (
    account TEXT NOT NULL,
    key TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    request_id TEXT NOT NULL,
    at INTEGER NOT NULL,
    PRIMARY KEY (account, key)
  ) STRICT, WITHOUT ROWID;
  CREATE INDEX idempotency_keys_at ON idempotency_keys (at);`,
  // 19: the payment a top-up is for, where its maker named one: a second top-up of the account with the same
  // reference adds nothing (the shared store's is PostgreSQL step 17).
  `ALTER TABLE balance_changes ADD COLUMN reference TEXT;
  CREATE UNIQUE INDEX balance_changes_reference ON balance_changes (account, reference) WHERE reference IS NOT NULL;`,
  // 20: usage alerts (src/core/alerts.ts): where and when an account is told (JSON: url, usage percents, balance
  // floor) and what they are signed with; each alert to tell, recorded by a trigger in the transaction that moves
  // the day's count or the balance across a line, so each crossing is recorded once and only for committed calls
  // (a usage share once a day, a key's expiry once per last day); delivered, retried or given up from there (the
  // shared store's is PostgreSQL step 18).
  // Each trigger's WHEN asks first whether the account has alerts at all: for an account without them, a commit's
  // count and balance cost about 5 µs more with the triggers' bodies run, about 3 with the WHEN (a commit, not a call).
  `ALTER TABLE accounts ADD COLUMN alerts TEXT;
  ALTER TABLE accounts ADD COLUMN alert_secret TEXT;
  CREATE TABLE alerts (
    id INTEGER PRIMARY KEY,
    account TEXT NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('usage', 'balance', 'expiry')),
    level INTEGER NOT NULL,
    value INTEGER NOT NULL,
    lim INTEGER NOT NULL,
    day TEXT NOT NULL,
    at INTEGER NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    next_at INTEGER,
    claimed_until INTEGER NOT NULL DEFAULT 0,
    delivered_at INTEGER,
    last_error TEXT NOT NULL DEFAULT ''
  ) STRICT;
  CREATE UNIQUE INDEX alerts_once ON alerts (account, day, level) WHERE kind <> 'balance';
  CREATE INDEX alerts_due ON alerts (next_at) WHERE next_at IS NOT NULL;
  CREATE INDEX alerts_by_account ON alerts (account, id);
  CREATE TRIGGER usage_alerts_on_insert AFTER INSERT ON usage_daily
  WHEN (SELECT alerts FROM accounts WHERE key = new.account) IS NOT NULL BEGIN
    INSERT OR IGNORE INTO alerts (account, kind, level, value, lim, day, at, next_at)
      SELECT new.account, 'usage', p.value, new.charged, a.daily_max, new.day, t.now, t.now
      FROM accounts a, json_each(a.alerts, '$.usage') p, (SELECT CAST(unixepoch('subsec') * 1000 AS INTEGER) AS now) t
      WHERE a.key = new.account AND a.alerts IS NOT NULL
        AND (a.daily_max * p.value + 99) / 100 > 0 AND new.charged >= (a.daily_max * p.value + 99) / 100;
  END;
  CREATE TRIGGER usage_alerts_on_update AFTER UPDATE OF charged ON usage_daily
  WHEN new.charged > old.charged AND (SELECT alerts FROM accounts WHERE key = new.account) IS NOT NULL BEGIN
    INSERT OR IGNORE INTO alerts (account, kind, level, value, lim, day, at, next_at)
      SELECT new.account, 'usage', p.value, new.charged, a.daily_max, new.day, t.now, t.now
      FROM accounts a, json_each(a.alerts, '$.usage') p, (SELECT CAST(unixepoch('subsec') * 1000 AS INTEGER) AS now) t
      WHERE a.key = new.account AND a.alerts IS NOT NULL
        AND (a.daily_max * p.value + 99) / 100 > old.charged AND new.charged >= (a.daily_max * p.value + 99) / 100;
  END;
  CREATE TRIGGER balance_alerts AFTER UPDATE OF micros ON balances
  WHEN new.micros < old.micros AND (SELECT alerts FROM accounts WHERE key = new.account) IS NOT NULL BEGIN
    INSERT INTO alerts (account, kind, level, value, lim, day, at, next_at)
      SELECT new.account, 'balance', f.below, new.micros, 0, date(t.now / 1000, 'unixepoch'), t.now, t.now
      FROM (SELECT CAST(json_extract(alerts, '$.below') AS INTEGER) AS below FROM accounts WHERE key = new.account AND alerts IS NOT NULL) f,
        (SELECT CAST(unixepoch('subsec') * 1000 AS INTEGER) AS now) t
      WHERE f.below IS NOT NULL AND old.micros >= f.below AND new.micros < f.below;
  END;`,
  // 21: the operator's own id for an account (a customer in its billing system), unique where given, and a digest
  // of what the request that made it asked for: a creation sent again with the id is answered with the account it
  // made, not a second one (src/core/account-admin.ts; the shared store's is PostgreSQL step 19).
  `ALTER TABLE accounts ADD COLUMN external_id TEXT;
  ALTER TABLE accounts ADD COLUMN created_with TEXT;
  CREATE UNIQUE INDEX accounts_external_id ON accounts (external_id) WHERE external_id IS NOT NULL;`,
  // 22: the alert secret a new one replaced, still signed with until a time (JSON: secret, until), so a receiver
  // can move to the new one with no moment where its check fails (the shared store's is PostgreSQL step 20).
  `ALTER TABLE accounts ADD COLUMN previous_alert_secret TEXT;`,
  // 23: the ledger's indexes in the order calls are listed page by page (by day, then time; core/meter.ts
  // LedgerPlace), so each page reads on from where the one before ended instead of sorting the whole range again
  // (the shared store's is PostgreSQL step 21). The request id that breaks a tie is left out: with it each index
  // entry is 18 bytes wider, and a group commit of 64 rows took 45-48 µs a row against 38-40 (with the time alone,
  // 40-42). Rebuilding them reads the ledger once, at the upgrade's start.
  `DROP INDEX ledger_by_account_day;
  CREATE INDEX ledger_by_account_day ON ledger (account, day, at);
  DROP INDEX ledger_by_day;
  CREATE INDEX ledger_by_day ON ledger (day, at);`,
  // 24: the ledger in commit order (core/usage-pages.ts followCalls): by rowid, SQLite's own numbering of the rows
  // (retention keeps the newest row, so it never starts again), and `folded_through`, the highest rowid retention
  // has folded, so a follower's cursor before it is refused instead of passed over rows that are gone. No index and
  // nothing more in a commit: the rowid is the table's own order.
  `CREATE TABLE ledger_feed (id INTEGER PRIMARY KEY CHECK (id = 1), folded_through INTEGER NOT NULL) STRICT;
  INSERT INTO ledger_feed (id, folded_through) VALUES (1, 0);`,
  // 25: the requests each call sent to a paid upstream provider (core/meter.ts LedgerRow.upstreamRequests), and their
  // sum in the totals retention folds; rows written before read 0.
  `ALTER TABLE ledger ADD COLUMN upstream_requests INTEGER NOT NULL DEFAULT 0;
  ALTER TABLE ledger_daily_totals ADD COLUMN upstream_requests INTEGER NOT NULL DEFAULT 0;`,
  // 26: the key QueryUsage's page tokens carry their sums under (core/usage-pages.ts), kept in the store so a token
  // outlives a restart (the shared store's step 25 shares it between replicas). SQLite's randomblob() draws from
  // its generator seeded with the system's randomness.
  `CREATE TABLE page_keys (name TEXT PRIMARY KEY, key BLOB NOT NULL CHECK (length(key) = 32)) STRICT;
  INSERT INTO page_keys (name, key) VALUES ('usage-sums', randomblob(32));`,
  // 27: the waits upstream providers asked for (their Retry-After), each until it ends on the store's clock, so a
  // gateway started again during one sends the provider nothing before it is over (provider-waits.ts). The shared
  // mode keeps them in Redis.
  `CREATE TABLE provider_waits (catalogue TEXT PRIMARY KEY, until INTEGER NOT NULL) STRICT, WITHOUT ROWID;`,
];

/**
 * Runs `work` in one write transaction (BEGIN IMMEDIATE: the write lock is
 * taken first, so what `work` reads no other connection changes before the
 * commit) and returns what it returns; anything thrown rolls it back and is
 * thrown on. The transaction is never left open.
 */
export function writeTransaction<T>(db: DatabaseSync, work: () => T): T {
  return transaction(db, "BEGIN IMMEDIATE", work);
}

/** Runs `work`'s reads in one transaction, so they all see the store as one moment left it, whatever another connection commits meanwhile. */
export function readTransaction<T>(db: DatabaseSync, work: () => T): T {
  return transaction(db, "BEGIN", work);
}

function transaction<T>(db: DatabaseSync, begin: string, work: () => T): T {
  db.exec(begin);
  try {
    const result = work();
    db.exec("COMMIT");
    return result;
  } catch (e) {
    // SQLite may already have rolled back (a full disk does): only an open transaction is rolled back.
    try {
      if (db.isTransaction) db.exec("ROLLBACK");
    } catch {
      // the connection is in trouble; the next transaction will say so
    }
    throw e;
  }
}

/**
 * A connection checkpoints the WAL after a commit that leaves it this many
 * pages long (SQLite's default: 1,000). That checkpoint runs inside the
 * commit, on the thread that serves calls, so every call in flight waits for
 * it: at 1,000 pages a ledger group commit that checkpointed took 10-16 ms
 * on a machine where each page's copy is a read and a write system call of
 * a few µs, and those stalls made the legacy hits' p99 at 64 connections.
 * At 250 pages each takes a quarter as long (3.5-6.5 ms in one process),
 * and calls over 10 ms fell from 1.8% to 0.09%, for a mean commit 9-17%
 * longer and, as a checkpoint's flush now and then meets a slow disk four
 * times as often, rare commits of 50-100 ms (docs/performance-history.md).
 */
export const walCheckpointPages = 250;

export interface DatabaseOptions {
  /** Largest size the file may grow to, in bytes (0: no cap). Past it every write fails as on a full disk. */
  readonly maxBytes?: number;
}

/**
 * Opens (and creates or upgrades) the embedded store: one SQLite file under
 * the data directory, in WAL mode so the CLI can write while the server
 * reads. With WAL, a committed transaction survives the process being
 * killed; synchronous=NORMAL trades only power-loss durability for speed.
 */
/** The schema step a store is at (`PRAGMA user_version`): how many of `migrations` it has had. */
export function schemaStep(db: DatabaseSync): number {
  return Number((db.prepare("PRAGMA user_version").get() as { user_version: number }).user_version);
}

export function openDatabase(path: string, options: DatabaseOptions = {}): DatabaseSync {
  if (path !== ":memory:") mkdirSync(dirname(path), { recursive: true });
  const db = new DatabaseSync(path);
  db.exec("PRAGMA journal_mode = WAL");
  db.exec("PRAGMA synchronous = NORMAL");
  db.exec("PRAGMA busy_timeout = 5000");
  db.exec(`PRAGMA wal_autocheckpoint = ${walCheckpointPages}`);
  while (schemaStep(db) < migrations.length) {
    // The version is read again inside the write lock: the server and the CLI may open the store at once.
    db.exec("BEGIN IMMEDIATE");
    try {
      const v = schemaStep(db);
      // A store from before versioning already has step 1's tables; IF NOT EXISTS covers it.
      if (v < migrations.length) {
        db.exec(migrations[v]!);
        db.exec(`PRAGMA user_version = ${v + 1}`);
      }
      db.exec("COMMIT");
    } catch (e) {
      if (db.isTransaction) db.exec("ROLLBACK");
      throw e;
    }
  }
  if (options.maxBytes !== undefined && options.maxBytes > 0) {
    const pageSize = Number((db.prepare("PRAGMA page_size").get() as { page_size: number }).page_size);
    // SQLite keeps the cap at no less than the file's current size.
    db.exec(`PRAGMA max_page_count = ${Math.max(1, Math.floor(options.maxBytes / pageSize))}`);
  }
  return db;
}
