import { mkdtempSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { DatabaseSync } from "node:sqlite";
import { afterAll, describe, expect, it } from "vitest";
import type { LedgerRow } from "../src/core/meter.ts";
import { loadConfig } from "../src/config.ts";
import { databasePath, openRuntime } from "../src/runtime.ts";
import { SqliteMeter } from "../src/stores/embedded/meter.ts";
import { openDatabase } from "../src/stores/embedded/sqlite-database.ts";
import { servingCommitsPerCheckpoint, WalCheckpointer } from "../src/stores/embedded/wal-checkpointer.ts";

// A serving gateway's WAL checkpoints run on the checkpointer's thread, asked for every so many ledger commits.

const dir = mkdtempSync(join(tmpdir(), "gw-serving-checkpoints-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
let files = 0;
const day = "2026-05-06";
let ids = 0;
const row = (account: string): LedgerRow => ({
  requestId: `gw-test.ckpt${ids++}-${Date.now()}`,
  at: Date.now(),
  day,
  account,
  operation: "retail/item_get",
  code: 0,
  charge: "charged",
  price: 0n,
  cacheHit: true,
  latencyMicros: 100,
  transport: "legacy",
});
const walBytes = (file: string) => statSync(`${file}-wal`, { throwIfNoEntry: false })?.size ?? 0;
const autocheckpoint = (db: DatabaseSync) => Number((db.prepare("PRAGMA wal_autocheckpoint").get() as { wal_autocheckpoint: number }).wal_autocheckpoint);

/** `batches` group commits of 40 rows each, one at a time, a millisecond apart (a server commits once a turn of its event loop, with calls to serve between). */
async function commitBatches(meter: SqliteMeter, batches: number): Promise<void> {
  for (let b = 0; b < batches; b++) {
    await Promise.all(Array.from({ length: 40 }, () => meter.record(row(`gw-test-ckpt-${b % 3}`), undefined)));
    await new Promise((r) => setTimeout(r, 1));
  }
}

describe("checkpoints of a serving gateway", () => {
  it("run on the checkpointer's thread: the ledger's commits never checkpoint, and the WAL stays near its limit", async () => {
    const file = join(dir, `store-${files++}.db`);
    const db = openDatabase(file);
    // A 1 MiB limit: past it, the writer stands still until a checkpoint covers its last commit.
    const checkpointer = WalCheckpointer.start(db, 1 << 20, 8)!;
    const meter = new SqliteMeter(db, { committed: () => checkpointer.written() });
    expect(autocheckpoint(db)).toBe(0);
    let largest = 0;
    for (let round = 0; round < 30; round++) {
      await commitBatches(meter, 10);
      largest = Math.max(largest, walBytes(file));
    }
    // 300 commits of 40 rows wrote some megabytes of WAL frames; the WAL was started again from its beginning each time it passed the limit.
    const written = Number((db.prepare("SELECT count(*) AS n FROM ledger").get() as { n: number }).n);
    expect(written).toBe(12_000);
    expect(largest).toBeLessThan(2 << 20);
    await checkpointer.close();
    expect(walBytes(file)).toBe(0);
    expect(autocheckpoint(db)).toBe(1000);
    db.close();
  });

  it("leave a WAL that grows with every commit when nobody asks for them (what the test above rules out)", async () => {
    const file = join(dir, `store-${files++}.db`);
    const db = openDatabase(file);
    const checkpointer = WalCheckpointer.start(db, 1 << 20, 8)!;
    const meter = new SqliteMeter(db);
    await commitBatches(meter, 300);
    expect(walBytes(file)).toBeGreaterThan(2 << 20);
    await checkpointer.close();
    db.close();
  });

  it("hold a batch's answers and every later commit while the store asks the writer to stand still, its rows already durable", async () => {
    const file = join(dir, `store-${files++}.db`);
    const db = openDatabase(file);
    const releases: (() => void)[] = [];
    const meter = new SqliteMeter(db, { committed: () => new Promise<void>((resolve) => releases.push(resolve)) });
    const reader = new DatabaseSync(file, { readOnly: true });
    const rows = () => (reader.prepare("SELECT count(*) AS n FROM ledger").get() as { n: number }).n;
    let answered = 0;
    const first = meter.record(row("gw-test-held"), undefined).then(() => answered++);
    await expect.poll(rows).toBe(1);
    // Another caller's row meanwhile: it waits in the queue, uncommitted, until the store lets go.
    const second = meter.record(row("gw-test-held"), undefined).then(() => answered++);
    await new Promise((r) => setTimeout(r, 30));
    expect([rows(), answered]).toEqual([1, 0]);
    releases[0]!();
    await first;
    await expect.poll(rows).toBe(2);
    expect(answered).toBe(1);
    releases[1]!();
    await second;
    expect(answered).toBe(2);
    reader.close();
    db.close();
  });

  it("are what `gateway serve` runs with, and closing it truncates the WAL", async () => {
    const config = loadConfig({ GATEWAY_DATA_DIR: join(dir, `data-${files++}`), GATEWAY_PORT: "0" });
    const runtime = await openRuntime(config, { checkpointThread: true });
    const file = databasePath(config);
    const probe = new DatabaseSync(file, { readOnly: true });
    const startBytes = statSync(file).size;
    // More commits than one checkpoint is asked for after: only the checkpointer's thread can grow the database file,
    // the serving connection's own checkpoints being off.
    for (let b = 0; b < servingCommitsPerCheckpoint + 8; b++) {
      await Promise.all(Array.from({ length: 40 }, () => runtime.meter.record(row("gw-test-serve"), undefined)));
    }
    await expect.poll(() => statSync(file).size, { timeout: 5000 }).toBeGreaterThan(startBytes);
    expect((probe.prepare("SELECT count(*) AS n FROM ledger").get() as { n: number }).n).toBe(40 * (servingCommitsPerCheckpoint + 8));
    probe.close();
    await runtime.close();
    expect(walBytes(file)).toBe(0);
  });
});
