// The ledger's calls a page at a time: the AdminService's ListCalls, a team's own ListMyCalls and `gateway usage --rows
// all`. QueryUsage gave only the newest 10,000 rows, so a billing system could not read a month's calls whole, and a
// team could not look up the calls it was charged for. A page is read on from where the one before ended, in the
// order of the ledger's indexes: on both stores every filter pages to exactly the rows it matches, calls recorded
// between pages move nothing, a token is good only for its filter, and no page is sorted from the range's start.
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { deriveSigningKey, newNonce, signCall } from "../src/client/browser-signature.ts";
import { callPage, UsagePageError, maxCallPageSize, totalsPage } from "../src/core/usage-pages.ts";
import { usageSums, type LedgerRow, type Meter, type UsageQuery, type UsageTotal } from "../src/core/meter.ts";
import { AccountService } from "../src/gen/gateway/account/v1/account_pb.js";
import { AdminService } from "../src/gen/gateway/admin/v1/admin_pb.js";
import { ErrorCode, StatusBlockSchema } from "../src/gen/gateway/catalogue/v1/status_pb.js";
import { SqliteMeter } from "../src/stores/embedded/meter.ts";
import { InThreadReader, type SqlRead, type SqlReader } from "../src/stores/embedded/sql-reader.ts";
import { openDatabase } from "../src/stores/embedded/sqlite-database.ts";
import { PostgresMeter } from "../src/stores/postgres/meter.ts";
import { migrateSchema, openPostgres } from "../src/stores/postgres/postgres-database.ts";
import { root, runCli } from "./support/cli.ts";
import { spawn } from "node:child_process";
import { once } from "node:events";
import { readCsv } from "./support/csv.ts";
import { adminToken, demo, legacyGet, startGateway } from "./support/gateway-fixture.ts";
import { freshDatabase } from "./support/postgres.ts";

/**
 * A ledger of 2,503 rows: three accounts over three days, where one account's days run behind the others' (its zone),
 * so a day's calls of different accounts interleave in time; every fifth pair of rows shares a millisecond, so the
 * request id decides; two operations, two codes and two networks of addresses.
 */
function ledger(): LedgerRow[] {
  const rows: LedgerRow[] = [];
  const t0 = 1_790_000_000_000;
  for (let i = 0; i < 2503; i++) {
    const account = `acct${i % 3}`;
    const at = t0 + Math.floor(i / 2) * 1000 + (i % 10 === 1 ? -1000 : 0);
    const shift = account === "acct2" ? 700 : 0;
    const day = `2026-10-0${1 + Math.min(2, Math.floor(((i + shift) % 2503) / 900))}`;
    rows.push({
      requestId: `gw-${i % 2}.${(0x6b000000 + i * 7).toString(16)}`,
      at,
      day,
      account,
      operation: i % 4 === 0 ? "wholesale/item_get" : "retail/item_get",
      code: i % 9 === 0 ? ErrorCode.INSUFFICIENT_BALANCE : ErrorCode.SUCCESS,
      charge: i % 9 === 0 ? "uncharged" : "charged",
      price: i % 9 === 0 ? 0n : 50_000n,
      cacheHit: i % 2 === 0,
      upstreamRequests: 0,
      latencyMicros: 300 + i,
      transport: i % 3 === 0 ? "grpc" : "legacy",
      clientIp: i % 5 === 0 ? `10.9.0.${i % 200}` : `192.0.2.${i % 100}`,
    });
  }
  return rows;
}

/** The listing's order: by day, the newest first, then by time, then request id (byte order), the newest first. */
const newestFirst = (a: LedgerRow, b: LedgerRow) => (a.day !== b.day ? (a.day < b.day ? 1 : -1) : a.at !== b.at ? b.at - a.at : a.requestId < b.requestId ? 1 : a.requestId > b.requestId ? -1 : 0);

async function everyPage(meter: Pick<Meter, "calls">, filter: UsageQuery, pageSize: number): Promise<{ ids: string[]; pages: number }> {
  const ids: string[] = [];
  let pageToken = "";
  let pages = 0;
  do {
    const page = await callPage(meter, { filter, pageSize, pageToken });
    expect(page.rows.length).toBeLessThanOrEqual(pageSize);
    ids.push(...page.rows.map((r) => r.requestId));
    pageToken = page.nextPageToken;
    pages++;
    // A listing that does not move on ends here, failed, rather than never.
    expect(pages).toBeLessThanOrEqual(3000);
  } while (pageToken !== "");
  return { ids, pages };
}

