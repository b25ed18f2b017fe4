// Following the ledger: the AdminService's FollowCalls and `gateway feed`. ListCalls lists a filter newest first, and a
// listing started never sees the calls recorded after it; a billing system that keeps its books in step with the
// gateway needs the other way round: every call once, in the order the ledger committed it, from where it last
// stopped. On both stores, a follower at any page size is given exactly the calls committed, each once, whenever it
// reads; on both stores, retention folds only the start of that order and refuses a cursor it passed over; on the
// embedded store a sequence number is never given twice; on the shared store, a transaction still open holds back
// the calls after it (and the fold), so none can turn up behind a cursor already given, and replicas fold in steps,
// one at a time.
import { Code, ConnectError, createClient, createRouterTransport } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport, createGrpcWebTransport } from "@connectrpc/connect-node";
import { spawn } from "node:child_process";
import { once } from "node:events";
import net from "node:net";
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type pg from "pg";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import type { LedgerRow, Meter } from "../src/core/meter.ts";
import { followCalls } from "../src/core/usage-pages.ts";
import { LedgerRetention } from "../src/core/ledger-retention.ts";
import { MemoryAddressLockout } from "../src/core/address-lockout.ts";
import { CommitBell } from "../src/core/commit-bell.ts";
import { adminRoutes } from "../src/transports/connect/admin-service.ts";
import { AccountService } from "../src/gen/gateway/account/v1/account_pb.js";
import { AdminService } from "../src/gen/gateway/admin/v1/admin_pb.js";
import { ErrorCode, StatusBlockSchema } from "../src/gen/gateway/catalogue/v1/status_pb.js";
import { deriveSigningKey, newNonce, signCall } from "../src/client/browser-signature.ts";
import { SqliteMeter } from "../src/stores/embedded/meter.ts";
import { InThreadReader } from "../src/stores/embedded/sql-reader.ts";
import { openDatabase } from "../src/stores/embedded/sqlite-database.ts";
import { PostgresMeter } from "../src/stores/postgres/meter.ts";
import { defaultConfig } from "../src/config.ts";
import { dayOf } from "../src/core/clock.ts";
import { openRuntime } from "../src/runtime.ts";
import { migrateSchema, openPostgres } from "../src/stores/postgres/postgres-database.ts";
import { root, runCli } from "./support/cli.ts";
import { readCsv } from "./support/csv.ts";
import { adminToken, demo, legacyGet, startGateway, type GatewayFixture } from "./support/gateway-fixture.ts";
import { adminUrl, freshDatabase } from "./support/postgres.ts";

let ids = 0;
/** A charged call of `account` on `day`, with an id no other row of this file has. */
function row(account: string, day = "2026-11-20"): LedgerRow {
  const n = ids++;
  return {
    requestId: `gw-feed.${(0x7a000000 + n * 13).toString(16)}`,
    at: 1_795_000_000_000 + n,
    day,
    account,
    operation: "retail/item_get",
    code: ErrorCode.SUCCESS,
    charge: "charged",
    price: 0n,
    cacheHit: n % 2 === 0,
    upstreamRequests: n % 3,
    latencyMicros: 100 + n,
    transport: "legacy",
    clientIp: "192.0.2.1",
  };
}

/**
 * Records rows through the meter's own commit path (a group commit: one or more batches), resolved once durable and,
 * on the shared store, once no transaction begun before their commit holds them back from followers. PostgreSQL's
 * transaction ids, and so a snapshot's xmin, are the server's, not one database's: another test file's write (a
 * CREATE DATABASE) holds this file's rows back for its length, and a follower read meanwhile is caught up without
 * them. A transaction begun after the commit cannot hold them, so once none is held, none will be.
 */
async function record(meter: Meter, rows: readonly LedgerRow[]): Promise<void> {
  await recordBehind(meter, rows);
  for (const started = Date.now(); (await meter.feedHeldSince?.()) !== undefined; ) {
    if (Date.now() - started > 30_000) throw new Error("rows held back from followers for 30 s");
    await new Promise((r) => setTimeout(r, 10));
  }
}

/** Records rows, resolved once durable, held back or not: for rows committed behind a transaction a test holds open. */
async function recordBehind(meter: Meter, rows: readonly LedgerRow[]): Promise<void> {
  await Promise.all(rows.map((r) => meter.record(r, undefined)));
}

/** Writes a row to the shared store's ledger as a commit of transaction `txid` would have (0: before the column existed). */
async function writeRow(pool: pg.Pool, r: LedgerRow, txid: number): Promise<void> {
  await pool.query(
    "INSERT INTO ledger (request_id, at, day, account, operation, error_code, charge, price, cache_hit, latency_us, transport, txid) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12::xid8)",
    [r.requestId, r.at, r.day, r.account, r.operation, r.code, r.charge, r.price, r.cacheHit, r.latencyMicros, r.transport, String(txid)],
  );
}

/** Follows from `cursor` at `pageSize` until caught up: the ids given, the cursor kept, and the answers it took. */
async function follow(
  meter: Pick<Meter, "feed" | "feedEnd">,
  cursor: string,
  pageSize: number,
  only?: { readonly account: string; readonly scanRows: number },
): Promise<{ ids: string[]; cursor: string; answers: number }> {
  const given: string[] = [];
  let answers = 0;
  for (;;) {
    const page = await followCalls(meter, { cursor, pageSize, ...only });
    if (only !== undefined) expect(page.rows.every((r) => r.account === only.account)).toBe(true);
    expect(page.rows.length).toBeLessThanOrEqual(pageSize);
    expect(page.cursor).not.toBe("");
    given.push(...page.rows.map((r) => r.requestId));
    cursor = page.cursor;
    answers++;
    // A follower that never catches up ends here, failed, rather than never.
    expect(answers).toBeLessThanOrEqual(5000);
    if (page.caughtUp) return { ids: given, cursor, answers };
  }
}

interface Store {
  readonly meter: Meter;
  readonly kind: "embedded" | "shared";
  close(): Promise<void>;
}

