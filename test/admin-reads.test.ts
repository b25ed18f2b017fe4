// The embedded store's reports (usage totals and rows, account listings) run on a thread of their own. SQLite runs a
// statement to its end on the thread that asks, and the AdminService asked on the serving connection: a month's
// totals over a ledger of a million rows took 3 s, by address 13 s, and no call was answered meanwhile. A gateway
// here (in this process) with a ledger of 300,000 rows keeps its event loop turning while a report over all of them
// is read; the report thread falls back to the serving connection if it cannot run, and stops when idle.
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { mkdtempSync, rmSync } from "node:fs";
import { DatabaseSync } from "node:sqlite";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { monitorEventLoopDelay } from "node:perf_hooks";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { AccountService } from "../src/gen/gateway/account/v1/account_pb.js";
import { AdminService } from "../src/gen/gateway/admin/v1/admin_pb.js";
import { ErrorCode, StatusBlockSchema } from "../src/gen/gateway/catalogue/v1/status_pb.js";
import { ChangeWatch } from "../src/stores/embedded/change-watch.ts";
import { SqliteMeter } from "../src/stores/embedded/meter.ts";
import { InThreadReader, ThreadReader } from "../src/stores/embedded/sql-reader.ts";
import { openDatabase } from "../src/stores/embedded/sqlite-database.ts";
import { SqliteAccountStore } from "../src/stores/embedded/account-store.ts";
import { adminToken, demo, legacyGet, startGateway, type GatewayFixture } from "./support/gateway-fixture.ts";

const ledgerRows = 300_000;

