import { statSync } from "node:fs";
import type { DatabaseSync } from "node:sqlite";
import { Worker } from "node:worker_threads";
import { walCheckpointPages } from "./sqlite-database.ts";

/** The WAL is let grow to about this many bytes before the writer waits for the checkpointer to catch up. */
export const defaultWalLimitBytes = 64 << 20;

/**
 * Beside a serving connection, the thread is asked for a checkpoint every
 * this many commits: each checkpoint syncs the WAL and the database file, so
 * one per commit would be hundreds of fsyncs a second under load.
 */
export const assistEveryCommits = 8;

/**
 * …and stands aside while the WAL holds this many frames: from there the
 * serving connection's own checkpoint is near, and must not meet one here.
 */
export const assistPauseAtFrames = Math.floor((walCheckpointPages * 3) / 4);

/** The cells of memory the writer and the checkpointer thread share (Int32 each). */
export const slot = {
  /** Commits the writer has announced. */
  commits: 0,
  /** The count of commits the last finished checkpoint began after. */
  covered: 1,
  state: 2,
  /** The count of commits the thread has looked at (checkpointed after, or stood aside for). */
  looked: 3,
} as const;
export const state = { running: 0, stopping: 1, gone: 2 } as const;

/**
 * Checkpoints on a thread of their own, for a long run of writes (an import).
 * SQLite's automatic checkpoint runs inside the commit that crosses the WAL's
 * threshold, so the writing thread spent about half its time copying pages
 * into the database file and waiting for fsync. Here the writer turns that
 * off and announces each commit (`written()`); the checkpointer thread runs a
 * passive checkpoint whenever commits came in since its last one began,
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
 *
 * Beside a serving connection (`assist`), the thread only helps: the
 * writer keeps its own automatic checkpoint, announces every
 * `assistEveryCommits`-th commit, and never waits. See `assist`.
 */
export class WalCheckpointer {
  private readonly db: DatabaseSync;
  /** Beside a serving connection: the writer's pragmas are left alone and nothing waits (see `assist`). */
  private readonly assisting: boolean;
  private commitsSinceAnnounced = 0;
  private readonly worker: Worker;
  private readonly cells = new Int32Array(new SharedArrayBuffer(4 * 4));
  private readonly walPath: string;
  private readonly limitBytes: number;
  /** The writer's own `journal_size_limit`, given back at the end. */
  private readonly journalSizeLimit: number;
  private stopped = false;

  private constructor(db: DatabaseSync, path: string, walLimitBytes: number | "assist", onFailed?: (error: unknown) => void) {
    this.db = db;
    this.walPath = `${path}-wal`;
    this.assisting = walLimitBytes === "assist";
    this.limitBytes = walLimitBytes === "assist" ? Infinity : walLimitBytes;
    this.journalSizeLimit = Number((db.prepare("PRAGMA journal_size_limit").get() as { journal_size_limit: number }).journal_size_limit);
    const pauseAtFrames = this.assisting ? assistPauseAtFrames : undefined;
    this.worker = new Worker(new URL("./checkpoint-worker.js", import.meta.url), { workerData: { path, shared: this.cells.buffer, slot, state, pauseAtFrames } });
    const gone = () => {
      Atomics.store(this.cells, slot.state, state.gone);
      Atomics.notify(this.cells, slot.covered);
      Atomics.notify(this.cells, slot.looked);
      this.stop();
    };
    // Told once, of a thread that ends before it is stopped (an error, or an exit of its own).
    const failed = (error: unknown) => {
      if (!this.stopped) onFailed?.(error);
      gone();
    };
    this.worker.on("error", failed);
    this.worker.on("exit", (code) => failed(new Error(`the checkpoint thread exited with code ${code}`)));
    if (this.assisting) return;
    db.exec("PRAGMA wal_autocheckpoint = 0");
    // SQLite cuts the WAL file back to this size when it starts the WAL again, so from then on the file
    // is longer than the limit only when what is in it is.
    db.exec(`PRAGMA journal_size_limit = ${walLimitBytes}`);
  }

  /** A checkpointer for the writer `db`; undefined for a store without a WAL (in memory). */
  static start(db: DatabaseSync, walLimitBytes = defaultWalLimitBytes): WalCheckpointer | undefined {
    const path = walStore(db);
    return path === undefined ? undefined : new WalCheckpointer(db, path, walLimitBytes);
  }

