import { mkdirSync } from "node:fs";
import { dirname } from "node:path";
import { DatabaseSync } from "node:sqlite";

const schema = `
CREATE TABLE IF NOT EXISTS accounts (
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
) STRICT;
`;

/**
 * Opens (and creates) the embedded store: one SQLite file under the data
 * directory, in WAL mode so the CLI can write while the server reads.
 */
export function openDatabase(path: string): DatabaseSync {
  if (path !== ":memory:") mkdirSync(dirname(path), { recursive: true });
  const db = new DatabaseSync(path);
  db.exec("PRAGMA journal_mode = WAL");
  db.exec("PRAGMA synchronous = NORMAL");
  db.exec("PRAGMA busy_timeout = 5000");
  db.exec(schema);
  return db;
}
