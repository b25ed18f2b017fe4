import type { DatabaseSync, SQLInputValue, StatementSync } from "node:sqlite";
import { Worker } from "node:worker_threads";
import { readTransaction } from "./sqlite-database.ts";

/**
 * One read-only statement of a report, with its named parameters; `bigints`: integers read as bigint; `arrays`: each
 * row an array of the statement's columns in their order, not an object (cheaper to read, and to hand over from the
 * read thread: the ledger's feed, 1.5 and 0.9 µs a row against 2.0 and 2.0-3.1 as objects).
 */
export interface SqlRead {
  readonly sql: string;
  readonly params: Record<string, SQLInputValue>;
  readonly bigints?: boolean;
  readonly arrays?: boolean;
}

/**
 * Where the embedded store runs the read-only SQL of the AdminService's
 * reports (usage totals and rows, account listings): the statements of one
 * `read` see one moment of the store (one read transaction), and their rows
 * come back in order.
 */
export interface SqlReader {
  read(queries: readonly SqlRead[]): Promise<Record<string, unknown>[][]>;
  close(): Promise<void>;
}

/** On the serving connection itself: the CLI's, a test's, and the fallback of a thread that failed. */
export class InThreadReader implements SqlReader {
  private readonly db: DatabaseSync;
  private readonly statements = new Map<string, StatementSync>();

  constructor(db: DatabaseSync) {
    this.db = db;
  }

  async read(queries: readonly SqlRead[]): Promise<Record<string, unknown>[][]> {
    return readTransaction(this.db, () =>
      queries.map((q) => {
        let st = this.statements.get(q.sql);
        if (st === undefined) {
          st = this.db.prepare(q.sql);
          this.statements.set(q.sql, st);
        }
        st.setReadBigInts(q.bigints === true);
        st.setReturnArrays(q.arrays === true);
        return st.all(q.params) as Record<string, unknown>[];
      }),
    );
  }

  async close(): Promise<void> {}
}

interface Pending {
  readonly queries: readonly SqlRead[];
  readonly resolve: (rows: Record<string, unknown>[][]) => void;
  readonly reject: (e: unknown) => void;
}

/**
 * On a thread of its own, with its own connection (read-worker.js). SQLite
 * runs a statement to its end on the thread that asks, so a report on the
 * serving connection stopped every call until it was done: a month's totals
 * over a ledger of a million rows took 3 s, by address 13 s, and no call was
 * answered meanwhile. Here the serving thread only waits for the answer.
 *
 * The thread starts at the first read and stops after `idleMs` without one,
 * so a gateway nobody asks for reports pays nothing for it. If it fails, the
 * reads go to `fallback` (the serving connection) from then on, the ones in
 * flight included, and `onFailure` is told once.
 */
export class ThreadReader implements SqlReader {
  private readonly path: string;
  private readonly fallback: SqlReader;
  private readonly onFailure: (e: unknown) => void;
  private readonly idleMs: number;
  private worker: Worker | undefined;
  private failed = false;
  private nextId = 0;
  private readonly pending = new Map<number, Pending>();
  private idle: NodeJS.Timeout | undefined;

  constructor(path: string, fallback: SqlReader, onFailure: (e: unknown) => void, idleMs = 60_000) {
    this.path = path;
    this.fallback = fallback;
    this.onFailure = onFailure;
    this.idleMs = idleMs;
  }

  /** Whether the thread is running now. */
  get running(): boolean {
    return this.worker !== undefined;
  }

  read(queries: readonly SqlRead[]): Promise<Record<string, unknown>[][]> {
    if (this.failed) return this.fallback.read(queries);
    clearTimeout(this.idle);
    let worker: Worker;
    try {
      worker = this.started();
    } catch (e) {
      this.failed = true;
      this.onFailure(e);
      return this.fallback.read(queries);
    }
    return new Promise((resolve, reject) => {
      const id = this.nextId++;
      this.pending.set(id, { queries, resolve, reject });
      // Held while it owes an answer: a CLI command awaiting a report must not exit first.
      worker.ref();
      worker.postMessage({ id, queries });
    });
  }

  async close(): Promise<void> {
    clearTimeout(this.idle);
    const worker = this.worker;
    this.worker = undefined;
    if (worker !== undefined) await worker.terminate();
    for (const p of this.pending.values()) p.reject(new Error("the store's report reader was closed"));
    this.pending.clear();
  }

  private started(): Worker {
    if (this.worker !== undefined) return this.worker;
    const worker = new Worker(new URL("./read-worker.js", import.meta.url), { workerData: { path: this.path } });
    this.worker = worker;
    worker.on("message", (m: { id: number; rows?: Record<string, unknown>[][]; error?: { message: string } }) => {
      const p = this.pending.get(m.id);
      this.pending.delete(m.id);
      if (m.error !== undefined) p?.reject(new Error(m.error.message));
      else p?.resolve(m.rows!);
      if (this.pending.size === 0 && this.worker === worker) this.rest(worker);
    });
    worker.on("error", (e) => this.fail(worker, e));
    worker.on("exit", (code) => this.fail(worker, new Error(`the report reader's thread exited (${code})`)));
    return worker;
  }

  /** Nothing owed: the thread no longer holds the process, and stops after `idleMs` without a read. */
  private rest(worker: Worker): void {
    worker.unref();
    this.idle = setTimeout(() => {
      if (this.worker !== worker || this.pending.size > 0) return;
      this.worker = undefined;
      void worker.terminate();
    }, this.idleMs);
    this.idle.unref();
  }

  private fail(worker: Worker, e: unknown): void {
    // An exit after it was stopped (idle, or closed) is not a failure.
    if (this.worker !== worker) return;
    this.worker = undefined;
    this.failed = true;
    this.onFailure(e);
    const owed = [...this.pending.values()];
    this.pending.clear();
    for (const p of owed) this.fallback.read(p.queries).then(p.resolve, p.reject);
  }
}
