// The WAL checkpointer's thread (see wal-checkpointer.ts): a connection of
// its own to the store, running a passive checkpoint whenever the writer has
// announced commits since the last one began, and publishing in the memory it
// shares with the writer how many commits each one covered. Sleeps while
// nothing is announced.
//
// Plain JavaScript: a thread that loads a .ts file loads Node's type
// stripper too (an idle thread took 33 MB of RSS so, 16 MB without; an
// import of 20,000 records peaked 10-15 MB lower). The cells' layout comes
// in workerData, from wal-checkpointer.ts.
import { DatabaseSync } from "node:sqlite";
import { workerData } from "node:worker_threads";

/** @type {{ path: string, shared: SharedArrayBuffer, slot: { commits: number, covered: number, state: number }, state: { running: number } }} */
const { path, shared, slot, state } = workerData;
const cells = new Int32Array(shared);
const db = new DatabaseSync(path);
db.exec("PRAGMA busy_timeout = 5000");
const checkpoint = db.prepare("PRAGMA wal_checkpoint(PASSIVE)");
let seen = 0;
try {
  for (;;) {
    Atomics.wait(cells, slot.commits, seen);
    if (Atomics.load(cells, slot.state) !== state.running) break;
    seen = Atomics.load(cells, slot.commits);
    checkpoint.get();
    Atomics.store(cells, slot.covered, seen);
    Atomics.notify(cells, slot.covered);
  }
} finally {
  db.close();
}
