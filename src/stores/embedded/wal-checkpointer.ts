import { statSync } from "node:fs";
import type { DatabaseSync } from "node:sqlite";
import { Worker } from "node:worker_threads";

/** SQLite's own default: a connection checkpoints after a commit that leaves the WAL this many pages long. */
const autoCheckpointPages = 1000;

/** The WAL is let grow to about this many bytes before the writer waits for the checkpointer to catch up. */
export const defaultWalLimitBytes = 64 << 20;

/**
 * A serving gateway asks for a checkpoint every this many ledger commits:
 * about 500 pages of WAL at the 8 or so pages a group commit of 45 rows
 * writes (SQLite's own threshold is 1,000 pages). A checkpoint after every
 * commit had the thread copying and syncing without pause, and cost the
 * serving thread more than it saved.
 */
export const servingCommitsPerCheckpoint = 64;

/**
 * A serving gateway's WAL limit. The WAL starts again from its beginning
 * only at a commit that finds it wholly checkpointed, so once past its limit
 * the writer stands still for one checkpoint that covers its last commit
 * (its fsyncs: 12-17 ms here). At SQLite's own 4 MiB that pause came as
 * often as the automatic checkpoint's did, and the p99 of a group commit's
 * wait stayed at 11-13 ms; at 16 MiB the p99 was 0.9-1.7 ms and the p999
 * 13-16 ms; at 64 MiB, 0.6-1.2 ms and 1.7-4 ms (a pause every few seconds
 * under the bench's load; README, Performance).
 */
export const servingWalLimitBytes = defaultWalLimitBytes;

/** The cells of memory the writer and the checkpointer thread share (Int32 each). */
export const slot = {
  /** Commits the writer has announced. */
  commits: 0,
  /** The count of commits the last finished checkpoint began after. */
  covered: 1,
  state: 2,
} as const;
export const state = { running: 0, stopping: 1, gone: 2 } as const;

/**
 * Checkpoints on a thread of their own, for a long run of writes: an import,
 * and a serving gateway's ledger. SQLite's automatic checkpoint runs inside
 * the commit that crosses the WAL's threshold: an import's writing thread
 * spent about half its time copying pages into the database file and
 * waiting for fsync, and a serving gateway stopped every call for one
 * commit in a hundred, for 12 ms at its p99. Here the writer turns that
 * off and announces its commits (`written()`, a checkpoint asked for every
 * `commitsPerCheckpoint` of them); the checkpointer thread runs a passive
 * checkpoint whenever commits were announced since its last one began,
 * copying what is committed while the writer goes on. They share a few cells
 * of memory, so this works whether or not the writer's event loop turns.
 *
 * When the WAL passes its limit, the writer waits (without blocking its
 * event loop) for a checkpoint that began after its last commit: the WAL is
 * then wholly in the database file, and SQLite starts it again from its
 * beginning at the next write, so it never grows much past the limit.
 *
 * Durability is SQLite's own: a passive checkpoint copies only committed
 * frames and syncs the WAL before and the database after, as the automatic
 * one does. If the checkpointer thread fails, the writer goes back to
 * checkpointing itself. `close()` catches up, truncates the WAL and restores
 * the writer's automatic checkpoint.
 */
export class WalCheckpointer {
  private readonly db: DatabaseSync;
  private readonly worker: Worker;
  private readonly cells = new Int32Array(new SharedArrayBuffer(3 * 4));
  private readonly walPath: string;
  private readonly limitBytes: number;
  /** The writer's own `journal_size_limit`, given back at the end. */
  private readonly journalSizeLimit: number;
  private stopped = false;
  /** A checkpoint is asked for every this many commits (and whenever the WAL is past its limit). */
  private readonly commitsPerCheckpoint: number;
  private unannounced = 0;

