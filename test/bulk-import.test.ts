import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, rmSync, statSync, writeFileSync } from "node:fs";
import { DatabaseSync } from "node:sqlite";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Worker } from "node:worker_threads";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { demoDetailCopies } from "../src/catalogue/demo-dataset.ts";
import { importFile } from "../src/catalogue/file-import.ts";
import { EmbeddedCatalogue } from "../src/stores/embedded/catalogue-store.ts";
import { openDatabase, walCheckpointPages } from "../src/stores/embedded/sqlite-database.ts";
import { WalCheckpointer } from "../src/stores/embedded/wal-checkpointer.ts";
import { root } from "./support/cli.ts";

// An import writes through the embedded store's bulk run: its WAL checkpoints
// run on a thread of their own (wal-checkpointer.ts). These check what that
// must not change: the WAL stays bounded, every committed record is in the
// store, the store is whole after a kill, and the writer gets its automatic
// checkpoints back afterwards, or as soon as the checkpointer is gone.

const firstId = 810_000_000_000;
let dir: string;
let catalogueFile: string;
const records = 4000;

beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), "gateway-bulk-"));
  catalogueFile = join(dir, "items.ndjson");
  writeFileSync(catalogueFile, [...demoDetailCopies(records, firstId)].map((r) => `${JSON.stringify(r)}\n`).join(""));
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const pragma = (db: DatabaseSync, name: string): unknown => Object.values(db.prepare(`PRAGMA ${name}`).get()!)[0];

describe("bulk import into the embedded store", () => {
  it("checkpoints on its own thread, keeps the WAL near its limit, then truncates it and hands checkpoints back", async () => {
    const path = join(dir, "limit", "gateway.db");
    const db = openDatabase(path);
    const limit = 1 << 20;
    const catalogue = new EmbeddedCatalogue(db, { bulkWalLimitBytes: limit });
    let largestWal = 0;
    let databaseGrew = false;
    const startBytes = statSync(path).size;
    let autoCheckpointDuring: unknown;
    const report = await importFile(catalogue, catalogueFile, {
      storedAt: 1_700_000_000,
      onProgress: () => {
        largestWal = Math.max(largestWal, statSync(`${path}-wal`).size);
        // The writer's own checkpoints are off: only the checkpointer thread can have grown the database file.
        autoCheckpointDuring = pragma(db, "wal_autocheckpoint");
        if (statSync(path).size > startBytes) databaseGrew = true;
      },
    });
    expect(report).toEqual({ imported: records, skipped: [] });
    expect(autoCheckpointDuring).toBe(0);
    expect(databaseGrew).toBe(true);
    // About 20 MB went through the WAL; it was started again from its beginning whenever it passed the
    // limit and a checkpoint caught up, so it never held more than the limit and the batches of one wait.
    expect(largestWal).toBeGreaterThan(0);
    expect(largestWal).toBeLessThan(limit + 8 * 2 ** 20);
    // Afterwards: the WAL is empty, the writer checkpoints itself again, and another connection sees every record.
    expect(statSync(`${path}-wal`).size).toBe(0);
    expect(pragma(db, "wal_autocheckpoint")).toBe(walCheckpointPages);
    const reader = new DatabaseSync(path, { readOnly: true });
    expect(pragma(reader, "integrity_check")).toBe("ok");
    expect(reader.prepare("SELECT count(*) AS n FROM catalogue_records WHERE key >= ?").get(String(firstId))).toEqual({ n: records });
    reader.close();
    db.close();
  });

  it("makes a writer that outruns its checkpoints wait for one to catch up once the WAL passes its limit", async () => {
    const path = join(dir, "outrun", "gateway.db");
    const db = openDatabase(path);
    db.exec("CREATE TABLE blobs (x BLOB)");
    const limit = 1 << 20;
    const checkpointer = WalCheckpointer.start(db, limit)!;
    const put = db.prepare("INSERT INTO blobs VALUES (?)");
    const blob = new Uint8Array(256 << 10).fill(7);
    let largestWal = 0;
    // 25 MB in commits far quicker than a checkpoint's fsync: without the wait the WAL would never be
    // wholly copied when the next commit begins, so SQLite could never start it again.
    for (let i = 0; i < 100; i++) {
      put.run(blob);
      await checkpointer.written();
      largestWal = Math.max(largestWal, statSync(`${path}-wal`).size);
    }
    await checkpointer.close();
    expect(largestWal).toBeLessThan(limit + 4 * 2 ** 20);
    expect(statSync(`${path}-wal`).size).toBe(0);
    expect(db.prepare("SELECT count(*) AS n FROM blobs").get()).toEqual({ n: 100 });
    db.close();
  });

  it("goes back to the writer's own checkpoints when the checkpointer thread is gone", async () => {
    const path = join(dir, "gone", "gateway.db");
    const db = openDatabase(path);
    const checkpointer = WalCheckpointer.start(db, 1 << 20)!;
    expect(pragma(db, "wal_autocheckpoint")).toBe(0);
    await (checkpointer as unknown as { worker: Worker }).worker.terminate();
    await new Promise((r) => setImmediate(r));
    db.exec("CREATE TABLE t (x BLOB)");
    await checkpointer.written(); // answers at once: nothing left to wait for
    expect(pragma(db, "wal_autocheckpoint")).toBe(walCheckpointPages);
    await checkpointer.close();
    expect(statSync(`${path}-wal`).size).toBe(0);
    db.close();
  });

  it("has nothing to do for a store in memory", () => {
    const db = openDatabase(":memory:");
    expect(WalCheckpointer.start(db)).toBeUndefined();
    const end = new EmbeddedCatalogue(db).beginBulk();
    return end();
  });

  it("leaves a whole store, with every batch it committed, when the import is killed", async () => {
    const data = join(dir, "killed");
    const path = join(data, "gateway.db");
    const child = spawn(process.execPath, [join(root, "bin", "gateway.js"), "import", catalogueFile], { cwd: root, env: { ...process.env, GATEWAY_DATA_DIR: data }, stdio: "ignore" });
    const exited = new Promise((r) => child.once("exit", r));
    // Killed once some records are committed, while it goes on writing.
    let committed = 0;
    for (let i = 0; i < 600 && committed === 0; i++) {
      await new Promise((r) => setTimeout(r, 25));
      if (!existsSync(path)) continue;
      try {
        const peek = new DatabaseSync(path, { readOnly: true });
        committed = (peek.prepare("SELECT count(*) AS n FROM catalogue_records WHERE key >= ?").get(String(firstId)) as { n: number }).n;
        peek.close();
      } catch {
        // not yet created
      }
    }
    child.kill("SIGKILL");
    await exited;
    expect(committed).toBeGreaterThan(0);
    const db = openDatabase(path);
    expect(pragma(db, "integrity_check")).toBe("ok");
    const after = (db.prepare("SELECT count(*) AS n FROM catalogue_records WHERE key >= ?").get(String(firstId)) as { n: number }).n;
    expect(after).toBeGreaterThanOrEqual(committed);
    // Every record that is there is whole: a decodable row for an id of the file.
    const catalogue = new EmbeddedCatalogue(db);
    expect((await catalogue.size()).get("retail/item_detail")).toBeGreaterThanOrEqual(committed);
    db.close();
  });
});
