// The embedded store's report reader's thread (see sql-reader.ts): a connection of its own to the store, running
// the read-only SQL of the AdminService's reports (usage totals, account listings) in one read transaction each, so
// a report over a large ledger runs beside the serving thread instead of stopping it.
//
// Plain JavaScript, as checkpoint-worker.js: a thread that loads a .ts file loads Node's type stripper too.
import { DatabaseSync } from "node:sqlite";
import { parentPort, workerData } from "node:worker_threads";

/** @type {{ path: string }} */
const { path } = workerData;
const db = new DatabaseSync(path);
db.exec("PRAGMA busy_timeout = 5000");
// Reads only, whatever it is sent.
db.exec("PRAGMA query_only = ON");
// The listing's lowering, as the serving connection's (SqliteAccountStore): JavaScript's, Unicode-wise.
db.function("gw_lower", { deterministic: true }, (v) => (typeof v === "string" ? v.toLowerCase() : v));
/** @type {Map<string, import("node:sqlite").StatementSync>} */
const statements = new Map();

/** @param {{ sql: string, params: Record<string, unknown>, bigints?: boolean, arrays?: boolean }} q */
function run(q) {
  let st = statements.get(q.sql);
  if (st === undefined) {
    st = db.prepare(q.sql);
    statements.set(q.sql, st);
  }
  st.setReadBigInts(q.bigints === true);
  st.setReturnArrays(q.arrays === true);
  return st.all(q.params);
}

parentPort.on("message", (/** @type {{ id: number, queries: { sql: string, params: Record<string, unknown>, bigints?: boolean, arrays?: boolean }[] }} */ m) => {
  try {
    db.exec("BEGIN");
    try {
      const rows = m.queries.map(run);
      db.exec("COMMIT");
      parentPort.postMessage({ id: m.id, rows });
    } catch (e) {
      if (db.isTransaction) db.exec("ROLLBACK");
      throw e;
    }
  } catch (e) {
    parentPort.postMessage({ id: m.id, error: { message: e instanceof Error ? e.message : String(e) } });
  }
});