describe("reports on the embedded store, beside the serving thread", () => {
  let gw: GatewayFixture;
  beforeAll(async () => {
    gw = await startGateway();
    // A large ledger, written by another connection as the CLI's would be: 300,000 calls of five accounts over three
    // days, so a report reads every row and answers a few totals.
    const db = new DatabaseSync(join(gw.config.dataDir, "gateway.db"));
    db.exec("PRAGMA busy_timeout = 5000");
    const insert = db.prepare(
      "INSERT INTO ledger (request_id, at, day, account, operation, error_code, charge, price, cache_hit, latency_us, transport, client_ip) VALUES (?, ?, ?, ?, 'retail/item_get', 0, 'charged', 50000, 1, 300, 'legacy', ?)",
    );
    db.exec("BEGIN IMMEDIATE");
    for (let i = 0; i < ledgerRows; i++) {
      insert.run(`gw-0.${i.toString(16).padStart(12, "0")}`, 1_793_000_000_000 + i, `2026-10-0${1 + (i % 3)}`, `bulk${i % 5}`, `10.1.${(i >> 8) & 255}.${i & 255}`);
    }
    db.exec("COMMIT");
    db.close();
  }, 120_000);
  afterAll(() => gw.close());
  const ok = { headers: { authorization: `Bearer ${adminToken}` } };
  const admin = () => createClient(AdminService, createConnectTransport({ baseUrl: gw.base, httpVersion: "1.1" }));

  it("keeps serving while a report over the whole ledger is read, and the report is whole", async () => {
    const c = admin();
    // How long this process's event loop (the gateway's serving thread) was held at once while the report was read.
    const held = monitorEventLoopDelay({ resolution: 5 });
    held.enable();
    const started = performance.now();
    const calls = (async () => {
      const codes: unknown[] = [];
      for (let i = 0; i < 3; i++) codes.push((await legacyGet(gw.base, "/retail/item_get/", { key: gw.account.key, secret: gw.account.secret, num_iid: demo.retailNumIid })).json.error_code);
      return codes;
    })();
    const [{ totals }, codes] = await Promise.all([c.queryUsage({ from: "2026-10-01", to: "2026-10-31" }, ok), calls]);
    const took = performance.now() - started;
    held.disable();
    expect(codes).toEqual(["0000", "0000", "0000"]);
    // On the serving connection the loop was held for the whole read (most of the report's time); here for moments.
    expect(held.max / 1e6, `held ${(held.max / 1e6).toFixed(0)} ms at once of a ${took.toFixed(0)} ms report`).toBeLessThan(took / 2);
    // Every row of the range: the same totals as the serving connection itself reads.
    expect(totals.reduce((n, t) => n + Number(t.calls), 0)).toBe(ledgerRows);
    const db = openDatabase(join(gw.config.dataDir, "gateway.db"));
    try {
      const alone = await new SqliteMeter(db, {}).query({ from: "2026-10-01", to: "2026-10-31" });
      expect(totals.map((t) => [t.account, t.day, Number(t.calls)])).toEqual(alone.totals.map((t) => [t.account ?? "", t.day, t.calls]));
    } finally {
      db.close();
    }
  });

  it("refuses a report too large to give whole (resource_exhausted; a team's own, 4003), and gives it a page at a time; the gateway keeps serving", async () => {
    // 60,000 calls of the fixture's team on one day, each from an address of its own: 60,000 totals by address, more
    // than a report asked whole may hold (maxWholeTotals). Made whole, a million of them took the gateway down.
    const db = new DatabaseSync(join(gw.config.dataDir, "gateway.db"));
    db.exec("PRAGMA busy_timeout = 5000");
    const insert = db.prepare(
      "INSERT INTO ledger (request_id, at, day, account, operation, error_code, charge, price, cache_hit, latency_us, transport, client_ip) VALUES (?, ?, '2026-09-01', ?, 'retail/item_get', 0, 'charged', 0, 0, 300, 'legacy', ?)",
    );
    db.exec("BEGIN IMMEDIATE");
    for (let i = 0; i < 60_000; i++) insert.run(`gw-9.${i.toString(16).padStart(12, "0")}`, 1_788_220_800_000 + i, gw.account.key, `10.2.${i >> 8}.${i & 255}`);
    db.exec("COMMIT");
    db.close();
    const c = admin();
    const filter = { account: gw.account.key, from: "2026-09-01", to: "2026-09-01", byAddress: true };
    const whole = await c.queryUsage(filter, ok).then(() => undefined, (e: unknown) => ConnectError.from(e));
    expect(whole?.code).toBe(Code.ResourceExhausted);
    expect(whole?.rawMessage).toContain("more than 50000 totals");
    // Without by_address the same day is one total, given whole.
    expect((await c.queryUsage({ ...filter, byAddress: false }, ok)).totals.map((t) => Number(t.calls))).toEqual([60_000]);
    // A page at a time: every total once, the sums over them all.
    let addresses = 0;
    let pageToken = "";
    do {
      const page = await c.queryUsage({ ...filter, pageSize: 10_000, pageToken }, ok);
      expect(page.calls).toBe(60_000n);
      addresses += page.totals.length;
      pageToken = page.nextPageToken;
    } while (pageToken !== "");
    expect(addresses).toBe(60_000);
    // The team's own report: whole, a 4003 with its status block; a page at a time, the same totals.
    const mine = createClient(AccountService, createConnectTransport({ baseUrl: gw.base, httpVersion: "1.1" }));
    const own = { headers: { "x-api-key": gw.account.key, "x-api-secret": gw.account.secret } };
    const refused = await mine.queryMyUsage({ from: "2026-09-01", to: "2026-09-01", byAddress: true }, own).then(() => undefined, (e: unknown) => ConnectError.from(e));
    expect([refused?.code, refused?.findDetails(StatusBlockSchema)[0]?.errorCode]).toEqual([Code.InvalidArgument, ErrorCode.PARAM_ERROR]);
    expect(refused?.rawMessage).toContain("a page at a time");
    const first = await mine.queryMyUsage({ from: "2026-09-01", to: "2026-09-01", byAddress: true, pageSize: 10_000 }, own);
    expect([first.totals.length, first.calls, first.nextPageToken !== ""]).toEqual([10_000, 60_000n, true]);
    const second = await mine.queryMyUsage({ from: "2026-09-01", to: "2026-09-01", byAddress: true, pageSize: 10_000, pageToken: first.nextPageToken }, own);
    expect(second.totals[0]!.clientIp > first.totals.at(-1)!.clientIp).toBe(true);
    // Another filter's token is the spec's 4015.
    const wrong = await mine.queryMyUsage({ from: "2026-09-01", byAddress: true, pageSize: 10_000, pageToken: first.nextPageToken }, own).then(() => undefined, (e: unknown) => ConnectError.from(e));
    expect(wrong?.findDetails(StatusBlockSchema)[0]?.errorCode).toBe(ErrorCode.WRONG_PAGE_TOKEN);
    // And calls went on being answered.
    expect((await legacyGet(gw.base, "/retail/item_get/", { key: gw.account.key, secret: gw.account.secret, num_iid: demo.retailNumIid })).json.error_code).toBe("0000");
  });

  it("refuses a listing of accounts too large to give whole (resource_exhausted), and gives it a page at a time", async () => {
    // 10,001 accounts more, made as an import would: one more than a listing asked whole may hold (maxWholeAccounts).
    const db = new DatabaseSync(join(gw.config.dataDir, "gateway.db"));
    db.exec("PRAGMA busy_timeout = 5000");
    const insert = db.prepare("INSERT INTO accounts (key, name, secret_hash, secret_salt, status, operations, daily_max, expires, zone, created_at, concurrency, prices) VALUES (?, ?, 'x', 'y', 'active', '{}', 1000, '', 'UTC', ?, 4, '{}')");
    db.exec("BEGIN IMMEDIATE");
    for (let i = 0; i < 10_001; i++) insert.run(`bulkacct${i}`, `Bulk team ${i}`, 1_790_000_000_000 + i);
    db.exec("COMMIT");
    db.close();
    const c = admin();
    const whole = await c.listAccounts({ query: "bulkacct" }, ok).then(() => undefined, (e: unknown) => ConnectError.from(e));
    expect([whole?.code, whole?.rawMessage]).toEqual([Code.ResourceExhausted, "10001 accounts match, more than one answer may hold (10000): ask for them a page at a time (page_size, at most 1000), or narrow the query"]);
    const page = await c.listAccounts({ query: "bulkacct", pageSize: 1000 }, ok);
    expect([page.accounts.length, page.totalSize, page.nextPageToken !== ""]).toEqual([1000, 10_001, true]);
    expect((await c.listAccounts({ query: "bulkacct999" }, ok)).accounts.map((a) => a.key).sort()).toEqual(["bulkacct999", ...Array.from({ length: 10 }, (_, i) => `bulkacct999${i}`)].sort());
  });

  it("lists and searches accounts there, folding case as JavaScript does", async () => {
    const c = admin();
    const { key } = await gw.newAccount({ name: "Équipe Ünïcode" });
    const found = await c.listAccounts({ query: "ÉQUIPE ÜNÏ" }, ok);
    expect(found.accounts.map((a) => a.key)).toEqual([key]);
    expect(found.totalSize).toBe(1);
  });
});