  /**
   * A thread that copies the serving connection's committed pages into the
   * database file between its own checkpoints. The serving connection keeps
   * its automatic checkpoint (every `walCheckpointPages`), which runs inside
   * a commit on the thread that answers calls: with the thread having copied
   * most pages already, that checkpoint has little left to copy, and when
   * the thread's checkpoint ends with every frame copied, the next commit
   * starts the WAL again from its beginning without one. The thread stands
   * aside once the WAL holds `assistPauseAtFrames` frames, so the serving
   * connection's own checkpoint is never the one that gives up, and the WAL
   * stays bounded as without the thread. `onFailed` is told if the thread
   * ends before it is closed (the serving connection then checkpoints
   * alone). Undefined for a store without a WAL.
   */
  static assist(db: DatabaseSync, onFailed?: (error: unknown) => void): WalCheckpointer | undefined {
    const path = walStore(db);
    return path === undefined ? undefined : new WalCheckpointer(db, path, "assist", onFailed);
  }

  /**
   * Call after each commit: wakes the checkpointer and, when the WAL is past
   * its limit, answers a promise of a checkpoint that covers this commit, for
   * which the writer waits before its next one (then the WAL starts again
   * from its beginning). A commit announced before the thread is up is
   * checkpointed once it is, so nothing waits for the thread to start.
   */
  written(): Promise<void> | undefined {
    if (this.stopped) return undefined;
    if (this.assisting) {
      if (++this.commitsSinceAnnounced < assistEveryCommits) return undefined;
      this.commitsSinceAnnounced = 0;
    }
    const commits = Atomics.add(this.cells, slot.commits, 1) + 1;
    Atomics.notify(this.cells, slot.commits);
    if (this.assisting) return undefined;
    return (statSync(this.walPath, { throwIfNoEntry: false })?.size ?? 0) > this.limitBytes ? this.caughtUp(commits) : undefined;
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

  /** Resolves once the thread has looked at every commit announced so far (or is gone). */
  async settled(): Promise<void> {
    const commits = Atomics.load(this.cells, slot.commits);
    for (;;) {
      const looked = Atomics.load(this.cells, slot.looked);
      if (looked >= commits || Atomics.load(this.cells, slot.state) !== state.running) return;
      const wait = Atomics.waitAsync(this.cells, slot.looked, looked);
      if (wait.async) await wait.value;
    }
  }

  /** Stops the checkpointer (done, or gone wrong): the writer checkpoints itself again. */
  private stop(): void {
    if (this.stopped) return;
    this.stopped = true;
    if (this.db.isOpen && !this.assisting) {
      this.db.exec(`PRAGMA wal_autocheckpoint = ${walCheckpointPages}`);
      this.db.exec(`PRAGMA journal_size_limit = ${this.journalSizeLimit}`);
    }
    if (Atomics.compareExchange(this.cells, slot.state, state.running, state.stopping) === state.running) {
      Atomics.add(this.cells, slot.commits, 1);
      Atomics.notify(this.cells, slot.commits);
    }
  }

  /** Catches up, lets the thread end, truncates the WAL (if no reader holds it) and hands checkpoints back to the writer; an assisting thread just ends. */
  async close(): Promise<void> {
    if (!this.stopped && !this.assisting) await this.caughtUp(Atomics.load(this.cells, slot.commits));
    // Checked again: the thread may have gone while this waited, and then its exit is past.
    if (!this.stopped) {
      const ended = new Promise((resolve) => this.worker.once("exit", resolve));
      this.stop();
      await ended;
    }
    if (this.db.isOpen && !this.assisting) this.db.exec("PRAGMA wal_checkpoint(TRUNCATE)");
  }
}

/** The file of a store in WAL mode; undefined for one in memory or with another journal. */
function walStore(db: DatabaseSync): string | undefined {
  const path = db.location();
  if (path === null || path === "") return undefined;
  const mode = (db.prepare("PRAGMA journal_mode").get() as { journal_mode: string }).journal_mode;
  return mode.toLowerCase() === "wal" ? path : undefined;
}
