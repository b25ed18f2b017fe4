import type { DatabaseSync } from "node:sqlite";
import type pg from "pg";
import { bounded, bulkStatementMs, inTransaction, migrateSchema } from "./postgres-database.ts";

/** How one table went: rows read from the embedded store, rows in PostgreSQL after the copy. */
export interface CopiedTable {
  readonly table: string;
  readonly embedded: number;
  readonly postgres: number;
}

/** The copy would not be exact, or would mix with data already there. */
export class CopyRefusedError extends Error {
  override name = "CopyRefusedError";
}

interface TableCopy {
  /** Table in PostgreSQL. */
  readonly table: string;
  /** Columns written, in order, with their PostgreSQL array types. */
  readonly columns: readonly (readonly [name: string, type: string])[];
  /** The SQLite query whose columns are the values, in the same order. */
  readonly select: string;
  /** Counts the embedded rows this copy should produce. */
  readonly count: string;
  /** Totals that must come out equal on both sides: [name, SQLite expression, PostgreSQL expression]. */
  readonly sums?: readonly (readonly [name: string, embedded: string, postgres: string])[];
}

// In dependency order: balances refer to accounts.
const copies: readonly TableCopy[] = [
  {
    table: "accounts",
    columns: [
      ["key", "text"], ["name", "text"], ["secret_hash", "text"], ["secret_salt", "text"], ["legacy_signing_key", "text"], ["hmac_key", "text"],
      ["status", "text"], ["operations", "jsonb"], ["daily_max", "bigint"], ["concurrency", "integer"], ["prices", "jsonb"], ["expires", "text"],
      ["zone", "text"], ["previous_secret", "jsonb"], ["rate", "jsonb"], ["allowed_from", "jsonb"], ["alerts", "jsonb"], ["alert_secret", "text"], ["previous_alert_secret", "jsonb"],
      ["external_id", "text"], ["created_with", "text"], ["created_at", "bigint"],
    ],
    select:
      "SELECT key, name, secret_hash, secret_salt, legacy_signing_key, hmac_key, status, operations, daily_max, concurrency, prices, expires, zone, previous_secret, rate, allowed_from, alerts, alert_secret, previous_alert_secret, external_id, created_with, created_at FROM accounts",
    count: "SELECT count(*) AS n FROM accounts",
  },
  {
    table: "balances",
    columns: [["account", "text"], ["micros", "bigint"]],
    select: "SELECT account, micros FROM balances",
    count: "SELECT count(*) AS n FROM balances",
    sums: [["balance", "SELECT coalesce(sum(micros), 0) AS n FROM balances", "SELECT coalesce(sum(micros), 0) AS n FROM balances"]],
  },
  {
    // Each rated account's place under its rate, so the first calls after the move are held to it.
    table: "rate_arrivals",
    columns: [["account", "text"], ["tat", "bigint"]],
    select: "SELECT account, tat FROM rate_arrivals",
    count: "SELECT count(*) AS n FROM rate_arrivals",
  },
  {
    // The charged calls' idempotency keys, so a retry after the move is still answered again, not charged.
    table: "idempotency_keys",
    columns: [["account", "text"], ["key", "text"], ["fingerprint", "text"], ["request_id", "text"], ["at", "bigint"]],
    select: "SELECT account, key, fingerprint, request_id, at FROM idempotency_keys",
    count: "SELECT count(*) AS n FROM idempotency_keys",
  },
  {
    // With their ids: they order an account's changes. The sequence is moved past them after the copy.
    table: "balance_changes",
    columns: [["id", "bigint"], ["account", "text"], ["at", "bigint"], ["kind", "text"], ["amount", "bigint"], ["balance", "bigint"], ["actor", "text"], ["reference", "text"]],
    select: "SELECT id, account, at, kind, amount, balance, actor, reference FROM balance_changes",
    count: "SELECT count(*) AS n FROM balance_changes",
    sums: [["amount added", "SELECT coalesce(sum(amount), 0) AS n FROM balance_changes", "SELECT coalesce(sum(amount), 0) AS n FROM balance_changes"]],
  },
  {
    // With their ids, as the balance changes.
    table: "account_changes",
    columns: [["id", "bigint"], ["account", "text"], ["at", "bigint"], ["kind", "text"], ["actor", "text"], ["changes", "jsonb"]],
    select: "SELECT id, account, at, kind, actor, changes FROM account_changes",
    count: "SELECT count(*) AS n FROM account_changes",
  },
  {
    // Token hashes only: the tokens themselves were never stored.
    table: "admin_tokens",
    columns: [["name", "text"], ["token_hash", "text"], ["created_at", "bigint"], ["created_by", "text"], ["revoked_at", "bigint"], ["revoked_by", "text"]],
    select: "SELECT name, token_hash, created_at, created_by, revoked_at, revoked_by FROM admin_tokens",
    count: "SELECT count(*) AS n FROM admin_tokens",
  },
  {
    table: "maintenance",
    columns: [["operation", "text"]],
    select: "SELECT operation FROM maintenance",
    count: "SELECT count(*) AS n FROM maintenance",
  },
  {
    table: "maintenance_changes",
    columns: [["id", "bigint"], ["at", "bigint"], ["operation", "text"], ["switched_on", "boolean"], ["actor", "text"]],
    select: "SELECT id, at, operation, switched_on, actor FROM maintenance_changes",
    count: "SELECT count(*) AS n FROM maintenance_changes",
  },
  {
    // Usage alerts with their ids (a receiver may have seen `alert-<id>`), delivered or waiting; one that was claimed
    // for an attempt is free again. Before the day counts: the counts are copied with the alert triggers off, so
    // the copy itself records no alert.
    table: "alerts",
    columns: [
      ["id", "bigint"], ["account", "text"], ["kind", "text"], ["level", "bigint"], ["value", "bigint"], ["lim", "bigint"], ["day", "text"], ["at", "bigint"],
      ["attempts", "integer"], ["next_at", "bigint"], ["delivered_at", "bigint"], ["last_error", "text"],
    ],
    select: "SELECT id, account, kind, level, value, lim, day, at, attempts, next_at, delivered_at, last_error FROM alerts",
    count: "SELECT count(*) AS n FROM alerts",
  },
  {
    table: "usage_daily",
    columns: [["account", "text"], ["day", "text"], ["charged", "bigint"]],
    select: "SELECT account, day, charged FROM usage_daily",
    count: "SELECT count(*) AS n FROM usage_daily",
    sums: [["charged calls", "SELECT coalesce(sum(charged), 0) AS n FROM usage_daily", "SELECT coalesce(sum(charged), 0) AS n FROM usage_daily"]],
  },
  {
    table: "ledger",
    columns: [
      ["request_id", "text"], ["at", "bigint"], ["day", "text"], ["account", "text"], ["operation", "text"], ["error_code", "integer"],
      ["charge", "text"], ["price", "bigint"], ["cache_hit", "boolean"], ["latency_us", "bigint"], ["transport", "text"],
      ["client_ip", "text"], ["upstream_requests", "integer"],
    ],
    select: "SELECT request_id, at, day, account, operation, error_code, charge, price, cache_hit != 0, latency_us, transport, client_ip, upstream_requests FROM ledger",
    count: "SELECT count(*) AS n FROM ledger",
    sums: [
      ["ledger amount", "SELECT coalesce(sum(price), 0) AS n FROM ledger", "SELECT coalesce(sum(price), 0) AS n FROM ledger"],
      ["upstream requests", "SELECT coalesce(sum(upstream_requests), 0) AS n FROM ledger", "SELECT coalesce(sum(upstream_requests), 0) AS n FROM ledger"],
    ],
  },
  {
    table: "ledger_daily_totals",
    columns: [["day", "text"], ["account", "text"], ["operation", "text"], ["error_code", "integer"], ["charge", "text"], ["calls", "bigint"], ["amount", "bigint"], ["cache_hits", "bigint"], ["upstream_requests", "bigint"]],
    select: "SELECT day, account, operation, error_code, charge, calls, amount, cache_hits, upstream_requests FROM ledger_daily_totals",
    count: "SELECT count(*) AS n FROM ledger_daily_totals",
    sums: [["folded amount", "SELECT coalesce(sum(amount), 0) AS n FROM ledger_daily_totals", "SELECT coalesce(sum(amount), 0) AS n FROM ledger_daily_totals"]],
  },
  {
    table: "refusals",
    columns: [["day", "text"], ["operation", "text"], ["error_code", "integer"], ["charge", "text"], ["client_ip", "text"], ["transport", "text"], ["calls", "bigint"]],
    select: "SELECT day, operation, error_code, charge, client_ip, transport, calls FROM refusals",
    count: "SELECT count(*) AS n FROM refusals",
    sums: [["refused calls", "SELECT coalesce(sum(calls), 0) AS n FROM refusals", "SELECT coalesce(sum(calls), 0) AS n FROM refusals"]],
  },
  {
    table: "catalogue_records",
    columns: [["catalogue", "text"], ["kind", "text"], ["key", "text"], ["record", "bytea"], ["obtainable", "boolean"], ["stored_at", "bigint"]],
    select: "SELECT catalogue, kind, key, record, obtainable != 0, stored_at FROM catalogue_records",
    count: "SELECT count(*) AS n FROM catalogue_records",
  },
];