  private constructor(db: DatabaseSync, path: string, walLimitBytes: number, commitsPerCheckpoint: number) {
    this.db = db;
    this.commitsPerCheckpoint = commitsPerCheckpoint;
    this.walPath = `${path}-wal`;
    this.limitBytes = walLimitBytes;
    this.journalSizeLimit = Number((db.prepare("PRAGMA journal_size_limit").get() as { journal_size_limit: number }).journal_size_limit);
    this.worker = new Worker(new URL("./checkpoint-worker.js", import.meta.url), { workerData: { path, shared: this.cells.buffer, slot, state } });
    const gone = () => {
      Atomics.store(this.cells, slot.state, state.gone);
      Atomics.notify(this.cells, slot.covered);
      this.stop();
    };
    this.worker.on("error", gone);
    this.worker.on("exit", gone);
    db.exec("PRAGMA wal_autocheckpoint = 0");
    // SQLite cuts the WAL file back to this size when it starts the WAL again, so from then on the file
    // is longer than the limit only when what is in it is.
    db.exec(`PRAGMA journal_size_limit = ${walLimitBytes}`);
  }

  /** A checkpointer for the writer `db`, a checkpoint asked for every `commitsPerCheckpoint` commits; undefined for a store without a WAL (in memory). */
  static start(db: DatabaseSync, walLimitBytes = defaultWalLimitBytes, commitsPerCheckpoint = 1): WalCheckpointer | undefined {
    const path = db.location();
    if (path === null || path === "") return undefined;
    const mode = (db.prepare("PRAGMA journal_mode").get() as { journal_mode: string }).journal_mode;
    return mode.toLowerCase() === "wal" ? new WalCheckpointer(db, path, walLimitBytes, commitsPerCheckpoint) : undefined;
  }

  /**
   * Call after each commit: asks for a checkpoint every `commitsPerCheckpoint`
   * commits and, when the WAL is past its limit, answers a promise of a
   * checkpoint that covers this commit, for which the writer should wait
   * before its next commit (then the WAL starts again from its beginning).
   * A commit announced before the thread is up is checkpointed once it is.
   */
  written(): Promise<void> | undefined {
    if (this.stopped) return undefined;
    const over = (statSync(this.walPath, { throwIfNoEntry: false })?.size ?? 0) > this.limitBytes;
    if (++this.unannounced < this.commitsPerCheckpoint && !over) return undefined;
    const commits = this.announce();
    return over ? this.caughtUp(commits) : undefined;
  }

  /** Tells the thread of the commits not yet announced; returns how many it has been told of. */
  private announce(): number {
    this.unannounced = 0;
    const commits = Atomics.add(this.cells, slot.commits, 1) + 1;
    Atomics.notify(this.cells, slot.commits);
    return commits;
  }

  /** Resolves once a checkpoint that began after commit `commits` has ended (or the checkpointer is gone). */
  private async caughtUp(commits: number): Promise<void> {
    for (;;) {
      const covered = Atomics.load(this.cells, slot.covered);
      if (covered >= commits || Atomics.load(this.cells, slot.state) !== state.running) return;
      const wait = Atomics.waitAsync(this.cells, slot.covered, covered);
      if (wait.async) await wait.value;
    }
  }

  /** Stops the checkpointer (done, or gone wrong): the writer checkpoints itself again. */
  private stop(): void {
    if (this.stopped) return;
    this.stopped = true;
    if (this.db.isOpen) {
      this.db.exec(`PRAGMA wal_autocheckpoint = ${autoCheckpointPages}`);
      this.db.exec(`PRAGMA journal_size_limit = ${this.journalSizeLimit}`);
    }
    if (Atomics.compareExchange(this.cells, slot.state, state.running, state.stopping) === state.running) {
      Atomics.add(this.cells, slot.commits, 1);
      Atomics.notify(this.cells, slot.commits);
    }
  }

  /** Catches up, lets the thread end, truncates the WAL (if no reader holds it) and hands checkpoints back to the writer. */
  async close(): Promise<void> {
    if (!this.stopped) await this.caughtUp(this.unannounced > 0 ? this.announce() : Atomics.load(this.cells, slot.commits));
    // Checked again: the thread may have gone while this waited, and then its exit is past.
    if (!this.stopped) {
      const ended = new Promise((resolve) => this.worker.once("exit", resolve));
      this.stop();
      await ended;
    }
    if (this.db.isOpen) this.db.exec("PRAGMA wal_checkpoint(TRUNCATE)");
  }
}
