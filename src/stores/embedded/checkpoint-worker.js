// The WAL checkpointer's thread (see wal-checkpointer.ts): a connection of
// its own to the store, running a passive checkpoint whenever the writer has
// announced commits since the last one began, and publishing in the memory it
// shares with the writer how many commits each one covered. Sleeps while
// nothing is announced.
//
// Beside the serving connection (`pauseAtFrames` set), it stands aside while
// the WAL holds that many frames or more: the serving connection's own
// automatic checkpoint is then due, and one running here would make it give
// up (a passive checkpoint does not wait for another), so the WAL would not
// start again from its beginning. The WAL's length is read from the
// wal-index header in the `-shm` file (its `mxFrame`, a 32-bit integer at
// byte 16, in the machine's byte order: SQLite's documented WAL-index format).
//
// Plain JavaScript: a thread that loads a .ts file loads Node's type
// stripper too (an idle thread took 33 MB of RSS so, 16 MB without; an
// import of 20,000 records peaked 10-15 MB lower). The cells' layout comes
// in workerData, from wal-checkpointer.ts.
import { closeSync, openSync, readSync } from "node:fs";
import { DatabaseSync } from "node:sqlite";
import { workerData } from "node:worker_threads";

/** @type {{ path: string, shared: SharedArrayBuffer, slot: { commits: number, covered: number, state: number, looked: number }, state: { running: number }, pauseAtFrames: number | undefined }} */
const { path, shared, slot, state, pauseAtFrames } = workerData;
const cells = new Int32Array(shared);
const db = new DatabaseSync(path);
db.exec("PRAGMA busy_timeout = 5000");
const checkpoint = db.prepare("PRAGMA wal_checkpoint(PASSIVE)");
const header = new Uint32Array(1);
let shm;

/**
 * The frames in the WAL now, by its wal-index header. Infinity when the header cannot be read: the thread then
 * stands aside, and the serving connection checkpoints alone, as it would without the thread.
 */
function walFrames() {
  try {
    shm ??= openSync(`${path}-shm`, "r");
    return readSync(shm, header, 0, 4, 16) === 4 ? header[0] : Infinity;
  } catch {
    return Infinity;
  }
}

let seen = 0;
try {
  for (;;) {
    Atomics.wait(cells, slot.commits, seen);
    if (Atomics.load(cells, slot.state) !== state.running) break;
    seen = Atomics.load(cells, slot.commits);
    if (pauseAtFrames === undefined || walFrames() < pauseAtFrames) {
      checkpoint.get();
      Atomics.store(cells, slot.covered, seen);
      Atomics.notify(cells, slot.covered);
    }
    Atomics.store(cells, slot.looked, seen);
    Atomics.notify(cells, slot.looked);
  }
} finally {
  if (shm !== undefined) closeSync(shm);
  db.close();
}
