import { closeSync, copyFileSync, existsSync, fsyncSync, openSync, renameSync, rmSync, statSync } from "node:fs";
import { dirname } from "node:path";
import { DatabaseSync } from "node:sqlite";
import { migrations, schemaStep } from "./sqlite-database.ts";

/** A backup or restore that was refused before anything changed. */
export class BackupRefusedError extends Error {}

/** SQLite's or the system's own words for a failure ("unable to open database file", "database or disk is full", ENOENT). */
function why(e: unknown): string {
  const err = e as { code?: string; message?: string };
  if (err.code === "ERR_SQLITE_ERROR" && err.message) return err.message;
  return err.code ?? err.message ?? String(e);
}

/** What a store file holds, as a backup and a restore tell it. */
export interface StoreSummary {
  readonly bytes: number;
  readonly schemaStep: number;
  readonly accounts: number;
  readonly ledgerRows: number;
  readonly catalogueRecords: number;
}

/**
 * Checks a store file whole (`PRAGMA integrity_check`: every page, index
 * and constraint) and reads what it holds; throws naming the problem.
 * Opened read-only: the file is not changed.
 */
export function inspectStore(path: string): StoreSummary {
  let db: DatabaseSync;
  try {
    db = new DatabaseSync(path, { readOnly: true });
  } catch (e) {
    throw new BackupRefusedError(`${path} cannot be opened (${why(e)})`);
  }
  try {
    let problems: string[];
    try {
      problems = (db.prepare("PRAGMA integrity_check").all() as { integrity_check: string }[]).map((r) => r.integrity_check);
    } catch (e) {
      throw new BackupRefusedError(`${path} is not a gateway store (${(e as Error).message})`);
    }
    if (problems.length !== 1 || problems[0] !== "ok") throw new BackupRefusedError(`${path} fails SQLite's integrity check: ${problems.slice(0, 3).join("; ")}`);
    const step = schemaStep(db);
    const count = (table: string) => {
      try {
        return Number((db.prepare(`SELECT count(*) AS n FROM ${table}`).get() as { n: number }).n);
      } catch {
        throw new BackupRefusedError(`${path} is not a gateway store (it has no ${table} table)`);
      }
    };
    return { bytes: statSync(path).size, schemaStep: step, accounts: count("accounts"), ledgerRows: count("ledger"), catalogueRecords: count("catalogue_records") };
  } finally {
    db.close();
  }
}

/** Makes a file's bytes, and then its name in its directory, durable. */
function durable(path: string): void {
  const file = openSync(path, "r");
  try {
    fsyncSync(file);
  } finally {
    closeSync(file);
  }
  const dir = openSync(dirname(path), "r");
  try {
    fsyncSync(dir);
  } finally {
    closeSync(dir);
  }
}

/**
 * A consistent copy of the embedded store at `store`, taken while a gateway
 * serves from it: one read transaction (`VACUUM INTO`), so the copy is the
 * store as it was at one commit (every ledger row with the balance it
 * moved), and the gateway's commits go on meanwhile (WAL: a reader does not
 * hold writers). The source is opened read-only. The copy is written under
 * a temporary name, checked whole, made durable, and only then given
 * `target`, so a backup cut short never leaves a file under that name. An
 * existing `target` is refused, never overwritten.
 */
export function backupStore(store: string, target: string): StoreSummary & { readonly seconds: number } {
  if (!existsSync(store)) throw new BackupRefusedError(`there is no store at ${store} (GATEWAY_DATA_DIR)`);
  if (existsSync(target)) throw new BackupRefusedError(`${target} exists; a backup never overwrites a file: name a new one`);
  const partial = `${target}.partial-${process.pid}`;
  const started = performance.now();
  const db = new DatabaseSync(store, { readOnly: true });
  try {
    // A gateway's group commit holds the write lock for milliseconds; a read never waits on it in WAL mode,
    // but opening may meet a checkpoint's moment.
    db.exec("PRAGMA busy_timeout = 5000");
    db.prepare("VACUUM INTO ?").run(partial);
  } catch (e) {
    rmSync(partial, { force: true });
    throw new BackupRefusedError(`the backup could not be written to ${target} (${why(e)})`);
  } finally {
    db.close();
  }
  try {
    const summary = inspectStore(partial);
    durable(partial);
    renameSync(partial, target);
    durable(target);
    return { ...summary, seconds: (performance.now() - started) / 1000 };
  } catch (e) {
    rmSync(partial, { force: true });
    throw e;
  }
}

/**
 * Replaces the store at `store` by the backup `source`, which must pass the
 * integrity check and have a schema this gateway knows (a newer one is
 * refused: this gateway would run on it without the steps it lacks). The
 * caller holds the data directory's lock, so no gateway serves meanwhile.
 * The store replaced is kept beside it, whole (its WAL folded in first),
 * under a name with the time; the backup is copied in under a temporary
 * name and renamed, so a restore cut short leaves either store, never half
 * of one. A gateway started on it brings its schema up to date as on any
 * start.
 */
export function restoreStore(store: string, source: string, now: Date): StoreSummary & { readonly keptAs: string | undefined } {
  const summary = inspectStore(source);
  if (summary.schemaStep > migrations.length) {
    throw new BackupRefusedError(`${source} was written by a newer gateway (schema step ${summary.schemaStep}; this one knows ${migrations.length}): restore it with that version`);
  }
  let keptAs: string | undefined;
  if (existsSync(store)) {
    // The WAL folded into the file first, so the file kept is the whole store.
    const current = new DatabaseSync(store);
    try {
      current.exec("PRAGMA busy_timeout = 5000");
      current.exec("PRAGMA wal_checkpoint(TRUNCATE)");
    } finally {
      current.close();
    }
    keptAs = `${store}.replaced-${now.toISOString().replace(/[-:]/g, "").replace(/\.\d+Z$/, "Z")}`;
    if (existsSync(keptAs)) throw new BackupRefusedError(`${keptAs} exists; try again in a second`);
  }
  const partial = `${store}.restoring-${process.pid}`;
  try {
    copyFileSync(source, partial);
    durable(partial);
    if (keptAs !== undefined) renameSync(store, keptAs);
    for (const side of ["-wal", "-shm"]) rmSync(`${store}${side}`, { force: true });
    renameSync(partial, store);
    durable(store);
  } catch (e) {
    rmSync(partial, { force: true });
    throw e;
  }
  return { ...summary, keptAs };
}