const filters: [string, UsageQuery, (r: LedgerRow) => boolean][] = [
  ["everything", {}, () => true],
  ["one account", { account: "acct2" }, (r) => r.account === "acct2"],
  ["one day", { from: "2026-10-02", to: "2026-10-02" }, (r) => r.day === "2026-10-02"],
  ["an account over two days", { account: "acct0", from: "2026-10-02" }, (r) => r.account === "acct0" && r.day >= "2026-10-02"],
  ["an operation and a code", { operation: "wholesale/item_get", code: ErrorCode.INSUFFICIENT_BALANCE }, (r) => r.operation === "wholesale/item_get" && r.code === ErrorCode.INSUFFICIENT_BALANCE],
  ["a network", { address: "10.9.0.0/16" }, (r) => r.clientIp!.startsWith("10.9.")],
  ["one call", { requestId: "gw-1.6b0000e7" }, (r) => r.requestId === "gw-1.6b0000e7"],
];

interface Store {
  readonly meter: Meter;
  /** Another meter on the same store: another replica's, or this one's after a restart. */
  another(): Meter;
  insert(rows: readonly LedgerRow[]): Promise<void>;
  /** The plan of the statement the store read the last page with. */
  lastPlan(): Promise<string>;
  /** Runs statements written for both stores (the folded totals and counted refusals a ledger keeps beside its rows). */
  sql(text: string): Promise<void>;
  close(): Promise<void>;
}

