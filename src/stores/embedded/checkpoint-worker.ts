import { DatabaseSync } from "node:sqlite";
import { parentPort, workerData } from "node:worker_threads";
import { slot, state } from "./wal-checkpointer.ts";

/**
 * The WAL checkpointer's thread (see wal-checkpointer.ts): a connection of its
 * own to the store, running a passive checkpoint whenever the writer has
 * committed since the last one began, and publishing in the memory it shares
 * with the writer how many commits each one covered. Sleeps while nothing is
 * committed.
 */
const { path, shared } = workerData as { path: string; shared: SharedArrayBuffer };
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