function embedded(): Store & { readonly meter: SqliteMeter; readonly dir: string } {
  const dir = mkdtempSync(join(tmpdir(), "gateway-feed-"));
  const db = openDatabase(join(dir, "gateway.db"));
  const meter = new SqliteMeter(db, { reader: new InThreadReader(db) });
  return {
    meter,
    kind: "embedded",
    dir,
    async close() {
      db.close();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

async function shared(): Promise<Store & { readonly pool: pg.Pool }> {
  const own = await freshDatabase("call_feed");
  const pool = openPostgres(own.url, { max: 4 });
  await migrateSchema(pool);
  const meter = new PostgresMeter(pool, { holder: "feed" });
  return {
    meter,
    kind: "shared",
    pool,
    async close() {
      meter.close();
      await pool.end();
      await own.drop();
    },
  };
}

/**
 * For a failure's message, on the shared store: the rows its ledger holds, the server's snapshot xmin and the first
 * row it holds back, and every transaction open on the server with an id (any database: the xmin is the server's).
 */
async function heldState(store: Store): Promise<string> {
  if (!("pool" in store)) return `the embedded store`;
  const pool = (store as Store & { readonly pool: pg.Pool }).pool;
  const ledger = (await pool.query("SELECT count(*)::int AS n, min(txid)::text AS first, max(txid)::text AS last, pg_snapshot_xmin(pg_current_snapshot())::text AS xmin FROM ledger")).rows[0];
  const open = (
    await pool.query(
      "SELECT datname, pid, state, backend_xid::text AS xid, now() - xact_start AS age, left(query, 60) AS query FROM pg_stat_activity WHERE backend_xid IS NOT NULL OR backend_xmin IS NOT NULL ORDER BY xact_start",
    )
  ).rows;
  return `ledger ${JSON.stringify(ledger)}; held from ${String(await store.meter.feedHeldSince?.())}; open: ${JSON.stringify(open)}`;
}

describe.each([
  ["the embedded store", async () => embedded() as Store],
  ["the shared store (PostgreSQL)", shared as () => Promise<Store>],
])("following the ledger, %s", (_name, open) => {
  let store: Store;
  /** The rows recorded, batch by batch, in the order their batches committed. */
  const batches: LedgerRow[][] = [];
  beforeAll(async () => {
    store = await open();
    // 37 group commits of 1 to 73 rows, of three accounts, one after another.
    for (let b = 0; b < 37; b++) {
      const batch = Array.from({ length: 1 + ((b * 29) % 73) }, (_, i) => row(`acct${(b + i) % 3}`));
      await record(store.meter, batch);
      batches.push(batch);
    }
    // Every row made is stored (on the shared store, counted in its ledger): the tests below start from that.
    const total = batches.flat().length;
    const stored = "pool" in store ? ((await (store as Store & { readonly pool: pg.Pool }).pool.query("SELECT count(*)::int AS n FROM ledger")).rows[0] as { n: number }).n : total;
    if (stored !== total) throw new Error(`${total} rows made, ${stored} stored: ${await heldState(store)}`);
  }, 60_000);
  afterAll(() => store.close());

  it("gives every call committed exactly once, in commit order, at any page size", async () => {
    const all = batches.flat().map((r) => r.requestId);
    const batchOf = new Map(batches.flatMap((b, i) => b.map((r) => [r.requestId, i] as const)));
    for (const size of [1, 7, 64, 1000, 10_000]) {
      const { ids: given, answers } = await follow(store.meter, "", size);
      // Seen once in a full run (722 of 1,466, with no hold left to explain it): say what the store held then.
      if (given.length !== all.length) expect.fail(`page size ${size}: ${given.length} of ${all.length} rows given; ${await heldState(store)}`);
      expect(given).toHaveLength(all.length);
      expect(new Set(given)).toEqual(new Set(all));
      // Commit order: the embedded store's is each row's own; the shared store's by commit, then request id.
      if (store.kind === "embedded") expect(given).toEqual(all);
      else {
        const seen = given.map((id) => batchOf.get(id)!);
        expect(seen).toEqual([...seen].sort((a, b) => a - b));
      }
      // Answers: the full pages, and the one that came short (caught up).
      expect(answers).toBe(Math.floor(all.length / size) + 1);
    }
  });

  it("gives the calls committed after a cursor, and only those, however the follower's reads and the commits interleave", async () => {
    const start = await follow(store.meter, "", 10_000);
    let cursor = start.cursor;
    const later: string[] = [];
    const given: string[] = [];
    for (let round = 0; round < 12; round++) {
      const batch = Array.from({ length: 1 + ((round * 17) % 40) }, (_, i) => row(`acct${i % 3}`));
      // The follower reads while the commit is on its way, and again after it.
      const [page] = await Promise.all([followCalls(store.meter, { cursor, pageSize: 5 }), record(store.meter, batch)]);
      given.push(...page.rows.map((r) => r.requestId));
      later.push(...batch.map((r) => r.requestId));
      const rest = await follow(store.meter, page.cursor, 5 + round);
      given.push(...rest.ids);
      cursor = rest.cursor;
    }
    expect(given).toHaveLength(later.length);
    expect(new Set(given)).toEqual(new Set(later));
  });

  it("keeps its cursor while nothing new is committed, and says it is caught up", async () => {
    const { cursor } = await follow(store.meter, "", 10_000);
    const again = await followCalls(store.meter, { cursor, pageSize: 10 });
    expect(again).toEqual({ rows: [], cursor, caughtUp: true });
    // A page exactly as long as what is left is not caught up yet: the next answer says so, with nothing in it.
    const two = [row("acct0"), row("acct1")];
    await record(store.meter, two);
    const full = await followCalls(store.meter, { cursor, pageSize: 2 });
    expect(full.rows.map((r) => r.requestId).sort()).toEqual(two.map((r) => r.requestId).sort());
    expect(full.caughtUp).toBe(false);
    expect(await followCalls(store.meter, { cursor: full.cursor, pageSize: 2 })).toEqual({ rows: [], cursor: full.cursor, caughtUp: true });
    // Rows come whole, as ListCalls gives them.
    expect(full.rows.find((r) => r.requestId === two[0]!.requestId)).toEqual(two[0]);
  });

  it("gives one account's calls exactly once, in commit order, each answer reading at most its share of the ledger", async () => {
    // The whole ledger in commit order, every account's (this file's other tests add to it).
    const everything = await followCalls(store.meter, { pageSize: 10_000 });
    expect(everything.caughtUp).toBe(true);
    const order = everything.rows.map((r) => r.requestId);
    const accountOf = new Map(everything.rows.map((r) => [r.requestId, r.account!] as const));
    const total = order.length;
    for (const account of ["acct0", "acct2"]) {
      const mine = order.filter((id) => accountOf.get(id) === account);
      for (const [size, scan] of [
        [1000, 25],
        [3, 25],
        [7, 10_000],
        [1, 1],
      ] as const) {
        const { ids, answers } = await follow(store.meter, "", size, { account, scanRows: scan });
        expect(ids, `${account}, ${size} an answer from ${scan} rows`).toEqual(mine);
        // Each answer read at most `scan` rows of the ledger: a follower needs at least that many answers to read it all,
        // and no more than one answer per full page or per read besides.
        expect(answers).toBeGreaterThanOrEqual(Math.ceil(total / scan));
        expect(answers).toBeLessThanOrEqual(Math.ceil(total / scan) + Math.ceil(mine.length / size) + 1);
      }
    }
    // An account with no call moves through the ledger all the same, and is caught up at its end; then it is given
    // its first call, and nothing of the others', however the commits and its reads interleave.
    const idle = await follow(store.meter, "", 10, { account: "acct-idle", scanRows: 100 });
    expect(idle.ids).toEqual([]);
    expect(idle.answers).toBeGreaterThanOrEqual(Math.ceil(total / 100));
    expect(idle.answers).toBeLessThanOrEqual(Math.ceil(total / 100) + 1);
    const batch = [row("acct0"), row("acct-idle"), row("acct1"), row("acct-idle")];
    const [during] = await Promise.all([followCalls(store.meter, { cursor: idle.cursor, pageSize: 10, account: "acct-idle", scanRows: 100 }), record(store.meter, batch)]);
    const after = await follow(store.meter, during.cursor, 10, { account: "acct-idle", scanRows: 100 });
    expect([...during.rows.map((r) => r.requestId), ...after.ids].sort()).toEqual([batch[1]!.requestId, batch[3]!.requestId].sort());
    // A page exactly full is not caught up; the next answer is, with nothing in it.
    const two = await followCalls(store.meter, { cursor: idle.cursor, pageSize: 2, account: "acct-idle", scanRows: 100 });
    expect([two.rows.length, two.caughtUp]).toEqual([2, false]);
    expect(await followCalls(store.meter, { cursor: two.cursor, pageSize: 2, account: "acct-idle", scanRows: 100 })).toMatchObject({ rows: [], caughtUp: true });
  });

  it("from now: gives every call committed after it started and none before, for the ledger and for one account, and refuses a cursor beside it", async () => {
    // At rest: the end of the ledger is where a follower from the start ends, and nothing is given from it.
    const whole = await follow(store.meter, "", 10_000);
    const tail = await followCalls(store.meter, { fromNow: true, pageSize: 10 });
    expect(tail).toEqual({ rows: [], cursor: whole.cursor, caughtUp: true });
    const mine = await followCalls(store.meter, { fromNow: true, pageSize: 10, account: "acct1", scanRows: 100 });
    expect(mine).toMatchObject({ rows: [], caughtUp: true });

    // Started while commits are on their way: what it is given is only ever what was committed from then on, and
    // every call committed after it started is given, once.
    const made: string[] = [];
    let given: string[] = [];
    const batch = Array.from({ length: 30 }, (_, i) => row(`acct${i % 3}`));
    const [during] = await Promise.all([followCalls(store.meter, { fromNow: true, pageSize: 1000 }), record(store.meter, batch)]);
    made.push(...batch.map((r) => r.requestId));
    given.push(...during.rows.map((r) => r.requestId));
    const later = [row("acct0"), row("acct1"), row("acct2")];
    await record(store.meter, later);
    made.push(...later.map((r) => r.requestId));
    const rest = await follow(store.meter, during.cursor, 7);
    given = [...given, ...rest.ids];
    expect(given.every((id) => made.includes(id)), `given ${given.join(" ")}`).toBe(true);
    expect(new Set(given).size).toBe(given.length);
    for (const r of later) expect(given).toContain(r.requestId);
    // From the tail started at rest: every call since, in the order a follower from the start is given them.
    const fromTail = await follow(store.meter, tail.cursor, 5);
    expect(fromTail.ids).toEqual((await follow(store.meter, whole.cursor, 10_000)).ids);
    expect(new Set(fromTail.ids)).toEqual(new Set(made));
    // One account's tail: its calls since, and none of the others'.
    const own = await follow(store.meter, mine.cursor, 10, { account: "acct1", scanRows: 100 });
    expect(own.ids.sort()).toEqual([...batch, ...later].filter((r) => r.account === "acct1").map((r) => r.requestId).sort());

    // A cursor and from now at once: one or the other.
    await expect(followCalls(store.meter, { cursor: tail.cursor, fromNow: true, pageSize: 10 })).rejects.toMatchObject({ name: "UsagePageError", of: "both" });
  });

  it("refuses a cursor it did not give, another store's, and a page size below 0", async () => {
    // A cursor as followCalls writes one: its place, then the tag that marks it a cursor.
    const made = (place: string) => Buffer.from(JSON.stringify([place, "feed"])).toString("base64url");
    const foreign = made(store.kind === "embedded" ? "p123.gw-1.abc" : "e42");
    // Made up: numbers past what the store counts in (a 64-bit transaction id, a safe integer), a NUL in a request id.
    const hostile = store.kind === "embedded" ? ["e-1", "e9007199254740993", "e99999999999999999", "e1 "] : ["p18446744073709551616.gw-1.a", "p1.gw\u0000", "p01.gw", "p1"];
    for (const cursor of ["garbage", Buffer.from('["feed"]').toString("base64url"), foreign, ...hostile.map(made)]) {
      await expect(followCalls(store.meter, { cursor, pageSize: 10 }), cursor).rejects.toMatchObject({ name: "UsagePageError", of: "token" });
    }
    // The last place there can be is a place: nothing after it yet.
    const last = made(store.kind === "embedded" ? "e9007199254740991" : "p18446744073709551615.~");
    expect(await followCalls(store.meter, { cursor: last, pageSize: 10 })).toEqual({ rows: [], cursor: last, caughtUp: true });
    await expect(followCalls(store.meter, { cursor: "", pageSize: -1 })).rejects.toMatchObject({ name: "UsagePageError", of: "size" });
    // 0 is the default page, 1000; more than 10,000 is taken as 10,000.
    expect((await followCalls(store.meter, { cursor: "", pageSize: 0 })).rows.length).toBe(Math.min(1000, batches.flat().length + 200));
  });
});

/**
 * What retention does on either store, from an empty ledger: it folds only the start of the commit order (a row of
 * an older day committed after a kept one stays), the folded calls and what they bought stay in the totals, a
 * follower past the fold is given the rest and one before it is refused. `settle` waits until what was recorded can
 * be folded and followed. Returns the follower's place after the last row (r5), whose day is kept, and the rows.
 */
async function foldsTheStart(meter: Meter, settle: () => Promise<void>): Promise<{ cursor: string; rows: LedgerRow[] }> {
  const before = await followCalls(meter, { cursor: "", pageSize: 10 });
  expect(before).toMatchObject({ rows: [], caughtUp: true });
  // Committed one after another: an account a day ahead (r2) commits before an account a day behind (r3).
  const [r1, r2, r3, r4] = [row("east", "2026-01-01"), row("west", "2026-01-03"), row("east", "2026-01-01"), row("west", "2026-01-02")];
  for (const r of [r1, r2, r3, r4]) await record(meter, [r]);
  await settle();
  const a = await followCalls(meter, { cursor: "", pageSize: 1 });
  expect(a.rows.map((r) => r.requestId)).toEqual([r1.requestId]);

  // Days before 2026-01-02: r1 is folded; r3 is of such a day too, but committed after r2, so it stays.
  expect(await meter.expire("2026-01-02")).toBe(1);
  const totals = await meter.query({ from: "2026-01-01", to: "2026-01-01" });
  expect(totals.totals.reduce((n, t) => n + t.calls, 0)).toBe(2);
  // What they bought upstream is folded with them.
  expect(totals.totals.reduce((n, t) => n + t.upstreamRequests, 0)).toBe(r1.upstreamRequests + r3.upstreamRequests);
  // A follower past r1 misses nothing: it is given the rest.
  const rest = await follow(meter, a.cursor, 2);
  expect(rest.ids).toEqual([r2, r3, r4].map((r) => r.requestId));
  // A follower that had not read r1 is told so, not passed over it.
  await expect(followCalls(meter, { cursor: before.cursor, pageSize: 10 })).rejects.toMatchObject({ name: "UsagePageError", of: "folded" });
  // Starting again from the start is what the ledger still holds.
  expect((await follow(meter, "", 10)).ids).toEqual([r2, r3, r4].map((r) => r.requestId));

  // The next day's run folds r2 to r4 (before r5, the first row it keeps).
  const r5 = row("west", "2026-01-04");
  await record(meter, [r5]);
  await settle();
  expect(await meter.expire("2026-01-04")).toBe(3);
  const b = await follow(meter, rest.cursor, 10);
  expect(b.ids).toEqual([r5.requestId]);
  return { cursor: b.cursor, rows: [r1, r2, r3, r4, r5] };
}

describe("following the ledger across retention, the embedded store", () => {
  it("folds only the start of the commit order, refuses a cursor it passed over, and never numbers a row below one it gave", async () => {
    const store = embedded();
    try {
      const { meter } = store;
      const b = await foldsTheStart(meter, async () => {});

      // Every row older than retention: the newest stays all the same, so the next row is numbered past it (SQLite
      // numbers a row one past the highest held) and a follower there is given it.
      expect(meter.expire("2026-01-05")).toBe(0);
      const r6 = row("east", "2026-01-06");
      await record(meter, [r6]);
      expect((await follow(meter, b.cursor, 10)).ids).toEqual([r6.requestId]);
      expect(meter.expire("2026-01-07")).toBe(1);
      const r7 = row("west", "2026-01-08");
      await record(meter, [r7]);
      expect((await follow(meter, b.cursor, 10)).ids).toEqual([r6.requestId, r7.requestId]);
      // A follower from the start is given what is held: r6 (kept, as the newest was) and r7.
      const all = await follow(meter, "", 10);
      expect(all.ids).toEqual([r6.requestId, r7.requestId]);
      // From now, over a folded start: past the newest, r7.
      expect(await followCalls(meter, { fromNow: true, pageSize: 10 })).toEqual({ rows: [], cursor: all.cursor, caughtUp: true });
    } finally {
      await store.close();
    }
  });
});

/** Begins a transaction on `client` that writes `r` and stays open (the test ends it): its id is below every later commit's. */
async function heldOpen(client: pg.PoolClient, r: LedgerRow): Promise<void> {
  await client.query("BEGIN");
  await client.query(
    "INSERT INTO ledger (request_id, at, day, account, operation, error_code, charge, price, cache_hit, latency_us, transport, client_ip) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
    [r.requestId, r.at, r.day, r.account, r.operation, r.code, r.charge, r.price, r.cacheHit, r.latencyMicros, r.transport, r.clientIp],
  );
}

/**
 * Waits until every row the shared ledger holds is below the snapshot's xmin, which is the whole cluster's: a
 * transaction of another test file's database, open for a moment, holds back what a fold or a follower may take.
 */
async function settled(pool: pg.Pool): Promise<void> {
  for (let i = 0; i < 500; i++) {
    const { rows } = await pool.query<{ below: boolean }>("SELECT coalesce(max(txid) < pg_snapshot_xmin(pg_current_snapshot()), true) AS below FROM ledger");
    if (rows[0]!.below) return;
    await new Promise((r) => setTimeout(r, 20));
  }
  throw new Error("the ledger's rows never settled below the snapshot's xmin");
}

describe("following the ledger across retention, the shared store", () => {
  it("folds only the start of the commit order, refuses a cursor it passed over, and folds the newest row too", async () => {
    const store = await shared();
    try {
      const { meter, pool } = store;
      const b = await foldsTheStart(meter, () => settled(pool));

      // Every row older than retention, the newest with them: transaction ids never start again, so nothing need stay.
      expect(await meter.expire("2026-01-05")).toBe(1);
      expect(Number((await pool.query("SELECT count(*) AS n FROM ledger")).rows[0].n)).toBe(0);
      // A follower from the start of an emptied ledger is given the place past the fold, and then what comes.
      const empty = await followCalls(meter, { cursor: "", pageSize: 10 });
      expect(empty).toMatchObject({ rows: [], caughtUp: true });
      await expect(followCalls(meter, { cursor: empty.cursor, pageSize: 10 })).resolves.toMatchObject({ rows: [] });
      // From now, over a ledger folded whole: the fold's mark, as from the start.
      expect(await followCalls(meter, { fromNow: true, pageSize: 10 })).toEqual(empty);
      const r6 = row("east", "2026-01-06");
      await record(meter, [r6]);
      await settled(pool);
      expect((await follow(meter, b.cursor, 10)).ids).toEqual([r6.requestId]);
      expect((await follow(meter, empty.cursor, 10)).ids).toEqual([r6.requestId]);
      // The folded days keep their totals, charged amounts and cache hits included.
      const kept = await meter.query({ from: "2026-01-01", to: "2026-01-06" });
      expect(kept.totals.reduce((n, t) => n + t.calls, 0)).toBe(6);
      expect(kept.totals.reduce((n, t) => n + t.cacheHits, 0)).toBe([...b.rows, r6].filter((r) => r.cacheHit).length);
    } finally {
      await store.close();
    }
  });

  it("folds in steps, each whole: exact totals, a stop between steps leaves the rest to the next run, two replicas at once fold each row once", async () => {
    const own = await freshDatabase("call_feed_fold");
    const pool = openPostgres(own.url, { max: 6 });
    await migrateSchema(pool);
    const one = new PostgresMeter(pool, { holder: "fold-a", foldStepRows: 7 });
    const two = new PostgresMeter(pool, { holder: "fold-b", foldStepRows: 7 });
    try {
      // 60 calls of two old days and three accounts, priced, some from the cache, in 9 commits; then a kept day's.
      const old = Array.from({ length: 60 }, (_, i) => ({ ...row(`acct${i % 3}`, i < 25 ? "2026-02-01" : "2026-02-02"), price: BigInt(1000 + i), cacheHit: i % 4 === 0 }));
      for (let b = 0; b < 9; b++) await record(b % 2 === 0 ? one : two, old.filter((_, i) => i % 9 === b));
      const kept = [row("acct0", "2026-02-03"), row("acct1", "2026-02-03")];
      await record(one, kept);
      await settled(pool);
      const sums = async () => {
        const t = (await one.query({ from: "2026-02-01", to: "2026-02-02" })).totals;
        return { calls: t.reduce((n, x) => n + x.calls, 0), amount: t.reduce((n, x) => n + x.amount, 0n), hits: t.reduce((n, x) => n + x.cacheHits, 0), upstream: t.reduce((n, x) => n + x.upstreamRequests, 0) };
      };
      const expected = { calls: 60, amount: old.reduce((n, r) => n + r.price, 0n), hits: old.filter((r) => r.cacheHit).length, upstream: old.reduce((n, r) => n + r.upstreamRequests, 0) };
      expect(expected.upstream).toBeGreaterThan(0);
      expect(await sums()).toEqual(expected);
      const start = await follow(one, "", 1000);

      // Stopped after its first step (the signal reads aborted from its second look on): 7 rows, and totals exact.
      let looks = 0;
      const stopping = { get aborted() { return ++looks > 1; } } as AbortSignal;
      expect(await one.expire("2026-02-03", stopping)).toBe(7);
      expect(await sums()).toEqual(expected);
      await expect(followCalls(one, { cursor: "", pageSize: 1000 })).resolves.toMatchObject({ rows: expect.any(Array) });
      expect((await follow(one, "", 1000)).ids).toHaveLength(60 - 7 + 2);

      // Both replicas' runs at once: one holds the fold, the other skips it; each row folded once.
      const [a, b] = await Promise.all([one.expire("2026-02-03"), two.expire("2026-02-03")]);
      expect(a + b).toBe(53);
      expect([a, b]).toContain(0);
      expect(await sums()).toEqual(expected);
      expect((await follow(two, "", 1000)).ids).toEqual(kept.map((r) => r.requestId).sort());
      // A follower that read every call before the fold resumes past it: nothing more, nothing lost.
      expect((await follow(two, start.cursor, 1000)).ids).toEqual([]);
      expect(await one.expire("2026-02-03")).toBe(0);
      // Per account and day, as the rows were.
      const byAccount = (await one.query({ account: "acct1", from: "2026-02-02", to: "2026-02-02" })).totals.reduce((n, t) => n + t.calls, 0);
      expect(byAccount).toBe(old.filter((r) => r.account === "acct1" && r.day === "2026-02-02").length);
    } finally {
      one.close();
      two.close();
      await pool.end();
      await own.drop();
    }
  });

  it("is held back by a transaction still open, as followers are, and folds what it held once that ends", async () => {
    const store = await shared();
    try {
      const { meter, pool } = store;
      const early = [row("early", "2026-03-01"), row("early", "2026-03-01")];
      await record(meter, early);
      await settled(pool);
      const open = await pool.connect();
      try {
        const slow = row("slow", "2026-03-01");
        await heldOpen(open, slow);
        const late = [row("late", "2026-03-01"), row("late", "2026-03-01"), row("late", "2026-03-01")];
        await recordBehind(meter, late);
        // Only what committed before the open transaction began: the rows after it could still have one before them.
        expect(await meter.expire("2026-03-02")).toBe(2);
        await open.query("COMMIT");
        await settled(pool);
        expect(await meter.expire("2026-03-02")).toBe(4);
        const totals = await meter.query({ from: "2026-03-01", to: "2026-03-01" });
        expect(totals.totals.reduce((n, t) => n + t.calls, 0)).toBe(6);
      } finally {
        open.release();
      }
    } finally {
      await store.close();
    }
  });

  it("folds a shared ledger in the background of a serving runtime, from its start; the CLI's runtimes do not fold; a close stops a run between steps", async () => {
    const own = await freshDatabase("call_feed_serve");
    const pool = openPostgres(own.url, { max: 2 });
    await migrateSchema(pool);
    const meter = new PostgresMeter(pool, { holder: "seed" });
    const config = { ...defaultConfig, databaseUrl: own.url, redisUrl: "redis://127.0.0.1:6379/12", ledgerRetentionDays: 30 };
    try {
      const old = Array.from({ length: 25 }, () => row("seeded", "2026-01-10"));
      await record(meter, old);
      const recent = row("seeded", dayOf(Date.now(), config.timeZone));
      await record(meter, [recent]);
      await settled(pool);
      const runtime = await openRuntime(config, { retention: true });
      try {
        const ledgerDays = async () => (await pool.query<{ day: string }>("SELECT DISTINCT day FROM ledger ORDER BY day")).rows.map((r) => r.day);
        for (let i = 0; i < 200 && (await ledgerDays()).includes("2026-01-10"); i++) await new Promise((r) => setTimeout(r, 25));
        expect(await ledgerDays()).toEqual([recent.day]);
        const january = await runtime.meter.query({ account: "seeded", from: "2026-01-10", to: "2026-01-10" });
        expect(january.totals.reduce((n, t) => n + t.calls, 0)).toBe(25);
      } finally {
        await runtime.close();
      }
      // The CLI's runtimes do not fold: an old row written now stays through one.
      await record(meter, [row("seeded", "2026-01-11")]);
      await settled(pool);
      const cli = await openRuntime(config);
      await cli.close();
      expect((await pool.query("SELECT count(*) AS n FROM ledger WHERE day = '2026-01-11'")).rows[0].n).toBe("1");

      // Closed once it has folded a step of every row (601, with retention up to tomorrow), 3 at a time: it stops
      // between two steps and waits for the one under way, so every row is either still held or in the totals, and
      // the lock is free for the next run.
      await record(meter, Array.from({ length: 599 }, () => row("seeded", "2026-01-11")));
      await settled(pool);
      const sum = async (sql: string) => Number((await pool.query(sql)).rows[0].n);
      const foldedBefore = await sum("SELECT sum(calls) AS n FROM ledger_daily_totals");
      const stepping = new PostgresMeter(pool, { holder: "stepping", foldStepRows: 3 });
      try {
        // Retention of one day, two days from now: every day before tomorrow.
        const tomorrow = () => Date.now() + 86_400_000;
        const retention = new LedgerRetention(stepping, { days: 1, timeZone: config.timeZone, now: () => tomorrow() + 86_400_000 });
        retention.start();
        for (let i = 0; (await sum("SELECT sum(calls) AS n FROM ledger_daily_totals")) === foldedBefore; i++) {
          expect(i).toBeLessThan(5000);
          await new Promise((r) => setTimeout(r, 2));
        }
        await retention.close();
        const held = await sum("SELECT count(*) AS n FROM ledger");
        const folded = (await sum("SELECT sum(calls) AS n FROM ledger_daily_totals")) - foldedBefore;
        expect(held + folded).toBe(601);
        expect(folded % 3).toBe(0);
        expect(held).toBeGreaterThan(0);
        const totals = await stepping.query({ account: "seeded", from: "2026-01-11", to: "2026-01-11" });
        expect(totals.totals.reduce((n, t) => n + t.calls, 0)).toBe(600);
        expect(await stepping.expire(dayOf(tomorrow(), config.timeZone))).toBe(held);
      } finally {
        stepping.close();
      }
    } finally {
      meter.close();
      await pool.end();
      await own.drop();
    }
  });
});

describe("following the ledger, the shared store", () => {
  it("holds back the calls committed after a transaction still open, and gives them once it ends, none passed over", async () => {
    const store = await shared();
    try {
      const { meter, pool } = store;
      const start = await follow(meter, "", 100);
      // A transaction that writes a ledger row and stays open: its id is below every later commit's.
      const open = await pool.connect();
      try {
        const slow = row("slow");
        await heldOpen(open, slow);
        const fast = [row("fast"), row("fast"), row("fast")];
        await recordBehind(meter, fast);
        // Committed, but behind the open transaction: not given yet, and the cursor does not move past it.
        const held = await followCalls(meter, { cursor: start.cursor, pageSize: 100 });
        expect(held).toEqual({ rows: [], cursor: start.cursor, caughtUp: true });
        // A tail started now starts before them too: they are given to it once released, not passed over.
        const tail = await followCalls(meter, { fromNow: true, pageSize: 100 });
        expect(tail).toEqual(held);
        await open.query("COMMIT");
        // A transaction of another test file's database, open at this moment, would hold these back too.
        await settled(pool);
        const after = await follow(meter, start.cursor, 100);
        expect(after.ids[0]).toBe(slow.requestId);
        expect(after.ids.slice(1).sort()).toEqual(fast.map((r) => r.requestId).sort());
        expect((await follow(meter, tail.cursor, 100)).ids).toEqual(after.ids);
      } finally {
        open.release();
      }
    } finally {
      await store.close();
    }
  });

  it("tells operators, in a metric read when scraped, how long an open transaction has held followers back; the embedded store has none to tell", async () => {
    const own = await freshDatabase("call_feed_held");
    const pool = openPostgres(own.url, { max: 2 });
    const heldSeconds = (text: string) => Number(/^gateway_ledger_feed_held_seconds (\S+)$/m.exec(text)?.[1]);
    try {
      await migrateSchema(pool);
      const runtime = await openRuntime({ ...defaultConfig, databaseUrl: own.url, redisUrl: "redis://127.0.0.1:6379/12" });
      try {
        const open = await pool.connect();
        try {
          await heldOpen(open, { ...row("slow"), at: Date.now() });
          const committed = { ...row("fast"), at: Date.now() };
          await recordBehind(runtime.meter, [committed]);
          await new Promise((r) => setTimeout(r, 1500));
          const held = heldSeconds(await runtime.metrics.scrape());
          expect(held).toBeGreaterThanOrEqual(1.4);
          expect(held).toBeLessThan(60);
          await open.query("COMMIT");
        } finally {
          open.release();
        }
        // Other test files' commits on this server hold a row for moments at most.
        let after = Number.POSITIVE_INFINITY;
        for (let i = 0; i < 100 && !(after < 0.5); i++) after = heldSeconds(await runtime.metrics.scrape());
        expect(after).toBeLessThan(0.5);
      } finally {
        await runtime.close();
      }
      // A database it cannot ask reads as unknown, not as nothing held, and the scrape still answers.
      const broken = await openRuntime({ ...defaultConfig, databaseUrl: own.url, redisUrl: "redis://127.0.0.1:6379/12" });
      const admin = openPostgres(adminUrl, { max: 1 });
      try {
        await admin.query(`ALTER DATABASE ${own.name} ALLOW_CONNECTIONS false`);
        await admin.query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", [own.name]);
        expect(heldSeconds(await broken.metrics.scrape())).toBeNaN();
      } finally {
        await admin.query(`ALTER DATABASE ${own.name} ALLOW_CONNECTIONS true`);
        await admin.end();
        await broken.close();
      }
    } finally {
      await pool.end();
      await own.drop();
    }
    const dataDir = mkdtempSync(join(tmpdir(), "gateway-held-"));
    const embedded = await openRuntime({ ...defaultConfig, dataDir });
    try {
      expect(await embedded.metrics.scrape()).not.toContain("gateway_ledger_feed_held_seconds");
    } finally {
      await embedded.close();
      rmSync(dataDir, { recursive: true, force: true });
    }
  });

  it("shows the replica's connections to the shared database, and the calls waiting for one while a lock holds them all", async () => {
    const own = await freshDatabase("call_feed_pool");
    const pool = openPostgres(own.url, { max: 2 });
    const gauge = (text: string, state: string) => Number(new RegExp(`^gateway_database_connections\\{state="${state}"\\} (\\S+)$`, "m").exec(text)?.[1]);
    try {
      await migrateSchema(pool);
      const runtime = await openRuntime({ ...defaultConfig, databaseUrl: own.url, redisUrl: "redis://127.0.0.1:6379/12" });
      try {
        const made = await runtime.admin.create({ name: "pool" });
        const max = Number(/^gateway_database_connections_max (\S+)$/m.exec(await runtime.metrics.scrape())?.[1]);
        expect(max).toBe(16);
        // A migration's lock, taken outside: every read of the accounts' history waits on it, holding its connection.
        const locker = await pool.connect();
        try {
          await locker.query("BEGIN");
          await locker.query("LOCK TABLE account_changes IN ACCESS EXCLUSIVE MODE");
          const reads = Array.from({ length: max + 4 }, () => runtime.admin.history(made.account.key));
          let text = "";
          for (let i = 0; i < 100 && !(gauge(text, "waiting") >= 4); i++) {
            await new Promise((r) => setTimeout(r, 20));
            text = await runtime.metrics.scrape();
          }
          expect(gauge(text, "open")).toBe(max);
          expect(gauge(text, "idle")).toBe(0);
          // The four history reads past the pool's size, and balance reads behind them.
          expect(gauge(text, "waiting")).toBeGreaterThanOrEqual(4);
          // The scrape did not queue behind them for the feed's hold: it gave up on it within its second (NaN).
          expect(Number(/^gateway_ledger_feed_held_seconds (\S+)$/m.exec(text)?.[1])).toBeNaN();
          await locker.query("COMMIT");
          await Promise.all(reads);
        } finally {
          await locker.query("ROLLBACK").catch(() => {}); // a failed expectation must not leave the lock held
          locker.release();
        }
        const after = await runtime.metrics.scrape();
        expect(gauge(after, "waiting")).toBe(0);
        // Given back (this scrape's own question on the feed's hold, or the runtime's own work, may hold one or two).
        expect(gauge(after, "idle")).toBeGreaterThanOrEqual(gauge(after, "open") - 2);
      } finally {
        await runtime.close();
      }
    } finally {
      await pool.end();
      await own.drop();
    }
  });

  it("gives rows written before it kept transaction ids first, and reads a page from its index, never sorting the ledger", async () => {
    const store = await shared();
    try {
      const { meter, pool } = store;
      const old = [row("old"), row("old")];
      // As an upgraded store holds them: written before step 22's column, so with its constant 0.
      for (const r of old) await writeRow(pool, r, 0);
      const newer = [row("new"), row("new")];
      await record(meter, newer);
      expect((await follow(meter, "", 1)).ids).toEqual([...old.map((r) => r.requestId).sort(), ...newer.map((r) => r.requestId).sort()]);
      // The statement the meter sends for a page, as it sends it (text and parameters), not one written here beside it.
      const sent: { text: string; values: unknown[] }[] = [];
      const query = pool.query.bind(pool) as (text: unknown, values?: unknown) => Promise<unknown>;
      const spy = vi.spyOn(pool, "query").mockImplementation(((text: unknown, values?: unknown) => {
        if (typeof text === "string") sent.push({ text, values: (values as unknown[] | undefined) ?? [] });
        return query(text, values);
      }) as typeof pool.query);
      try {
        await followCalls(meter, { cursor: "", pageSize: 10 });
      } finally {
        spy.mockRestore();
      }
      const page = sent.find((q) => /FROM ledger\s+WHERE \(txid, request_id/.test(q.text));
      expect(page, sent.map((q) => q.text).join("\n---\n")).toBeDefined();
      const client = await pool.connect();
      try {
        await client.query("SET enable_sort = off");
        await client.query("SET enable_seqscan = off");
        const plan = await client.query<{ "QUERY PLAN": string }>(`EXPLAIN ${page!.text}`, page!.values);
        const text = plan.rows.map((r) => r["QUERY PLAN"]).join(" | ");
        expect(text).toContain("ledger_in_commit_order");
        // A sort would mean the rows are not taken in the index's order: read whole, or (ordered by the id's text) out of order.
        expect(text).not.toMatch(/Sort/);
      } finally {
        client.release();
      }
    } finally {
      await store.close();
    }
  });

  it("orders transaction ids as numbers, never as their text: across a new digit (9 to 10, 99 to 100, 999 to 1000) every row comes once and in order, at any page size, for the ledger and for one account; from now starts past the last; a fold's step is whole", async () => {
    const own = await freshDatabase("call_feed_digits");
    const pool = openPostgres(own.url, { max: 4 });
    await migrateSchema(pool);
    const meter = new PostgresMeter(pool, { holder: "digits", foldStepRows: 3 });
    try {
      // Transaction ids are the server's, and a soak run met them crossing 99999 to 100000: a page ordered by the id's
      // text ("100000" before "99999") gave a row twice, and a full page could pass over rows. The rows are written as
      // their commits would have been, with ids on both sides of a new digit, every one long ended.
      const { rows: snapshot } = await pool.query<{ xmin: string }>("SELECT pg_snapshot_xmin(pg_current_snapshot())::text AS xmin");
      expect(BigInt(snapshot[0]!.xmin)).toBeGreaterThan(1000n);
      const txids = [9, 10, 10, 11, 99, 100, 100, 101, 999, 1000];
      const written = txids.map((txid, i) => ({ txid, row: row(i % 2 === 0 ? "east" : "west", i < 4 ? "2026-03-01" : "2026-03-02") }));
      // Written in an order of their own, so nothing rests on the order rows were inserted in.
      for (const w of [...written].reverse()) await writeRow(pool, w.row, w.txid);
      const inOrder = [...written].sort((a, b) => a.txid - b.txid || (a.row.requestId < b.row.requestId ? -1 : 1));
      const ids = (account?: string) => inOrder.filter((w) => account === undefined || w.row.account === account).map((w) => w.row.requestId);
      for (const pageSize of [1, 2, 3, 4, 100]) expect((await follow(meter, "", pageSize)).ids, `page size ${pageSize}`).toEqual(ids());
      for (const account of ["east", "west"]) {
        for (const scanRows of [1, 2, 3, 100]) {
          for (const pageSize of [1, 2, 100]) expect((await follow(meter, "", pageSize, { account, scanRows })).ids, `${account}, scan ${scanRows}, page size ${pageSize}`).toEqual(ids(account));
        }
      }
      // From now: past the row of transaction 1000, the last in order (by its text, "999" would be).
      const now = await followCalls(meter, { fromNow: true, pageSize: 10 });
      expect(now.rows).toEqual([]);
      const next = row("east", "2026-03-02");
      await record(meter, [next]);
      expect((await follow(meter, now.cursor, 10)).ids).toEqual([next.requestId]);
      // Retention's steps of three: the first is 9, 10 and 10, whole (ordered by their text, "9" would end it after one row).
      let looks = 0;
      const stopping = { get aborted() { return ++looks > 1; } } as AbortSignal;
      expect(await meter.expire("2026-03-02", stopping)).toBe(3);
      expect((await follow(meter, "", 100)).ids).toEqual([...ids().slice(3), next.requestId]);
      expect(await meter.expire("2026-03-02")).toBe(1);
      expect((await follow(meter, "", 100)).ids).toEqual([...ids().slice(4), next.requestId]);
    } finally {
      meter.close();
      await pool.end();
      await own.drop();
    }
  });
});

describe("following the ledger over a running gateway", () => {
  let gw: GatewayFixture;
  beforeAll(async () => {
    gw = await startGateway();
  });
  afterAll(() => gw.close());

  const call = async () => {
    const r = await legacyGet(gw.base, "/retail/item_get/", { key: gw.account.key, secret: gw.account.secret, num_iid: demo.retailNumIid });
    expect(r.json.error_code).toBe("0000");
    return r.json.request_id as string;
  };

  it("FollowCalls gives an operator every call over Connect and gRPC, refuses a cursor it did not give (invalid_argument) and one that retention passed over (out_of_range)", async () => {
    const made = [await call(), await call(), await call()];
    const headers = { authorization: `Bearer ${adminToken}` };
    for (const transport of [createConnectTransport({ baseUrl: gw.base, httpVersion: "1.1" }), createGrpcTransport({ baseUrl: gw.base })]) {
      const admin = createClient(AdminService, transport);
      const first = await admin.followCalls({ pageSize: 2 }, { headers });
      expect(first.calls.map((c) => c.requestId)).toEqual(made.slice(0, 2));
      expect(first.caughtUp).toBe(false);
      expect(first.calls[0]!.account).toBe(gw.account.key);
      const second = await admin.followCalls({ cursor: first.cursor, pageSize: 2 }, { headers });
      expect(second.calls.map((c) => c.requestId)).toEqual(made.slice(2));
      expect(second.caughtUp).toBe(true);
      const refused = await admin.followCalls({ cursor: "not-a-cursor" }, { headers }).catch((e: unknown) => ConnectError.from(e));
      expect(refused).toMatchObject({ code: Code.InvalidArgument });
      const negative = await admin.followCalls({ pageSize: -1 }, { headers }).catch((e: unknown) => ConnectError.from(e));
      expect(negative).toMatchObject({ code: Code.InvalidArgument });
      const unauthenticated = await admin.followCalls({}).catch((e: unknown) => ConnectError.from(e));
      expect(unauthenticated).toMatchObject({ code: Code.Unauthenticated });
    }
    const admin = createClient(AdminService, createConnectTransport({ baseUrl: gw.base, httpVersion: "1.1" }));
    const one = await admin.followCalls({ pageSize: 1 }, { headers });
    // Every row but the newest folded (retention of every day before 9999-12-31): the cursor after the first call, with
    // the second gone, is out of range.
    expect((gw.runtime.meter as SqliteMeter).expire("9999-12-31")).toBe(made.length - 1);
    const folded = await admin.followCalls({ cursor: one.cursor }, { headers }).catch((e: unknown) => ConnectError.from(e));
    expect(folded).toMatchObject({ code: Code.OutOfRange });
    expect((folded as ConnectError).rawMessage).toContain("folded past retention");
    // From the start again: the newest call, kept; then the next call.
    const restart = await admin.followCalls({}, { headers });
    expect(restart.calls.map((c) => c.requestId)).toEqual([made[2]]);
    const next = await call();
    expect((await admin.followCalls({ cursor: restart.cursor }, { headers })).calls.map((c) => c.requestId)).toEqual([next]);
  });

  it("FollowCalls and FollowMyCalls from now: from the ledger's end, the calls after it and only the team's own; signed as from_now=true; a cursor beside it refused", async () => {
    const headers = { authorization: `Bearer ${adminToken}` };
    const team = await gw.newAccount({ name: "feed-now" });
    const other = await gw.newAccount({ name: "feed-now-other" });
    const get = (t: { key: string; secret: string }) => legacyGet(gw.base, "/retail/item_get/", { key: t.key, secret: t.secret, num_iid: demo.retailNumIid }).then((r) => r.json.request_id as string);
    await get(team);
    await get(other);
    const plain = (t: { key: string; secret: string }) => ({ headers: { "x-api-key": t.key, "x-api-secret": t.secret } });
    const signingKey = await deriveSigningKey(team.secret);
    const signed = async (params: Record<string, string>) => {
      const timestamp = Math.floor(Date.now() / 1000);
      const nonce = newNonce();
      const signature = await signCall(signingKey, { method: "RPC", path: "/gateway.account.v1.AccountService/FollowMyCalls", params, timestamp, nonce });
      return { headers: { authorization: `GATEWAY-HMAC-SHA256 key=${team.key}, timestamp=${timestamp}, nonce=${nonce}, signature=${signature}` } };
    };
    for (const transport of [createConnectTransport({ baseUrl: gw.base, httpVersion: "1.1" }), createGrpcTransport({ baseUrl: gw.base })]) {
      const admin = createClient(AdminService, transport);
      const mine = createClient(AccountService, transport);
      const everything = await admin.followCalls({ pageSize: 10_000 }, { headers });
      const tail = await admin.followCalls({ fromNow: true }, { headers });
      expect([tail.calls, tail.cursor, tail.caughtUp]).toEqual([[], everything.cursor, true]);
      const own = await mine.followMyCalls({ fromNow: true }, plain(team));
      const ownSigned = await mine.followMyCalls({ fromNow: true, pageSize: 5 }, await signed({ from_now: "true", page_size: "5" }));
      expect([own.calls, own.caughtUp, ownSigned.calls, ownSigned.caughtUp]).toEqual([[], true, [], true]);
      const made = [await get(other), await get(team), await get(other)];
      expect((await admin.followCalls({ cursor: tail.cursor }, { headers })).calls.map((c) => c.requestId)).toEqual(made);
      expect((await mine.followMyCalls({ cursor: own.cursor }, plain(team))).calls.map((c) => c.requestId)).toEqual([made[1]]);
      expect((await mine.followMyCalls({ cursor: ownSigned.cursor }, plain(team))).calls.map((c) => c.requestId)).toEqual([made[1]]);
      // Signed without from_now, asked with it: the signature does not cover what is asked.
      const forged = await mine.followMyCalls({ fromNow: true }, await signed({})).then(
        () => "answered",
        (err: unknown) => ConnectError.from(err).findDetails(StatusBlockSchema)[0]?.errorCode,
      );
      expect(forged).toBe(ErrorCode.INVALID_CREDENTIALS);
      // A cursor and from now at once: invalid_argument for an operator, 4003 for a team.
      const both = await admin.followCalls({ fromNow: true, cursor: tail.cursor }, { headers }).catch((e: unknown) => ConnectError.from(e));
      expect([(both as ConnectError).code, (both as ConnectError).rawMessage]).toEqual([Code.InvalidArgument, "a cursor or from_now, not both: a cursor reads on from where it was given, from_now from the newest call"]);
      const teamBoth = await mine.followMyCalls({ fromNow: true, cursor: own.cursor }, plain(team)).catch((e: unknown) => ConnectError.from(e));
      expect([(teamBoth as ConnectError).code, (teamBoth as ConnectError).findDetails(StatusBlockSchema)[0]?.errorCode]).toEqual([Code.InvalidArgument, ErrorCode.PARAM_ERROR]);
    }
  });

  it("FollowMyCalls gives a team its own calls in commit order over Connect and gRPC, signed or not, and refuses a cursor it did not give (4015) and one retention passed over (4003)", async () => {
    const a = await gw.newAccount({ name: "feed-a" });
    const b = await gw.newAccount({ name: "feed-b" });
    const made = { a: [] as string[], b: [] as string[] };
    for (let i = 0; i < 7; i++) {
      const [who, team] = i % 3 === 2 ? (["b", b] as const) : (["a", a] as const);
      const r = await legacyGet(gw.base, "/retail/item_get/", { key: team.key, secret: team.secret, num_iid: i === 4 ? "x" : demo.retailNumIid });
      made[who].push(r.json.request_id as string);
    }
    const plain = (t: { key: string; secret: string }) => ({ headers: { "x-api-key": t.key, "x-api-secret": t.secret } });
    for (const transport of [createConnectTransport({ baseUrl: gw.base, httpVersion: "1.1" }), createGrpcTransport({ baseUrl: gw.base })]) {
      const mine = createClient(AccountService, transport);
      // Two at a time from the start: every call of the team, the refused one too, none of the other team's.
      const seen: string[] = [];
      let cursor = "";
      for (let answers = 0; ; answers++) {
        expect(answers).toBeLessThan(10);
        const page = await mine.followMyCalls({ cursor, pageSize: 2 }, plain(a));
        seen.push(...page.calls.map((c) => c.requestId));
        cursor = page.cursor;
        if (page.caughtUp) break;
      }
      expect(seen).toEqual(made.a);
      const theirs = await mine.followMyCalls({}, plain(b));
      expect([theirs.calls.map((c) => c.requestId), theirs.caughtUp]).toEqual([made.b, true]);
      expect(theirs.calls[0]).toMatchObject({ operation: "retail/item_get", errorCode: ErrorCode.SUCCESS, transport: "legacy" });
      // Kept, the cursor gives the calls after it, and only the team's.
      const next = (await legacyGet(gw.base, "/retail/item_get/", { key: a.key, secret: a.secret, num_iid: demo.retailNumIid })).json.request_id as string;
      made.b.push((await legacyGet(gw.base, "/retail/item_get/", { key: b.key, secret: b.secret, num_iid: demo.retailNumIid })).json.request_id as string);
      made.a.push(next);
      expect((await mine.followMyCalls({ cursor }, plain(a))).calls.map((c) => c.requestId)).toEqual([next]);
      for (const [req, who, code, words] of [
        [{ cursor: "not-a-cursor" }, a, ErrorCode.WRONG_PAGE_TOKEN, "the cursor is not one this gateway gave"],
        [{ pageSize: -1 }, a, ErrorCode.PARAM_ERROR, "page size"],
        [{}, { key: a.key, secret: "wrong" }, ErrorCode.INVALID_CREDENTIALS, ""],
      ] as const) {
        const e = await mine.followMyCalls(req, plain(who)).then(() => undefined, (err: unknown) => ConnectError.from(err));
        expect([e?.code, e?.findDetails(StatusBlockSchema)[0]?.errorCode]).toEqual([code === ErrorCode.INVALID_CREDENTIALS ? Code.Unauthenticated : Code.InvalidArgument, code]);
        expect(e?.rawMessage).toContain(words);
      }
    }
    // An HMAC signature covers the cursor: signed for one, asked with another, it is refused.
    const mine = createClient(AccountService, createConnectTransport({ baseUrl: gw.base, httpVersion: "1.1" }));
    const first = await mine.followMyCalls({ pageSize: 1 }, plain(a));
    const signingKey = await deriveSigningKey(a.secret);
    const signed = async (params: Record<string, string>) => {
      const timestamp = Math.floor(Date.now() / 1000);
      const nonce = newNonce();
      const signature = await signCall(signingKey, { method: "RPC", path: "/gateway.account.v1.AccountService/FollowMyCalls", params, timestamp, nonce });
      return { headers: { authorization: `GATEWAY-HMAC-SHA256 key=${a.key}, timestamp=${timestamp}, nonce=${nonce}, signature=${signature}` } };
    };
    const second = await mine.followMyCalls({ cursor: first.cursor, pageSize: 1 }, await signed({ cursor: first.cursor, page_size: "1" }));
    expect(second.calls.map((c) => c.requestId)).toEqual([made.a[1]]);
    const forged = await mine.followMyCalls({ cursor: second.cursor, pageSize: 1 }, await signed({ cursor: first.cursor, page_size: "1" })).then(
      () => "answered",
      (err: unknown) => ConnectError.from(err).findDetails(StatusBlockSchema)[0]?.errorCode,
    );
    expect(forged).toBe(ErrorCode.INVALID_CREDENTIALS);
    // Retention passed over the cursor: a 4003 that says what to do, in the team's own methods.
    (gw.runtime.meter as SqliteMeter).expire("9999-12-31");
    const folded = await mine.followMyCalls({ cursor: first.cursor }, plain(a)).catch((e: unknown) => ConnectError.from(e));
    expect(folded).toMatchObject({ code: Code.InvalidArgument });
    expect((folded as ConnectError).findDetails(StatusBlockSchema)[0]?.errorCode).toBe(ErrorCode.PARAM_ERROR);
    expect((folded as ConnectError).rawMessage).toContain("take the days folded from QueryMyUsage's totals");
  });

  it("`gateway feed` writes each call once across runs, saving its cursor, follows calls as they commit until SIGTERM, and refuses a cursor file it cannot use", async () => {
    const dir = mkdtempSync(join(tmpdir(), "gateway-feed-cli-"));
    try {
      const env = { GATEWAY_DATA_DIR: gw.config.dataDir };
      const file = join(dir, "cursor");
      // The request ids of a CSV feed, under its header.
      const idsOf = (csv: string) => {
        const [header, ...rows] = readCsv(csv);
        expect(header![0]).toBe("request_id");
        return rows.map((r) => r[0]);
      };
      await call();
      const whole = await runCli(["feed", "--csv"], env);
      expect(whole.code, whole.stderr).toBe(0);
      const before = idsOf(whole.stdout);
      expect(before.length).toBeGreaterThan(0);
      const first = await runCli(["feed", "--cursor-file", file, "--csv"], env);
      expect(first.code, first.stderr).toBe(0);
      expect(idsOf(first.stdout)).toEqual(before);
      const made = [await call(), await call()];
      const second = await runCli(["feed", "--cursor-file", file, "--json"], env);
      expect(second.code, second.stderr).toBe(0);
      const lines = second.stdout.trim().split("\n").map((l) => JSON.parse(l) as { requestId: string; code: string; account: string });
      expect(lines.map((l) => l.requestId)).toEqual(made);
      expect(lines[0]).toMatchObject({ code: "0000", account: gw.account.key });
      // Nothing new: nothing written, the cursor kept.
      const kept = readFileSync(file, "utf8");
      expect(await runCli(["feed", "--cursor-file", file], env)).toMatchObject({ code: 0, stdout: "" });
      expect(readFileSync(file, "utf8")).toBe(kept);

      // --follow: a call made while it runs is written as it commits; SIGTERM ends it after its page, exit 0.
      const child = spawn(process.execPath, [join(root, "bin", "gateway.js"), "feed", "--cursor-file", file, "--follow", "--every", "0.1", "--json"], {
        env: { ...process.env, ...env },
        stdio: ["ignore", "pipe", "pipe"],
      });
      let out = "";
      let err = "";
      child.stdout.on("data", (d: Buffer) => (out += d.toString()));
      child.stderr.on("data", (d: Buffer) => (err += d.toString()));
      // Started once it has saved nothing and written nothing for a moment; then a call.
      await new Promise((r) => setTimeout(r, 1500));
      const live = await call();
      const until = Date.now() + 20_000;
      while (!out.includes(live) && Date.now() < until) await new Promise((r) => setTimeout(r, 50));
      expect(out, err).toContain(live);
      child.kill("SIGTERM");
      const [code] = (await once(child, "exit")) as [number | null];
      expect(code, err).toBe(0);
      expect(err).toBe("");
      expect(await runCli(["feed", "--cursor-file", file], env)).toMatchObject({ code: 0, stdout: "" });
      expect(existsSync(`${file}.tmp`)).toBe(false);

      // --from-now with no cursor saved: none of the calls before it, the ledger's end saved; run again (with
      // --from-now still, as from cron), it reads on from the saved cursor: the call made between.
      const nowFile = join(dir, "now");
      expect(await runCli(["feed", "--cursor-file", nowFile, "--from-now", "--json"], env)).toMatchObject({ code: 0, stdout: "" });
      expect(readFileSync(nowFile, "utf8").trim()).not.toBe("");
      const between = await call();
      const onFromSaved = await runCli(["feed", "--cursor-file", nowFile, "--from-now", "--json"], env);
      expect(onFromSaved.code, onFromSaved.stderr).toBe(0);
      expect(onFromSaved.stdout.trim().split("\n").map((l) => (JSON.parse(l) as { requestId: string }).requestId)).toEqual([between]);
      const bare = await runCli(["feed", "--from-now", "--csv"], env);
      expect([bare.code, idsOf(bare.stdout)]).toEqual([0, []]);

      // A cursor file it did not write: exit 2, one line, nothing on stdout.
      writeFileSync(join(dir, "bad"), "not-a-cursor\n");
      const bad = await runCli(["feed", "--cursor-file", join(dir, "bad")], env);
      expect(bad.code).toBe(2);
      expect(bad.stdout).toBe("");
      expect(bad.stderr.trim().split("\n")).toHaveLength(1);
      expect(bad.stderr).toContain("the cursor is not one this gateway gave");
      expect((await runCli(["feed", "--every", "0"], env)).code).toBe(2);
      // A cursor file that cannot be saved (its directory is not there): exit 2 before any call is written.
      const unsaved = await runCli(["feed", "--cursor-file", join(dir, "missing", "cursor")], env);
      expect(unsaved).toMatchObject({ code: 2, stdout: "" });
      expect(unsaved.stderr).toContain("cannot save the cursor");
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }, 60_000);
});

describe("WatchCalls: following the ledger on one stream", () => {
  let gw: GatewayFixture;
  beforeAll(async () => {
    gw = await startGateway();
  });
  afterAll(() => gw.close());
  const headers = { authorization: `Bearer ${adminToken}` };

  const call = async () => {
    const r = await legacyGet(gw.base, "/retail/item_get/", { key: gw.account.key, secret: gw.account.secret, num_iid: demo.retailNumIid });
    expect(r.json.error_code).toBe("0000");
    return r.json.request_id as string;
  };

  /** A client transport of each protocol a stream is followed over: Connect, gRPC-Web and gRPC. */
  const streamTransports = () => [
    createConnectTransport({ baseUrl: gw.base, httpVersion: "1.1" }),
    createGrpcWebTransport({ baseUrl: gw.base, httpVersion: "1.1" }),
    createGrpcTransport({ baseUrl: gw.base }),
  ];

  /** Reads a stream's messages into a list as they come, until it ends; `ended` settles with its error, or undefined. */
  function reader(stream: AsyncIterable<{ calls: { requestId: string }[]; cursor: string }>) {
    const messages: { ids: string[]; cursor: string; at: number }[] = [];
    const ended = (async () => {
      try {
        for await (const m of stream) messages.push({ ids: m.calls.map((c) => c.requestId), cursor: m.cursor, at: Date.now() });
        return undefined;
      } catch (e) {
        return ConnectError.from(e);
      }
    })();
    const until = async (check: () => boolean, what: string, withinMs = 20_000) => {
      const deadline = Date.now() + withinMs;
      while (!check()) {
        if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}: ${JSON.stringify(messages)}`);
        await new Promise((r) => setTimeout(r, 20));
      }
    };
    return { messages, ended, until, ids: () => messages.flatMap((m) => m.ids) };
  }

  it("over Connect, gRPC-Web and gRPC: the calls after the cursor at once, then each call as it commits; the last cursor resumes with nothing lost or twice", async () => {
    for (const transport of streamTransports()) {
      const admin = createClient(AdminService, transport);
      const before = [await call(), await call()];
      // From the cursor before the last two calls.
      let start = "";
      for (;;) {
        const page = await admin.followCalls({ cursor: start, pageSize: 1 }, { headers });
        if (page.calls[0]?.requestId === before[0]) break;
        start = page.cursor;
      }
      const abort = new AbortController();
      const watch = reader(admin.watchCalls({ cursor: start }, { headers, signal: abort.signal }));
      await watch.until(() => watch.ids().length >= 2, "the calls already committed");
      expect(watch.messages[0]!.ids.slice(0, 2)).toEqual(before);
      const later = [await call(), await call(), await call()];
      // Rung by the commit, not found by a read 15 s later (the embedded store's stream reads only when rung, or to beat).
      await watch.until(() => watch.ids().length >= 5, "the calls made while it was open", 5000);
      expect(watch.ids()).toEqual([...before, ...later]);
      abort.abort();
      expect((await watch.ended)?.code).toBe(Code.Canceled);
      // Resumed from its last cursor: nothing again, and what comes next.
      const resumed = new AbortController();
      const again = reader(admin.watchCalls({ cursor: watch.messages.at(-1)!.cursor }, { headers, signal: resumed.signal }));
      await again.until(() => again.messages.length >= 1, "the first message");
      expect(again.messages[0]!.ids).toEqual([]);
      const next = await call();
      await again.until(() => again.ids().length >= 1, "the next call", 5000);
      expect(again.ids()).toEqual([next]);
      resumed.abort();
      await again.ended;
    }
    // Every stream that ended left nothing waiting on the commits.
    await new Promise((r) => setTimeout(r, 300));
    expect(gw.runtime.ledgerCommits.waiting).toBe(0);
  });

  it("from now, over Connect, gRPC-Web and gRPC: none of the calls before it, then each call as it commits; a cursor beside it is refused before any message", async () => {
    for (const transport of streamTransports()) {
      const admin = createClient(AdminService, transport);
      await call();
      const end = (await admin.followCalls({ fromNow: true }, { headers })).cursor;
      const abort = new AbortController();
      const watch = reader(admin.watchCalls({ fromNow: true }, { headers, signal: abort.signal }));
      await watch.until(() => watch.messages.length >= 1, "the first message");
      expect(watch.messages[0]).toMatchObject({ ids: [], cursor: end });
      const later = [await call(), await call()];
      await watch.until(() => watch.ids().length >= 2, "the calls made while it was open", 5000);
      expect(watch.ids()).toEqual(later);
      abort.abort();
      await watch.ended;
      const both = reader(admin.watchCalls({ fromNow: true, cursor: end }, { headers }));
      const refused = await both.ended;
      expect([refused?.code, both.messages.length]).toEqual([Code.InvalidArgument, 0]);
      expect(refused?.rawMessage).toContain("a cursor or from_now, not both");
    }
  });

  it("over HTTP/1.1, a caller that closes its socket on a quiet stream ends it at once, not at the next heartbeat; one that only ends its side is sent a heartbeat and followed on; health's Watch too", async () => {
    /** A Connect streaming call over HTTP/1.1 on a socket of its own: the messages as they come (JSON), and the socket. */
    const stream = async (on: GatewayFixture, path: string, request: object, extra: Record<string, string> = {}) => {
      const socket = net.connect({ port: on.port, host: "127.0.0.1" });
      await once(socket, "connect");
      const body = Buffer.from(JSON.stringify(request));
      const envelope = Buffer.alloc(5);
      envelope.writeUInt32BE(body.length, 1);
      const fields = Object.entries(extra).map(([k, v]) => `${k}: ${v}\r\n`).join("");
      socket.write(`POST ${path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/connect+json\r\nConnect-Protocol-Version: 1\r\n${fields}Content-Length: ${body.length + 5}\r\n\r\n`);
      socket.write(Buffer.concat([envelope, body]));
      let raw = Buffer.alloc(0);
      socket.on("data", (d: Buffer) => (raw = Buffer.concat([raw, d])));
      socket.on("error", () => undefined);
      /** The messages so far: the chunked body's envelopes, each parsed. */
      const messages = () => {
        const at = raw.indexOf("\r\n\r\n");
        if (at < 0) return [];
        let chunked = raw.subarray(at + 4);
        let data = Buffer.alloc(0);
        for (;;) {
          const eol = chunked.indexOf("\r\n");
          if (eol < 0) break;
          const size = parseInt(chunked.subarray(0, eol).toString(), 16);
          if (chunked.length < eol + 2 + size + 2) break;
          data = Buffer.concat([data, chunked.subarray(eol + 2, eol + 2 + size)]);
          chunked = chunked.subarray(eol + 2 + size + 2);
        }
        const out: Record<string, unknown>[] = [];
        while (data.length >= 5 && data.length >= 5 + data.readUInt32BE(1)) {
          out.push(JSON.parse(data.subarray(5, 5 + data.readUInt32BE(1)).toString()) as Record<string, unknown>);
          data = data.subarray(5 + data.readUInt32BE(1));
        }
        return out;
      };
      return { socket, messages };
    };
    const watchPath = "/gateway.admin.v1.AdminService/WatchCalls";
    const healthPath = "/grpc.health.v1.Health/Watch";
    const bell = gw.runtime.ledgerCommits;
    const readiness = gw.runtime.readiness;
    await expect.poll(() => bell.waiting).toBe(0);

    // Closed on a quiet stream: the stream ends within a moment (the heartbeat here is 15 s), nothing left waiting;
    // health's Watch, which sends nothing while the status holds, the same; and its SERVICE_UNKNOWN, held open.
    const closing = await stream(gw, watchPath, { fromNow: true }, headers);
    const health = await stream(gw, healthPath, {});
    const unknown = await stream(gw, healthPath, { service: "no.such.Service" });
    await expect.poll(() => [closing.messages().length, health.messages().length, unknown.messages().length]).toEqual([1, 1, 1]);
    expect([health.messages()[0], unknown.messages()[0]]).toEqual([{ status: "SERVING" }, { status: "SERVICE_UNKNOWN" }]);
    await expect.poll(() => [bell.waiting, readiness.watching]).toEqual([1, 1]);
    const open = async () => (await createClient(AdminService, createConnectTransport({ baseUrl: gw.base, httpVersion: "1.1" })).getConnections({}, { headers })).open;
    const withThem = await open();
    const closedAt = Date.now();
    for (const s of [closing, health, unknown]) s.socket.destroy();
    await expect.poll(() => [bell.waiting, readiness.watching], { timeout: 5000 }).toEqual([0, 0]);
    await expect.poll(open, { timeout: 5000 }).toBe(withThem - 3n);
    expect(Date.now() - closedAt).toBeLessThan(5000);

    // Only its side ended (as `printf … | nc` does): sent a heartbeat at once (no calls, the same cursor), and
    // still followed: the next call reaches it. Health's Watch sends its status again.
    const reading = await stream(gw, watchPath, { fromNow: true }, headers);
    const healthReading = await stream(gw, healthPath, {});
    await expect.poll(() => [reading.messages().length, healthReading.messages().length]).toEqual([1, 1]);
    const first = reading.messages()[0]!;
    reading.socket.end();
    healthReading.socket.end();
    await expect.poll(() => [reading.messages().length, healthReading.messages().length]).toEqual([2, 2]);
    expect(reading.messages()[1]).toEqual({ cursor: first.cursor });
    expect(healthReading.messages()[1]).toEqual({ status: "SERVING" });
    const next = await call();
    await expect.poll(() => reading.messages().length, { timeout: 5000 }).toBe(3);
    expect((reading.messages()[2]!.calls as { requestId: string }[]).map((c) => c.requestId)).toEqual([next]);
    expect([healthReading.messages().length, readiness.watching]).toEqual([2, 1]);
    for (const s of [reading, healthReading]) s.socket.destroy();

    // Closed after that, a stream is found by its next message: nothing tells it from a reader until something is
    // sent. On a gateway whose streams beat every second: within one or two.
    const quick = await startGateway({ app: { streamHeartbeatMs: 1000 } });
    try {
      const streams = [await stream(quick, watchPath, { fromNow: true }, headers), await stream(quick, healthPath, {}), await stream(quick, healthPath, { service: "no.such.Service" })];
      await expect.poll(() => streams.map((s) => s.messages().length)).toEqual([1, 1, 1]);
      for (const s of streams) s.socket.end();
      await expect.poll(() => streams.map((s) => s.messages().length)).toEqual([2, 2, 2]);
      // A reader that ended its side is sent the status again each beat while nothing changes: it is how one that goes is found.
      await expect.poll(() => streams[1]!.messages().length, { timeout: 5000 }).toBeGreaterThanOrEqual(3);
      expect(streams[1]!.messages().every((m) => m.status === "SERVING")).toBe(true);
      await expect.poll(() => [quick.runtime.ledgerCommits.waiting, quick.runtime.readiness.watching]).toEqual([1, 1]);
      const quickOpen = async () => (await createClient(AdminService, createConnectTransport({ baseUrl: quick.base, httpVersion: "1.1" })).getConnections({}, { headers })).open;
      const held = await quickOpen();
      for (const s of streams) s.socket.destroy();
      await expect.poll(() => [quick.runtime.ledgerCommits.waiting, quick.runtime.readiness.watching], { timeout: 5000 }).toEqual([0, 0]);
      await expect.poll(quickOpen, { timeout: 5000 }).toBe(held - 3n);
    } finally {
      await quick.close();
    }
  });

  it("for one account, over Connect and gRPC: FollowCalls and WatchCalls give only its calls, the others' read past and never sent, and refuse an account the gateway does not have (not_found)", async () => {
    const team = await gw.newAccount({ name: "watched-team" });
    const other = await gw.newAccount({ name: "unwatched-team" });
    const get = (t: { key: string; secret: string }) => legacyGet(gw.base, "/retail/item_get/", { key: t.key, secret: t.secret, num_iid: demo.retailNumIid }).then((r) => r.json.request_id as string);
    for (const transport of [createConnectTransport({ baseUrl: gw.base, httpVersion: "1.1" }), createGrpcTransport({ baseUrl: gw.base })]) {
      const admin = createClient(AdminService, transport);
      const before = (await admin.followCalls({ fromNow: true }, { headers })).cursor;
      const made = [await get(other), await get(team), await get(other), await get(team)];
      // From a cursor, the account's calls only; the cursor is the whole ledger's, so dropping the account reads on from it.
      const mine = await admin.followCalls({ cursor: before, account: team.key }, { headers });
      expect([mine.calls.map((c) => c.requestId), mine.caughtUp]).toEqual([[made[1], made[3]], true]);
      expect(mine.calls.every((c) => c.account === team.key)).toBe(true);
      expect((await admin.followCalls({ cursor: before }, { headers })).calls.map((c) => c.requestId)).toEqual(made);
      expect((await admin.followCalls({ cursor: mine.cursor }, { headers })).calls).toEqual([]);

      const abort = new AbortController();
      const watch = reader(admin.watchCalls({ fromNow: true, account: team.key }, { headers, signal: abort.signal }));
      await watch.until(() => watch.messages.length >= 1, "the first message");
      const later = [await get(other), await get(team), await get(other), await get(other), await get(team)];
      await watch.until(() => watch.ids().length >= 2, "the account's calls", 5000);
      await new Promise((r) => setTimeout(r, 300));
      expect(watch.ids()).toEqual([later[1], later[4]]);
      abort.abort();
      await watch.ended;

      for (const refused of [
        await admin.followCalls({ account: "no-such-account" }, { headers }).then(() => undefined, (e: unknown) => ConnectError.from(e)),
        await reader(admin.watchCalls({ fromNow: true, account: "no-such-account" }, { headers })).ended,
      ]) {
        expect(refused?.code).toBe(Code.NotFound);
        expect(refused?.rawMessage).toContain("no-such-account");
      }
    }
  });

  /** The AdminService at handler level over this gateway's stores, with a heartbeat and a draining flag of the test's own. */
  function handlers(heartbeatMs: number) {
    const readiness = { draining: false };
    const bell = new CommitBell();
    const ports = { ...gw.runtime, admin: gw.runtime.admin, ledgerCommits: bell, readiness };
    const transport = createRouterTransport(adminRoutes(ports, { token: adminToken, lockout: new MemoryAddressLockout(), watchHeartbeatMs: heartbeatMs }));
    return { admin: createClient(AdminService, transport), readiness, bell };
  }

  it("misses no ring that comes between its read and its wait: a commit while a message is being taken is sent at once, not at the next heartbeat", async () => {
    const bell = new CommitBell();
    const never = new AbortController().signal;
    // A ring since the follower last looked: its wait returns at once, and leaves nothing waiting.
    const seen = bell.rung;
    bell.ring();
    const started = Date.now();
    await bell.wait(60_000, never, seen);
    expect(Date.now() - started).toBeLessThan(1000);
    expect(bell.waiting).toBe(0);
    // None since: it waits for the next.
    let woken = false;
    const waiting = bell.wait(60_000, never, bell.rung).then(() => (woken = true));
    await new Promise((r) => setTimeout(r, 50));
    expect([woken, bell.waiting]).toEqual([false, 1]);
    bell.ring();
    await waiting;

    // Over a stream, on a bell that every commit rings (the embedded store's), so the stream reads only when rung
    // or at its heartbeat (a minute here). Its caller has taken the caught-up message and not yet asked for the
    // next, so the stream has not reached its wait when a call commits and rings: that ring must not be missed.
    const bellOfStream = new CommitBell(true);
    const ports = { ...gw.runtime, admin: gw.runtime.admin, ledgerCommits: bellOfStream, readiness: { draining: false } };
    const admin = createClient(AdminService, createRouterTransport(adminRoutes(ports, { token: adminToken, lockout: new MemoryAddressLockout(), watchHeartbeatMs: 60_000 })));
    const stream = admin.watchCalls({ cursor: (await admin.followCalls({ cursor: "", pageSize: 10_000 }, { headers })).cursor }, { headers })[Symbol.asyncIterator]();
    expect((await stream.next()).done).toBe(false);
    expect(bellOfStream.waiting).toBe(0);
    const id = await call();
    bellOfStream.ring();
    const next = (await Promise.race([stream.next(), new Promise((r) => setTimeout(() => r("missed"), 10_000))])) as IteratorResult<{ calls: { requestId: string }[] }> | "missed";
    expect(next === "missed" ? "missed" : next.value.calls.map((c: { requestId: string }) => c.requestId)).toEqual([id]);
    await stream.return?.();
  });

  it("sends a message with no calls after each quiet heartbeat, ends once caught up when the server drains, and refuses a cursor it did not give before any message", async () => {
    const { admin, readiness, bell } = handlers(300);
    const watch = reader(admin.watchCalls({}, { headers }));
    await watch.until(() => watch.messages.length >= 4, "three heartbeats");
    const quiet = watch.messages.slice(1);
    expect(quiet.every((m) => m.ids.length === 0 && m.cursor === watch.messages[0]!.cursor)).toBe(true);
    for (let i = 1; i < quiet.length; i++) expect(quiet[i]!.at - quiet[i - 1]!.at).toBeGreaterThanOrEqual(250);
    // Caught up, it waits on the commits, not in a read.
    expect(bell.waiting).toBe(1);
    readiness.draining = true;
    expect(await watch.ended).toBeUndefined();
    expect(bell.waiting).toBe(0);

    const refused = reader(admin.watchCalls({ cursor: "not-a-cursor" }, { headers }));
    expect((await refused.ended)?.code).toBe(Code.InvalidArgument);
    expect(refused.messages).toEqual([]);
    const unauthenticated = reader(admin.watchCalls({}));
    expect((await unauthenticated.ended)?.code).toBe(Code.Unauthenticated);
  });

  it("keeps its heartbeats when the wall clock steps back an hour (timed on a clock that does not step)", async () => {
    const { admin, readiness } = handlers(300);
    const watch = reader(admin.watchCalls({}, { headers }));
    await watch.until(() => watch.messages.length >= 1, "the first message");
    vi.useFakeTimers({ toFake: ["Date"] });
    try {
      vi.setSystemTime(Date.now() - 3_600_000);
      const before = watch.messages.length;
      await watch.until(() => watch.messages.length >= before + 3, "three heartbeats after the step", 5000);
    } finally {
      vi.useRealTimers();
    }
    readiness.draining = true;
    expect(await watch.ended).toBeUndefined();
  });

  it("ends a named admin's stream (unauthenticated) within a heartbeat of its token's revocation, quiet or busy", async () => {
    for (const busy of [false, true]) {
      const { admin } = handlers(busy ? 1000 : 200);
      const named = await gw.runtime.admins.add(`watcher-${busy ? "busy" : "quiet"}`);
      const watch = reader(admin.watchCalls({}, { headers: { authorization: `Bearer ${named.token}` } }));
      await watch.until(() => watch.messages.length >= 1, "the first message");
      // Busy: a call every 100 ms, so the stream always has calls to send and is never quiet for a heartbeat.
      let calling = busy;
      const calls = (async () => {
        while (calling) await Promise.all([call(), new Promise((r) => setTimeout(r, 100))]);
      })();
      if (busy) await watch.until(() => watch.ids().length >= 3, "calls");
      await gw.runtime.admins.revoke(named.admin.name);
      const ended = await watch.ended;
      calling = false;
      await calls;
      expect(ended?.code).toBe(Code.Unauthenticated);
      expect(ended?.rawMessage).toContain(`${named.admin.name} was revoked`);
    }
  });
});

describe("WatchCalls on a served gateway, with buf curl", () => {
  it("streams each call to buf curl as it commits, and on SIGTERM ends the stream cleanly and lets the gateway exit at once", async () => {
    const dataDir = mkdtempSync(join(tmpdir(), "gateway-watch-"));
    const gateway = spawn(process.execPath, [join(root, "bin", "gateway.js"), "serve", "--demo"], {
      env: { ...process.env, GATEWAY_DATA_DIR: dataDir, GATEWAY_PORT: "0", GATEWAY_DRAIN_DELAY_MS: "300", GATEWAY_LOG_LEVEL: "warn", GATEWAY_ADMIN_TOKEN: adminToken },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let output = "";
    gateway.stdout.on("data", (d: Buffer) => (output += d.toString()));
    gateway.stderr.on("data", (d: Buffer) => (output += d.toString()));
    const gatewayExit = once(gateway, "exit") as Promise<[number | null]>;
    let curl: ReturnType<typeof spawn> | undefined;
    try {
      const until = Date.now() + 30_000;
      while (!/Demo account/.test(output) && Date.now() < until) await new Promise((r) => setTimeout(r, 50));
      const base = /listening on (http:\/\/\S+) /.exec(output)![1]!;
      const [, key, secret] = /Demo account\s+key: (\S+)\s+secret: (\S+)/.exec(output)!;
      const call = async () => (await legacyGet(base, "/retail/item_get/", { key: key!, secret: secret!, num_iid: demo.retailNumIid })).json.request_id as string;
      const first = await call();
      // An independent client: buf curl, over gRPC on HTTP/2 without TLS, reading the schema from the proto files.
      curl = spawn(join(root, "node_modules", ".bin", "buf"), ["curl", "--protocol", "grpc", "--http2-prior-knowledge", "--schema", ".", "-H", `authorization: Bearer ${adminToken}`, "-d", "{}", `${base}/gateway.admin.v1.AdminService/WatchCalls`], {
        cwd: root,
        stdio: ["ignore", "pipe", "pipe"],
      });
      let streamed = "";
      let curlErr = "";
      curl.stdout!.on("data", (d: Buffer) => (streamed += d.toString()));
      curl.stderr!.on("data", (d: Buffer) => (curlErr += d.toString()));
      const curlExit = once(curl, "exit") as Promise<[number | null]>;
      const seen = async (id: string) => {
        const deadline = Date.now() + 20_000;
        while (!streamed.includes(id) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
        expect(streamed, curlErr).toContain(id);
      };
      await seen(first);
      const second = await call();
      await seen(second);
      const stopped = Date.now();
      gateway.kill("SIGTERM");
      // The stream ends with OK (buf curl exits 0), and the gateway is not held until the stream's next heartbeat (15 s).
      expect((await curlExit)[0], curlErr).toBe(0);
      expect((await gatewayExit)[0], output).toBe(0);
      expect(Date.now() - stopped).toBeLessThan(10_000);
      // Each message as buf curl prints it: JSON objects, the calls each with its cursor.
      const messages = streamed.trim().split(/\n(?=\{)/).map((m) => JSON.parse(m) as { calls?: { requestId: string }[]; cursor: string });
      expect(messages.flatMap((m) => m.calls ?? []).map((c) => c.requestId)).toEqual([first, second]);
      expect(messages.every((m) => m.cursor !== "")).toBe(true);
    } finally {
      curl?.kill("SIGKILL");
      gateway.kill("SIGKILL");
      rmSync(dataDir, { recursive: true, force: true });
    }
  }, 60_000);
});