describe("the report thread", () => {
  const dirs: string[] = [];
  afterAll(() => {
    for (const d of dirs) rmSync(d, { recursive: true, force: true });
  });
  const store = () => {
    const dir = mkdtempSync(join(tmpdir(), "gateway-reads-"));
    dirs.push(dir);
    const path = join(dir, "gateway.db");
    return { path, db: openDatabase(path) };
  };

  it("starts at the first read, stops when idle, and starts again", async () => {
    const { path, db } = store();
    const reader = new ThreadReader(path, new InThreadReader(db), () => {}, 50);
    try {
      expect(reader.running).toBe(false);
      expect(await reader.read([{ sql: "SELECT 1 + :a AS n", params: { a: 1 } }])).toEqual([[{ n: 2 }]]);
      expect(reader.running).toBe(true);
      await new Promise((r) => setTimeout(r, 200));
      expect(reader.running).toBe(false);
      const [[row]] = (await reader.read([{ sql: "SELECT 9007199254740993 AS n", params: {}, bigints: true }])) as [[{ n: bigint }]];
      expect(row.n).toBe(9007199254740993n);
      // A statement it cannot run is refused; the thread goes on.
      await expect(reader.read([{ sql: "SELECT * FROM no_such_table", params: {} }])).rejects.toThrow(/no such table/);
      // Reads only, whatever it is sent.
      await expect(reader.read([{ sql: "CREATE TABLE t (x)", params: {} }])).rejects.toThrow(/readonly|read-only|query_only|attempt to write/i);
      expect(await reader.read([{ sql: "SELECT 3 AS n", params: {} }])).toEqual([[{ n: 3 }]]);
    } finally {
      await reader.close();
      db.close();
    }
  });

  it("falls back to the serving connection when the thread cannot open the store, and says so once", async () => {
    const { db } = store();
    const failures: unknown[] = [];
    // A directory where the store should be: the thread's connection cannot open it.
    const reader = new ThreadReader(tmpdir(), new InThreadReader(db), (e) => failures.push(e));
    try {
      const store = new SqliteAccountStore(db, new ChangeWatch(db), reader);
      expect((await store.listing({ text: "", status: undefined, after: undefined, limit: 10 })).total).toBe(0);
      expect(await reader.read([{ sql: "SELECT 4 AS n", params: {} }])).toEqual([[{ n: 4 }]]);
      expect(failures).toHaveLength(1);
      expect(reader.running).toBe(false);
    } finally {
      await reader.close();
      db.close();
    }
  });
});