/** The embedded store, its reads recorded so their plans can be read. */
function embedded(): Store {
  const dir = mkdtempSync(join(tmpdir(), "gateway-calls-"));
  const db = openDatabase(join(dir, "gateway.db"));
  const inner = new InThreadReader(db);
  let last: SqlRead | undefined;
  const reader: SqlReader = {
    read: (queries) => ((last = queries.at(-1)), inner.read(queries)),
    close: () => inner.close(),
  };
  const insert = db.prepare(
    "INSERT INTO ledger (request_id, at, day, account, operation, error_code, charge, price, cache_hit, latency_us, transport, client_ip) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
  );
  const others: ReturnType<typeof openDatabase>[] = [];
  return {
    meter: new SqliteMeter(db, { reader }),
    another() {
      const other = openDatabase(join(dir, "gateway.db"));
      others.push(other);
      return new SqliteMeter(other, {});
    },
    async insert(rows) {
      db.exec("BEGIN");
      for (const r of rows) insert.run(r.requestId, r.at, r.day, r.account!, r.operation!, r.code, r.charge, r.price, r.cacheHit ? 1 : 0, r.latencyMicros, r.transport, r.clientIp!);
      db.exec("COMMIT");
    },
    async sql(text) {
      db.exec(text);
    },
    async lastPlan() {
      return (db.prepare(`EXPLAIN QUERY PLAN ${last!.sql}`).all(last!.params) as { detail: string }[]).map((r) => r.detail).join(" | ");
    },
    async close() {
      for (const other of others) other.close();
      db.close();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** The shared store, on a database of its own; a plan is read with sorting priced out, so a sort shows only where no index gives the order. */
async function shared(): Promise<Store> {
  const own = await freshDatabase("call_pages");
  const pool = openPostgres(own.url, { max: 3 });
  await migrateSchema(pool);
  let last: [string, unknown[]] | undefined;
  const query = pool.query.bind(pool) as (...args: unknown[]) => Promise<unknown>;
  (pool as unknown as { query: (...args: unknown[]) => Promise<unknown> }).query = (...args: unknown[]) => {
    if (String(args[0]).includes("ORDER BY ledger.day DESC")) last = [args[0] as string, args[1] as unknown[]];
    return query(...args);
  };
  const meter = new PostgresMeter(pool, { holder: "pages" });
  const others: PostgresMeter[] = [];
  return {
    meter,
    another() {
      const other = new PostgresMeter(pool, { holder: `pages-${others.length + 2}` });
      others.push(other);
      return other;
    },
    async insert(rows) {
      for (let i = 0; i < rows.length; i += 500) {
        const part = rows.slice(i, i + 500);
        const values: unknown[] = [];
        const tuples = part.map((r) => {
          const n = values.push(r.requestId, r.at, r.day, r.account, r.operation, r.code, r.charge, r.price, r.cacheHit, r.latencyMicros, r.transport, r.clientIp);
          return `(${Array.from({ length: 12 }, (_, k) => `$${n - 11 + k}`).join(", ")})`;
        });
        await pool.query(
          `INSERT INTO ledger (request_id, at, day, account, operation, error_code, charge, price, cache_hit, latency_us, transport, client_ip) VALUES ${tuples.join(", ")}`,
          values,
        );
      }
      await pool.query("ANALYZE ledger");
    },
    async sql(text) {
      await pool.query(text);
    },
    async lastPlan() {
      const client = await (pool as pg.Pool).connect();
      try {
        await client.query("SET enable_sort = off");
        const plan = await client.query<{ "QUERY PLAN": string }>(`EXPLAIN ${last![0]}`, last![1]);
        return plan.rows.map((r) => r["QUERY PLAN"].trim()).join(" | ");
      } finally {
        client.release(true);
      }
    },
    async close() {
      meter.close();
      for (const other of others) other.close();
      await pool.end();
      await own.drop();
    },
  };
}

describe.each([
  ["the embedded store", async () => embedded()],
  ["the shared store (PostgreSQL)", shared],
])("calls a page at a time, %s", (_name, open) => {
  let store: Store;
  const rows = ledger();
  beforeAll(async () => {
    store = await open();
    await store.insert(rows);
  }, 60_000);
  afterAll(() => store.close());

  it.each(filters)("pages %s to exactly the rows it matches, newest first, each once", async (_what, filter, matches) => {
    const expected = rows.filter(matches).sort(newestFirst).map((r) => r.requestId);
    expect(expected.length).toBeGreaterThan(0);
    for (const size of [1000, 97]) {
      const { ids, pages } = await everyPage(store.meter, filter, size);
      expect(ids).toEqual(expected);
      expect(pages).toBe(Math.max(1, Math.ceil(expected.length / size)));
    }
  });

  it("keeps its place while calls are recorded between pages, and the first page of QueryUsage's rows is ListCalls' first", async () => {
    const filter = { account: "acct1" };
    const first = await callPage(store.meter, { filter, pageSize: 100 });
    expect((await store.meter.query({ ...filter, rows: 100 })).rows.map((r) => r.requestId)).toEqual(first.rows.map((r) => r.requestId));
    // Newer calls of the account, recorded now: they sort before the first page, so this listing never meets them.
    const later = Array.from({ length: 40 }, (_, i) => ({ ...rows[1]!, requestId: `gw-2.${(0x7c000000 + i).toString(16)}`, at: rows[1]!.at + 10_000_000 + i, day: "2026-10-03" }));
    await store.insert(later);
    const rest: string[] = [];
    let pageToken = first.nextPageToken;
    while (pageToken !== "") {
      const page = await callPage(store.meter, { filter, pageSize: 100, pageToken });
      rest.push(...page.rows.map((r) => r.requestId));
      pageToken = page.nextPageToken;
    }
    expect([...first.rows.map((r) => r.requestId), ...rest]).toEqual(rows.filter((r) => r.account === "acct1").sort(newestFirst).map((r) => r.requestId));
    // Asked from the start, they come first.
    expect((await callPage(store.meter, { filter, pageSize: 40 })).rows.map((r) => r.requestId)).toEqual(later.map((r) => r.requestId).reverse());
  });

  it.each([
    ["every total", {}],
    ["per address", { byAddress: true }],
    ["one account's per address over two days", { account: "acct1", from: "2026-10-02", byAddress: true }],
  ] as [string, UsageQuery][])("pages %s in their order, each once, with the sums over them all on every page", async (_what, filter) => {
    const whole = await store.meter.query(filter);
    expect(whole.totals.length).toBeGreaterThan(5);
    const sums = usageSums(whole.totals);
    for (const size of [7, 10_000]) {
      const seen: (typeof whole.totals)[number][] = [];
      let pageToken = "";
      do {
        const page = await totalsPage(store.meter, { filter: { ...filter, rows: 3 }, pageSize: size, pageToken });
        expect(page.sums).toEqual(sums);
        // The rows come with the first page only.
        expect(page.rows).toHaveLength(seen.length === 0 ? 3 : 0);
        expect(page.totals.length).toBeLessThanOrEqual(size);
        seen.push(...page.totals);
        pageToken = page.nextPageToken;
        // A listing that does not move on ends here, failed, rather than never.
        expect(seen.length).toBeLessThanOrEqual(whole.totals.length);
      } while (pageToken !== "");
      expect(seen).toEqual(whole.totals);
    }
    // A token is good only for its filter, by_address included, and only with a page size.
    const first = await totalsPage(store.meter, { filter, pageSize: 2 });
    await expect(totalsPage(store.meter, { filter: { ...filter, byAddress: !filter.byAddress }, pageSize: 2, pageToken: first.nextPageToken })).rejects.toThrow(/given for another filter/);
    await expect(callPage(store.meter, { filter, pageSize: 2, pageToken: first.nextPageToken })).rejects.toThrow(/not one this gateway gave|given for another filter/);
    await expect(totalsPage(store.meter, { filter, pageToken: first.nextPageToken })).rejects.toThrow(/goes with a page size/);
  });

  it("reads a page deep in the ledger along an index, never sorting the range", async () => {
    const cases: UsageQuery[] = [{}, { account: "acct0" }, { from: "2026-10-01", to: "2026-10-02" }, { account: "acct2", from: "2026-10-02", to: "2026-10-03" }];
    for (const filter of cases) {
      const first = await callPage(store.meter, { filter, pageSize: 50 });
      const plans = [await store.lastPlan()];
      await callPage(store.meter, { filter, pageSize: 50, pageToken: first.nextPageToken });
      plans.push(await store.lastPlan());
      for (const plan of plans) {
        expect(plan, JSON.stringify(filter)).toMatch(/ledger_by_(account_)?day/);
        // No sort of the range: at most the calls of one millisecond, by request id (SQLite's "last term",
        // PostgreSQL's incremental sort over rows the index gives by day and time).
        expect(plan, JSON.stringify(filter)).not.toMatch(/TEMP B-TREE FOR ORDER BY|(^|\| )(->  )?Sort  \(/);
        if (plan.includes("Incremental Sort")) expect(plan).toContain("Presorted Key: day, at");
      }
      // The next page enters the index at the place the first ended, not at the range's newest end.
      expect(plans[1], JSON.stringify(filter)).toMatch(/\(day,at\)<\(\?,\?\)|ROW\(day, at\) <= ROW/);
    }
  });
});

/** Calendar days from `a` through `b`, both counted. */
const daysFrom = (a: string, b: string) => Math.round((Date.parse(b) - Date.parse(a)) / 86_400_000) + 1;

describe.each([
  ["the embedded store", async () => embedded()],
  ["the shared store (PostgreSQL)", shared],
])("totals a page at a time, %s", (_name, open) => {
  // Seven weeks of calls with a day in three missing, a day's totals by address from one to five, two days folded
  // past retention and refusals counted on days with no row: a page must read the days it lists, not the range.
  let store: Store;
  const rows: LedgerRow[] = [];
  beforeAll(async () => {
    store = await open();
    for (let d = 0; d < 47; d++) {
      if (d % 3 === 1) continue;
      const day = new Date(Date.UTC(2026, 8, 20 + d)).toISOString().slice(0, 10);
      for (let i = 0; i < 12; i++) {
        rows.push({
          requestId: `gw-3.${(d * 100 + i).toString(16).padStart(8, "0")}`,
          at: Date.parse(`${day}T08:00:00Z`) + i * 1000,
          day,
          account: `t${i % 3}`,
          operation: "retail/item_get",
          code: ErrorCode.SUCCESS,
          charge: "charged",
          price: 10_000n,
          cacheHit: i % 2 === 0,
          upstreamRequests: i % 2,
          latencyMicros: 100,
          transport: "legacy",
          clientIp: `198.51.100.${i % (1 + (d % 5))}`,
        });
      }
    }
    await store.insert(rows);
    await store.sql(`INSERT INTO ledger_daily_totals (day, account, operation, error_code, charge, calls, amount, cache_hits, upstream_requests) VALUES
      ('2026-09-10', 't0', 'retail/item_get', 0, 'charged', 40, 400000, 10, 30), ('2026-09-11', 't1', 'retail/item_get', 0, 'charged', 7, 70000, 0, 7)`);
    await store.sql(`INSERT INTO refusals (day, operation, error_code, charge, client_ip, transport, calls) VALUES
      ('2026-09-10', 'retail/item_get', 4011, 'uncharged', '203.0.113.9', 'legacy', 5), ('2026-10-02', 'retail/item_get', 4011, 'uncharged', '203.0.113.9', 'legacy', 3),
      ('2026-11-09', 'retail/item_get', 4011, 'uncharged', '203.0.113.10', 'grpc', 2)`);
  }, 60_000);
  afterAll(() => store.close());

  /** The store, with the day windows each page reads and the times the sums are read recorded. */
  function recorded(of: Meter = store.meter) {
    const windows: { from: string; through: string }[] = [];
    let sumReads = 0;
    const meter: Pick<Meter, "query" | "calls" | "usageSums" | "usageDays" | "pageKey"> = {
      query: (q) => (q.totalsPage !== undefined && windows.push(q.totalsPage.days), of.query(q)),
      calls: (...a) => of.calls(...a),
      usageSums: (q) => (sumReads++, of.usageSums(q)),
      usageDays: (q) => of.usageDays(q),
      pageKey: () => of.pageKey(),
    };
    return { meter, windows, sumReads: () => sumReads };
  }

  it.each([
    ["every total", {}],
    ["per address", { byAddress: true }],
    ["one account's per address", { account: "t1", byAddress: true }],
    ["three weeks per address", { from: "2026-10-01", to: "2026-10-21", byAddress: true }],
    ["one network", { address: "198.51.100.0/30", byAddress: true }],
  ] as [string, UsageQuery][])("pages %s in their order, each page reading about the days it lists, the sums once", async (_what, filter) => {
    const whole = await store.meter.query(filter);
    expect(whole.totals.length).toBeGreaterThan(20);
    const sums = usageSums(whole.totals);
    const range = (await store.meter.usageDays(filter))!;
    expect(range.first <= whole.totals[0]!.day && whole.totals.at(-1)!.day <= range.last).toBe(true);
    for (const size of [1, 4, 25]) {
      const r = recorded();
      const seen: UsageTotal[] = [];
      let pageToken = "";
      do {
        r.windows.length = 0;
        const page = await totalsPage(r.meter, { filter: { ...filter, rows: 2 }, pageSize: size, pageToken });
        expect(page.sums).toEqual(sums);
        expect(page.rows).toHaveLength(seen.length === 0 ? Math.min(2, rows.filter((row) => (filter.account === undefined || row.account === filter.account) && (filter.from === undefined || row.day >= filter.from) && (filter.to === undefined || row.day <= filter.to) && (filter.address === undefined || Number(row.clientIp!.split(".")[3]) < 4)).length) : 0);
        // The page's windows start where the page before ended and follow each other; read together, they span at
        // most twice the days from there to the total past the page (the range's end, for the last page).
        const start = seen.length === 0 ? range.first : seen.at(-1)!.day;
        expect(r.windows[0]?.from ?? start).toBe(start);
        for (let i = 1; i < r.windows.length; i++) expect(daysFrom(r.windows[i - 1]!.through, r.windows[i]!.from)).toBe(2);
        const past = whole.totals[seen.length + size]?.day ?? range.last;
        const read = r.windows.reduce((n, w) => n + daysFrom(w.from, w.through), 0);
        expect(read, `page after ${seen.length} totals read ${JSON.stringify(r.windows)}`).toBeLessThanOrEqual(2 * daysFrom(start, past));
        seen.push(...page.totals);
        pageToken = page.nextPageToken;
        expect(seen.length).toBeLessThanOrEqual(whole.totals.length);
      } while (pageToken !== "");
      expect(seen).toEqual(whole.totals);
      // Read with the first page; every later page carries them in its token.
      expect(r.sumReads()).toBe(1);
    }
  });

  it("refuses a report asked whole that holds more totals than one answer may, reading one more than it allows, not the rest", async () => {
    const filter: UsageQuery = { byAddress: true };
    const whole = await store.meter.query(filter);
    const answered: number[] = [];
    const meter: Pick<Meter, "query" | "calls" | "usageSums" | "usageDays" | "pageKey"> = {
      ...recorded().meter,
      query: async (q) => {
        const report = await store.meter.query(q);
        answered.push(report.totals.length);
        return report;
      },
    };
    await expect(totalsPage(meter, { filter, maxWholeTotals: 5 })).rejects.toMatchObject({ of: "large", message: expect.stringContaining("more than 5 totals") });
    // Read a window of days at a time, each asked for no more than are still wanted: six in all, not the rest.
    expect(answered.reduce((n, a) => n + a, 0)).toBe(6);
    // As many as it may hold: given whole, as before.
    const exact = await totalsPage(meter, { filter, maxWholeTotals: whole.totals.length });
    expect(exact.totals).toEqual(whole.totals);
    expect(exact.sums).toEqual(usageSums(whole.totals));
  });

  it("reads the sums again for a token whose sums it did not seal, and refuses a token's day that is no day", async () => {
    const filter: UsageQuery = { byAddress: true };
    const sums = usageSums((await store.meter.query(filter)).totals);
    const r = recorded();
    const first = await totalsPage(r.meter, { filter, pageSize: 3 });
    const fields = JSON.parse(Buffer.from(first.nextPageToken, "base64url").toString("utf8")) as (string | number)[];
    expect(fields).toHaveLength(13);
    const token = (f: (string | number)[]) => Buffer.from(JSON.stringify(f), "utf8").toString("base64url");
    const second = await totalsPage(r.meter, { filter, pageSize: 3, pageToken: first.nextPageToken });
    expect(r.sumReads()).toBe(1);
    // Sums changed in the token: not believed, read again.
    const forged = fields.slice();
    forged[6] = String(BigInt(forged[6] as string) + 1000n);
    const again = await totalsPage(r.meter, { filter, pageSize: 3, pageToken: token(forged) });
    expect(again.sums).toEqual(sums);
    expect(again.totals).toEqual(second.totals);
    expect(r.sumReads()).toBe(2);
    // A token as a gateway before the sums were carried gave it (a place alone): the same page, its sums read again.
    const placeOnly = await totalsPage(r.meter, { filter, pageSize: 3, pageToken: token([...fields.slice(0, 6), fields.at(-1)!]) });
    expect(placeOnly.totals).toEqual(second.totals);
    expect(placeOnly.sums).toEqual(sums);
    expect(r.sumReads()).toBe(3);
    // A day the calendar does not have cannot be counted on from.
    await expect(totalsPage(r.meter, { filter, pageSize: 3, pageToken: token(["2026-02-30", ...fields.slice(1)]) })).rejects.toThrow(/not one this gateway gave/);
  });

  it("carries the sums to a page another replica answers, or this one after a restart, under the key the store keeps", async () => {
    const filter: UsageQuery = { byAddress: true };
    const a = recorded();
    const first = await totalsPage(a.meter, { filter, pageSize: 3 });
    expect(a.sumReads()).toBe(1);
    // Another meter on the store (another process) reads the same key, and believes the token's sums.
    const other = store.another();
    const key = await other.pageKey();
    expect([key.length, key.some((b) => b !== 0)]).toEqual([32, true]);
    expect(key).toEqual(await store.meter.pageKey());
    const b = recorded(other);
    const second = await totalsPage(b.meter, { filter, pageSize: 3, pageToken: first.nextPageToken });
    expect([b.sumReads(), second.sums]).toEqual([0, first.sums]);
    // A token sealed under another key (another store's): its sums are read again, never believed.
    const c = recorded();
    const elsewhere = { ...c.meter, pageKey: async () => new Uint8Array(32).fill(7) };
    const third = await totalsPage(elsewhere, { filter, pageSize: 3, pageToken: first.nextPageToken });
    expect([c.sumReads(), third.sums, third.totals]).toEqual([1, first.sums, second.totals]);
  });
});

describe("page sizes and tokens", () => {
  const seen: number[] = [];
  const meter = {
    calls: async (_q: UsageQuery, _after: unknown, limit: number) => {
      seen.push(limit);
      return [];
    },
  };

  it("takes 1000 when none is named and at most 10,000, asking the store for one more to know whether a page follows", async () => {
    await callPage(meter, { filter: {} });
    await callPage(meter, { filter: {}, pageSize: 20_000 });
    await callPage(meter, { filter: {}, pageSize: 3 });
    expect(seen).toEqual([1001, maxCallPageSize + 1, 4]);
  });

  it("refuses a negative size, a token it did not give, and a token given for another filter", async () => {
    const store = embedded();
    try {
      await store.insert(ledger().slice(0, 30));
      const page = await callPage(store.meter, { filter: { account: "acct0" }, pageSize: 2 });
      await expect(callPage(store.meter, { filter: {}, pageSize: -1 })).rejects.toThrow(UsagePageError);
      for (const token of ["garbage", Buffer.from('["2026-10-01","x","id","d"]').toString("base64url"), page.nextPageToken.slice(0, -4)]) {
        await expect(callPage(store.meter, { filter: { account: "acct0" }, pageToken: token })).rejects.toThrow(/not one this gateway gave/);
      }
      for (const other of [{ account: "acct1" }, { account: "acct0", to: "2026-10-02" }, { account: "acct0", code: ErrorCode.SUCCESS }]) {
        await expect(callPage(store.meter, { filter: other, pageToken: page.nextPageToken })).rejects.toThrow(/given for another filter/);
      }
    } finally {
      await store.close();
    }
  });
});

describe("ListCalls, ListMyCalls and the CLI over a running gateway", () => {
  const ok = { headers: { authorization: `Bearer ${adminToken}` } };

  it("lists a team's own calls to it, and the operator every call, page by page", async () => {
    const gw = await startGateway();
    try {
      const a = await gw.newAccount({ name: "pages-a" });
      const b = await gw.newAccount({ name: "pages-b" });
      const asked: string[] = [];
      for (let i = 0; i < 5; i++) asked.push(String((await legacyGet(gw.base, "/retail/item_get/", { key: a.key, secret: a.secret, num_iid: demo.retailNumIid })).json.request_id));
      asked.push(String((await legacyGet(gw.base, "/retail/item_get/", { key: a.key, secret: a.secret, num_iid: "x" })).json.request_id));
      await legacyGet(gw.base, "/retail/item_get/", { key: b.key, secret: b.secret, num_iid: demo.retailNumIid });
      const mine = createClient(AccountService, createConnectTransport({ baseUrl: gw.base, httpVersion: "1.1" }));
      const plain = (t: { key: string; secret: string }) => ({ headers: { "x-api-key": t.key, "x-api-secret": t.secret } });

      // Two at a time, newest first: every call of the team, none of the other's, each as its answer named it.
      const seen: string[] = [];
      let pageToken = "";
      do {
        const page = await mine.listMyCalls({ pageSize: 2, pageToken }, plain(a));
        seen.push(...page.calls.map((c) => c.requestId));
        pageToken = page.nextPageToken;
      } while (pageToken !== "");
      expect(seen).toEqual([...asked].reverse());
      const refused = await mine.listMyCalls({ errorCode: ErrorCode.PARAM_ERROR }, plain(a));
      expect(refused.calls.map((c) => [c.requestId, c.errorCode, c.price, c.transport])).toEqual([[asked[5], ErrorCode.PARAM_ERROR, "0", "legacy"]]);

      // Reading is not calling: nothing charged, nothing added to the ledger.
      expect((await mine.getMyAccount({}, plain(a))).today).toBe(5n);
      expect((await mine.listMyCalls({}, plain(a))).calls).toHaveLength(6);

      // Another team's token is the spec's 4015 (wrong page token) with its status block, over gRPC as well: it was
      // made for another account. So is one the gateway never gave; a day out of form or a negative size is a 4003.
      const token = (await mine.listMyCalls({ pageSize: 1 }, plain(a))).nextPageToken;
      const grpc = createClient(AccountService, createGrpcTransport({ baseUrl: gw.base }));
      for (const [client, req, who, expected] of [
        [mine, { pageToken: token }, b, [Code.InvalidArgument, ErrorCode.WRONG_PAGE_TOKEN, "4015 the page token was given for another filter; ask the first page again"]],
        [grpc, { pageToken: token }, b, [Code.InvalidArgument, ErrorCode.WRONG_PAGE_TOKEN, "4015 the page token was given for another filter; ask the first page again"]],
        [mine, { pageToken: "bm90IGEgdG9rZW4" }, a, [Code.InvalidArgument, ErrorCode.WRONG_PAGE_TOKEN, "4015 the page token is not one this gateway gave"]],
        [mine, { from: "2026-13" }, a, [Code.InvalidArgument, ErrorCode.PARAM_ERROR, 'from: a day is YYYY-MM-DD, not "2026-13"']],
        // A day the calendar does not have is not compared as text (it matched nothing, or every day after it).
        [mine, { to: "2026-02-29" }, a, [Code.InvalidArgument, ErrorCode.PARAM_ERROR, 'to: a day is YYYY-MM-DD, not "2026-02-29"']],
        [grpc, { pageSize: -1 }, a, [Code.InvalidArgument, ErrorCode.PARAM_ERROR, "4003 the page size must be a whole number, 0 (the default, 1000) or more"]],
      ] as const) {
        const e = await client.listMyCalls(req, plain(who)).then(() => undefined, (err: unknown) => ConnectError.from(err));
        const status = e?.findDetails(StatusBlockSchema)[0];
        expect([e?.code, status?.errorCode, e?.rawMessage.includes(expected[2]) ? expected[2] : e?.rawMessage]).toEqual(expected);
        expect(status?.error).toBe(expected[1] === ErrorCode.WRONG_PAGE_TOKEN ? "wrong-page-token" : "param-error");
      }

      // An HMAC signature covers what the call asks: the page token included.
      const signingKey = await deriveSigningKey(a.secret);
      const path = "/gateway.account.v1.AccountService/ListMyCalls";
      const signed = async (params: Record<string, string>) => {
        const timestamp = Math.floor(Date.now() / 1000);
        const nonce = newNonce();
        const signature = await signCall(signingKey, { method: "RPC", path, params, timestamp, nonce });
        return { headers: { authorization: `GATEWAY-HMAC-SHA256 key=${a.key}, timestamp=${timestamp}, nonce=${nonce}, signature=${signature}` } };
      };
      const second = await mine.listMyCalls({ pageSize: 1, pageToken: token }, await signed({ page_size: "1", page_token: token }));
      expect(second.calls.map((c) => c.requestId)).toEqual([asked[4]]);
      const forged = await mine.listMyCalls({ pageSize: 1, pageToken: second.nextPageToken }, await signed({ page_size: "1", page_token: token })).then(
        () => "answered",
        (err: unknown) => ConnectError.from(err).findDetails(StatusBlockSchema)[0]?.errorCode,
      );
      expect(forged).toBe(ErrorCode.INVALID_CREDENTIALS);

      // The operator: every call of both teams; a filter is held to its token; a day out of form is refused.
      const admin = createClient(AdminService, createConnectTransport({ baseUrl: gw.base, httpVersion: "1.1" }));
      const all = await admin.listCalls({}, ok);
      expect(all.calls.filter((c) => c.account === a.key).map((c) => c.requestId)).toEqual([...asked].reverse());
      expect(all.calls.filter((c) => c.account === b.key)).toHaveLength(1);
      // QueryUsage's totals a page at a time, the sums over both pages on each.
      const one = await admin.queryUsage({ account: a.key, pageSize: 1 }, ok);
      const two = await admin.queryUsage({ account: a.key, pageSize: 1, pageToken: one.nextPageToken }, ok);
      expect([one.totals.map((t) => t.errorCode), two.totals.map((t) => t.errorCode), two.nextPageToken]).toEqual([[ErrorCode.SUCCESS], [ErrorCode.PARAM_ERROR], ""]);
      expect([one.calls, two.calls, one.chargedCalls, two.amount]).toEqual([6n, 6n, 5n, "0"]);
      const firstOfA = await admin.listCalls({ account: a.key, pageSize: 4 }, ok);
      expect((await admin.listCalls({ account: a.key, pageToken: firstOfA.nextPageToken }, ok)).calls.map((c) => c.requestId)).toEqual([asked[1], asked[0]]);
      for (const [req, message] of [
        [{ account: b.key, pageToken: firstOfA.nextPageToken }, "given for another filter"],
        [{ from: "yesterday" }, "a day is YYYY-MM-DD"],
        [{ from: "2026-02-30" }, 'from: a day is YYYY-MM-DD, not "2026-02-30"'],
        [{ to: "2026-13-45" }, 'to: a day is YYYY-MM-DD, not "2026-13-45"'],
        [{ pageSize: -5 }, "page size"],
      ] as const) {
        const e = await admin.listCalls(req, ok).then(() => undefined, (err: unknown) => ConnectError.from(err));
        expect([e?.code, e?.rawMessage]).toEqual([Code.InvalidArgument, expect.stringContaining(message)]);
      }
      // QueryUsage reads its days as ListCalls does: one that is not a day is refused, not compared as text.
      for (const req of [{ from: "yesterday" }, { to: "2026-10" }, { from: "2026-10-01", to: "2026-10-31x", pageSize: 5 }, { from: "2026-11-01", to: "2026-11-31" }]) {
        const e = await admin.queryUsage(req, ok).then(() => undefined, (err: unknown) => ConnectError.from(err));
        expect([e?.code, e?.rawMessage]).toEqual([Code.InvalidArgument, expect.stringContaining("a day is YYYY-MM-DD")]);
      }
    } finally {
      await gw.close();
    }
  });

  it("writes every row of a filter with `usage --rows all`, a page at a time, as CSV and as JSON", async () => {
    const dir = mkdtempSync(join(tmpdir(), "gateway-calls-cli-"));
    try {
      // More rows than one page holds (10,000), so the listing runs over two.
      const db = openDatabase(join(dir, "gateway.db"));
      const insert = db.prepare(
        "INSERT INTO ledger (request_id, at, day, account, operation, error_code, charge, price, cache_hit, latency_us, transport, client_ip) VALUES (?, ?, '2026-10-01', ?, 'retail/item_get', 0, 'charged', 50000, 0, 300, 'legacy', '192.0.2.1')",
      );
      db.exec("BEGIN");
      for (let i = 0; i < 12_345; i++) insert.run(`gw-0.${(0x6b000000 + i).toString(16)}`, 1_790_000_000_000 + i, i % 2 === 0 ? "cli0" : "cli1");
      db.exec("COMMIT");
      db.close();
      const env = { GATEWAY_DATA_DIR: dir };
      const csv = await runCli(["usage", "--rows", "all", "--csv"], env);
      expect(csv.code, csv.stderr).toBe(0);
      const table = readCsv(csv.stdout);
      expect(table[0]).toEqual(["request_id", "time", "day", "account", "operation", "code", "charge", "price", "cache_hit", "latency_us", "transport", "client_ip", "upstream_requests"]);
      const ids = table.slice(1).map((r) => r[0]);
      expect(ids).toHaveLength(12_345);
      expect(new Set(ids).size).toBe(12_345);
      expect([ids[0], ids.at(-1)]).toEqual([`gw-0.${(0x6b000000 + 12_344).toString(16)}`, "gw-0.6b000000"]);
      const json = await runCli(["usage", "--account", "cli1", "--rows", "all", "--json"], env);
      expect(json.code, json.stderr).toBe(0);
      const parsed = JSON.parse(json.stdout) as { totals: { calls: number }[]; rows: { requestId: string; account: string; code: string; price: string }[] };
      expect(parsed.totals.map((t) => t.calls)).toEqual([6172]);
      expect(parsed.rows).toHaveLength(6172);
      expect(parsed.rows.every((r) => r.account === "cli1" && r.code === "0000" && r.price === "0.05")).toBe(true);
      // A reader that goes after the first bytes (`| head`) ends the listing quietly: no stack, exit 0.
      const child = spawn(process.execPath, [join(root, "bin", "gateway.js"), "usage", "--rows", "all", "--csv"], { env: { ...process.env, ...env }, stdio: ["ignore", "pipe", "pipe"] });
      let stderr = "";
      child.stderr.on("data", (d: Buffer) => (stderr += d.toString()));
      child.stdout.once("data", () => child.stdout.destroy());
      const [code] = (await once(child, "close")) as [number | null];
      expect([code, stderr]).toEqual([0, ""]);
      const bad = await runCli(["usage", "--rows", "every"], env);
      expect([bad.code, bad.stderr.trim()]).toEqual([2, expect.stringContaining("--rows takes a number up to 99999, or all")]);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }, 60_000);
});