const batchRows = 2000;

function pgValue(v: unknown): unknown {
  if (typeof v === "bigint") return v.toString();
  if (v instanceof Uint8Array) return Buffer.from(v.buffer, v.byteOffset, v.byteLength);
  return v;
}

/**
 * Copies an embedded store into an empty PostgreSQL database, in one
 * transaction: accounts (secrets stay hashed) with the record of their
 * changes, balances with theirs, named admins (token hashes), maintenance
 * switches with theirs, the ledger with its day counts, folded totals and
 * refusals, and the catalogue. Each table's row count, and the money and call totals, are
 * compared on both sides before the commit; any difference rolls it all back.
 * Used signatures are not copied: they live in Redis in shared mode, and
 * expire within the signature window.
 */
export async function copyEmbeddedStore(db: DatabaseSync, pool: pg.Pool, onTable?: (table: string, rows: number) => void): Promise<CopiedTable[]> {
  await migrateSchema(pool);
  return inTransaction(pool, async (client) => {
    // Any row in any table the copy writes.
    const held = await client.query<{ n: string }>(bounded(bulkStatementMs, `SELECT (${copies.map((c) => `(SELECT count(*) FROM ${c.table})`).join(" + ")})::text AS n`));
    if (held.rows[0]!.n !== "0") throw new CopyRefusedError("the database already holds gateway data; copy into an empty database, so nothing is mixed or counted twice");
    // What the store already recorded is copied as it is: the rows copied are not calls that cross an alert's line
    // (the triggers come back on in this transaction, before its commit).
    await client.query("ALTER TABLE usage_daily DISABLE TRIGGER usage_alerts");
    await client.query("ALTER TABLE balances DISABLE TRIGGER balance_alerts");
    const report: CopiedTable[] = [];
    for (const copy of copies) {
      const names = copy.columns.map(([n]) => n).join(", ");
      const arrays = copy.columns.map(([, type], i) => `$${i + 1}::${type === "jsonb" ? "text" : type}[]`).join(", ");
      const casts = copy.columns.map(([n, type]) => (type === "jsonb" ? `${n}::jsonb` : n)).join(", ");
      const insert = `INSERT INTO ${copy.table} (${names}) SELECT ${casts} FROM unnest(${arrays}) AS t (${names})`;
      const read = db.prepare(copy.select);
      read.setReadBigInts(true);
      read.setReturnArrays(true);
      let columns: unknown[][] = copy.columns.map(() => []);
      let inBatch = 0;
      const flush = async () => {
        if (inBatch === 0) return;
        await client.query(bounded(bulkStatementMs, insert, columns));
        columns = copy.columns.map(() => []);
        inBatch = 0;
      };
      let rows = 0;
      for (const row of read.iterate() as Iterable<unknown[]>) {
        row.forEach((v, i) => {
          const type = copy.columns[i]![1];
          columns[i]!.push(type === "boolean" ? v === 1 || v === 1n : pgValue(v));
        });
        rows++;
        if (++inBatch >= batchRows) await flush();
      }
      await flush();
      const embedded = Number((db.prepare(copy.count).get() as { n: number | bigint }).n);
      const postgres = Number((await client.query<{ n: string }>(bounded(bulkStatementMs, `SELECT count(*)::text AS n FROM ${copy.table}`))).rows[0]!.n);
      if (embedded !== postgres || rows !== embedded) throw new CopyRefusedError(`${copy.table}: ${embedded} rows in the embedded store, ${postgres} copied; nothing was committed`);
      for (const [name, mine, theirs] of copy.sums ?? []) {
        const a = BigInt((db.prepare(mine).get() as { n: number | bigint }).n);
        const b = BigInt((await client.query<{ n: string }>(bounded(bulkStatementMs, theirs.replace(" AS n", "::text AS n")))).rows[0]!.n);
        if (a !== b) throw new CopyRefusedError(`${copy.table}: the ${name} is ${a} in the embedded store and ${b} copied; nothing was committed`);
      }
      report.push({ table: copy.table, embedded, postgres });
      onTable?.(copy.table, postgres);
    }
    await client.query("ALTER TABLE usage_daily ENABLE TRIGGER usage_alerts");
    await client.query("ALTER TABLE balances ENABLE TRIGGER balance_alerts");
    for (const table of ["balance_changes", "account_changes", "maintenance_changes", "alerts"]) {
      await client.query(bounded(bulkStatementMs, `SELECT setval(pg_get_serial_sequence('${table}', 'id'), (SELECT max(id) FROM ${table}))`));
    }
    return report;
  }, "BEGIN ISOLATION LEVEL SERIALIZABLE");
}
