// Where each call came from: the caller's address in its ledger row, and usage asked for by address or network,
// per address, on both stores; then the gateway behind a trusted proxy (so each call says which address it comes
// from) over every transport, read back through the AdminService and the CLI.
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type pg from "pg";
import { addressesIn, usageAddressFilter } from "../src/core/allowed-addresses.ts";
import type { LedgerRow, Meter, UsageReport } from "../src/core/meter.ts";
import { AdminService } from "../src/gen/gateway/admin/v1/admin_pb.js";
import { RetailService } from "../src/gen/gateway/catalogue/v1/retail_pb.js";
import { SqliteMeter } from "../src/stores/embedded/meter.ts";
import { openDatabase } from "../src/stores/embedded/sqlite-database.ts";
import { PostgresMeter } from "../src/stores/postgres/meter.ts";
import { migrateSchema, openPostgres } from "../src/stores/postgres/postgres-database.ts";
import { runCli } from "./support/cli.ts";
import { adminToken, demo, startGateway, type GatewayFixture } from "./support/gateway-fixture.ts";
import { freshDatabase } from "./support/postgres.ts";
import { readCsv } from "./support/csv.ts";

describe("an address filter", () => {
  it("is one address or network in one written form, and matches the addresses of either family it holds", () => {
    expect(["10.0.0.0/08", "::ffff:10.1.2.3", "2001:db8::/32", " 203.0.113.7 "].map(usageAddressFilter)).toEqual(["10.0.0.0/8", "10.1.2.3", "2001:db8::/32", "203.0.113.7"]);
    for (const bad of ["10.0.0.0/33", "10.0.0.0/8, 11.0.0.0/8", "example.com", "", "other"]) expect(() => usageAddressFilter(bad), bad).toThrow();
    const held = ["10.1.2.3", "::ffff:10.9.9.9", "11.0.0.1", "2001:db8::7", "other", ""];
    expect(addressesIn("10.0.0.0/8", held)).toEqual(["10.1.2.3", "::ffff:10.9.9.9"]);
    expect(addressesIn("2001:db8::/32", held)).toEqual(["2001:db8::7"]);
    expect(addressesIn("10.9.9.9", held)).toEqual(["::ffff:10.9.9.9"]);
  });
});

// The same calls recorded in each store, and the same answers asked of it.
const day = "2026-11-24";
let ids = 0;
function row(account: string | undefined, clientIp: string | undefined, charge: LedgerRow["charge"] = "charged", cacheHit = false): LedgerRow {
  return {
    requestId: `addr-${String(++ids).padStart(8, "0")}`, at: Date.UTC(2026, 10, 24, 3, 0, 0, ids), day, account, operation: "retail/item_get",
    code: charge === "charged" ? 0 : charge === "ignored" ? 4003 : 4000, charge, price: charge === "charged" ? 50_000n : 0n, cacheHit, upstreamRequests: 0, latencyMicros: 10, transport: "legacy", clientIp,
  };
}

async function recordCalls(meter: Meter, a: string, b: string): Promise<LedgerRow[]> {
  const rows = [
    row(a, "10.1.2.3"),
    row(a, "10.1.2.3", "charged", true),
    // An IPv4 caller on a dual-stack socket, as Node reports it.
    row(a, "::ffff:10.9.9.9"),
    row(a, "2001:db8::7", "ignored"),
    // Written before the ledger kept addresses.
    row(a, undefined),
    row(b, "10.1.2.3"),
    // No account: counted per address, not stored as a row.
    row(undefined, "198.51.100.7", "ignored"),
    row(undefined, "198.51.100.7", "ignored"),
  ];
  await Promise.all(rows.map((r) => meter.record(r, undefined)));
  await meter.flush();
  return rows;
}

/** A report's totals as `account address charge calls amount hits`, in its order. */
const lines = (r: UsageReport) => r.totals.map((t) => `${t.account ?? "-"} ${t.clientIp ?? "?"} ${t.charge} ${t.calls} ${t.amount} ${t.cacheHits}`);

async function expectAddresses(meter: Meter, a: string, b: string, recorded: LedgerRow[]): Promise<void> {
  const all = await meter.query({ from: day, to: day, byAddress: true, rows: 20 });
  expect(lines(all)).toEqual([
    "- 198.51.100.7 ignored 2 0 0",
    `${a}  charged 1 50000 0`,
    `${a} 10.1.2.3 charged 2 100000 1`,
    `${a} ::ffff:10.9.9.9 charged 1 50000 0`,
    `${a} 2001:db8::7 ignored 1 0 0`,
    `${b} 10.1.2.3 charged 1 50000 0`,
  ]);
  expect(all.rows.map((r) => `${r.account} ${r.clientIp ?? "(none)"}`)).toEqual([
    `${b} 10.1.2.3`, `${a} (none)`, `${a} 2001:db8::7`, `${a} ::ffff:10.9.9.9`, `${a} 10.1.2.3`, `${a} 10.1.2.3`,
  ]);
  // Not asked per address: the totals are as they always were, and have no address.
  expect(lines(await meter.query({ account: a }))).toEqual([`${a} ? charged 4 200000 1`, `${a} ? ignored 1 0 0`]);

  // A network: its calls of every account, and of no account; the row with no address matches nothing.
  const ten = await meter.query({ address: "10.0.0.0/8", rows: 20 });
  expect(lines(ten)).toEqual([`${a} ? charged 3 150000 1`, `${b} ? charged 1 50000 0`]);
  expect(ten.rows.map((r) => r.clientIp)).toEqual(["10.1.2.3", "::ffff:10.9.9.9", "10.1.2.3", "10.1.2.3"]);
  expect(lines(await meter.query({ address: "10.0.0.0/8", account: a, byAddress: true }))).toEqual([`${a} 10.1.2.3 charged 2 100000 1`, `${a} ::ffff:10.9.9.9 charged 1 50000 0`]);
  expect(lines(await meter.query({ address: "10.9.9.9" }))).toEqual([`${a} ? charged 1 50000 0`]);
  expect(lines(await meter.query({ address: "2001:db8::/32" }))).toEqual([`${a} ? ignored 1 0 0`]);
  expect(lines(await meter.query({ address: "198.51.100.7" }))).toEqual(["- ? ignored 2 0 0"]);
  // With an account, calls of no account are not its: none from there.
  expect(lines(await meter.query({ address: "198.51.100.7", account: a }))).toEqual([]);
  const none = await meter.query({ address: "192.0.2.1", rows: 5 });
  expect([none.totals.length, none.rows.length]).toEqual([0, 0]);

  // One call by its request id: its row and its total, whatever else is asked; a call with no account has no row to find.
  const one = await meter.query({ requestId: recorded[2]!.requestId, rows: 5, byAddress: true });
  expect([lines(one), one.rows.map((r) => `${r.requestId} ${r.clientIp}`)]).toEqual([[`${a} ::ffff:10.9.9.9 charged 1 50000 0`], [`${recorded[2]!.requestId} ::ffff:10.9.9.9`]]);
  expect((await meter.query({ requestId: recorded[2]!.requestId, account: b, rows: 5 })).rows).toEqual([]);
  for (const id of [recorded[6]!.requestId, "addr-99999999"]) {
    const found = await meter.query({ requestId: id, rows: 5 });
    expect([found.totals, found.rows], id).toEqual([[], []]);
  }
}

describe("the embedded store", () => {
  it("keeps each call's address and answers usage by address, also past retention", async () => {
    const db = openDatabase(":memory:");
    const meter = new SqliteMeter(db);
    await expectAddresses(meter, "acct-a", "acct-b", await recordCalls(meter, "acct-a", "acct-b"));
    // Past retention the rows are folded into totals with no address: per address they are "", and no filter matches
    // them. All but the newest row (acct-b's), which retention always keeps (the ledger's numbering: call-feed.test.ts).
    expect(meter.expire("2026-11-25")).toBe(5);
    expect(lines(await meter.query({ account: "acct-a", byAddress: true }))).toEqual(["acct-a  charged 4 200000 1", "acct-a  ignored 1 0 0"]);
    expect(lines(await meter.query({ address: "10.0.0.0/8", byAddress: true }))).toEqual(["acct-b 10.1.2.3 charged 1 50000 0"]);
    expect((await meter.query({ requestId: "addr-00000001" })).totals).toEqual([]);
    db.close();
  });
});

describe("PostgreSQL", () => {
  let db: Awaited<ReturnType<typeof freshDatabase>>;
  let pool: pg.Pool;
  beforeAll(async () => {
    db = await freshDatabase("usage_addresses");
    pool = openPostgres(db.url, { max: 4 });
    await migrateSchema(pool);
  });
  afterAll(async () => {
    await pool?.end();
    await db?.drop();
  });

  it("keeps each call's address and answers usage by address as the embedded store does", async () => {
    const meter = new PostgresMeter(pool, { holder: "addresses" });
    try {
      await expectAddresses(meter, "acct-a", "acct-b", await recordCalls(meter, "acct-a", "acct-b"));
      // A day folded past retention has no address.
      await pool.query("INSERT INTO ledger_daily_totals (day, account, operation, error_code, charge, calls, amount, cache_hits) VALUES ('2026-01-01', 'acct-a', 'retail/item_get', 0, 'charged', 7, 350000, 0)");
      expect(lines(await meter.query({ account: "acct-a", to: "2026-01-01", byAddress: true }))).toEqual(["acct-a  charged 7 350000 0"]);
      expect((await meter.query({ address: "10.0.0.0/8", to: "2026-01-01" })).totals).toEqual([]);
      expect((await meter.query({ requestId: "addr-00000001", to: "2026-01-01" })).totals).toEqual([]);
    } finally {
      meter.close();
    }
  });
});

describe("behind the app, each call from the address its proxy forwards", () => {
  let gw: GatewayFixture;
  beforeAll(async () => {
    gw = await startGateway({ config: { trustedProxies: "127.0.0.1" } });
  });
  afterAll(() => gw.close());

  const legacy = async (a: { key: string; secret: string }, from: string) => {
    const res = await fetch(`${gw.base}/retail/item_get/?${new URLSearchParams({ key: a.key, secret: a.secret, num_iid: demo.retailNumIid })}`, { headers: { "x-forwarded-for": from } });
    const json = (await res.json()) as Record<string, unknown>;
    return `${String(json.error_code)} ${String(json.client_ip)}`;
  };
  const rpc = async (a: { key: string; secret: string }, from: string, grpc: boolean) => {
    const client = createClient(RetailService, grpc ? createGrpcTransport({ baseUrl: gw.base }) : createConnectTransport({ baseUrl: gw.base, httpVersion: "1.1" }));
    const res = await client.itemGet({ numIid: demo.retailNumIid }, { headers: { "x-api-key": a.key, "x-api-secret": a.secret, "x-forwarded-for": from } });
    return `${String(res.status!.errorCode).padStart(4, "0")} ${res.status!.clientIp}`;
  };

  it("records the address each caller's status block shows, on every transport, and the AdminService and the CLI answer by it", async () => {
    const a = await gw.newAccount({ name: "team-a" });
    const b = await gw.newAccount({ name: "team-b" });
    expect(await legacy(a, "10.1.2.3")).toBe("0000 10.1.2.3");
    expect(await rpc(a, "10.1.2.3", false)).toBe("0000 10.1.2.3");
    expect(await rpc(a, "2001:db8::7", true)).toBe("0000 2001:db8::7");
    expect(await legacy(b, "10.200.0.1")).toBe("0000 10.200.0.1");
    // A leaked key's wrong secret from elsewhere: no account is charged, the address is counted.
    expect(await legacy({ key: a.key, secret: "wrong" }, "198.51.100.7")).toMatch(/^4005 /);
    // Straight from the loopback peer (a trusted proxy that forwarded nothing): the peer's address.
    expect(await legacy(a, "")).toBe("0000 127.0.0.1");

    const admin = createClient(AdminService, createConnectTransport({ baseUrl: gw.base, httpVersion: "1.1" }));
    const ok = { headers: { authorization: `Bearer ${adminToken}` } };
    const mine = await admin.queryUsage({ account: a.key, rows: 10, byAddress: true }, ok);
    expect(mine.rows.map((r) => `${r.transport} ${r.clientIp}`)).toEqual(["legacy 127.0.0.1", "grpc 2001:db8::7", "connect 10.1.2.3", "legacy 10.1.2.3"]);
    expect(mine.totals.map((t) => `${t.clientIp} ${t.calls}`).sort()).toEqual(["10.1.2.3 2", "127.0.0.1 1", "2001:db8::7 1"]);
    const ten = await admin.queryUsage({ clientIp: "10.0.0.0/8", byAddress: true, rows: 10 }, ok);
    expect(ten.totals.map((t) => `${t.account === a.key ? "a" : t.account === b.key ? "b" : t.account} ${t.clientIp} ${t.calls}`).sort()).toEqual(["a 10.1.2.3 2", "b 10.200.0.1 1"]);
    expect([ten.calls, ten.chargedCalls, ten.amount, ten.rows.length]).toEqual([3n, 3n, "0", 3]);
    const leaked = await admin.queryUsage({ clientIp: "198.51.100.7" }, ok);
    expect(leaked.totals.map((t) => `${t.account || "(none)"} ${t.errorCode} ${t.calls}`)).toEqual(["(none) 4005 1"]);
    const refused = await admin.queryUsage({ clientIp: "10.0.0.0/99" }, ok).catch((e: unknown) => ConnectError.from(e));
    expect([(refused as ConnectError).code, (refused as ConnectError).rawMessage]).toEqual([Code.InvalidArgument, `the calls' address: "10.0.0.0/99": a network's prefix is 0 to 32`]);

    const env = { GATEWAY_DATA_DIR: gw.config.dataDir };
    const byAddress = await runCli(["usage", "--account", a.key, "--by-address"], env);
    expect(byAddress.code).toBe(0);
    expect(byAddress.stdout.trim().split("\n").map((l) => l.replace(/^\S+ {2}\S+ {2}/, "")).sort()).toEqual([
      "retail/item_get  0000  charged    1 calls  0  from 127.0.0.1",
      "retail/item_get  0000  charged    1 calls  0  from 2001:db8::7",
      "retail/item_get  0000  charged    2 calls  0  from 10.1.2.3",
    ]);
    const rows = await runCli(["usage", "--address", "2001:db8::/32", "--rows", "5", "--json"], env);
    const json = JSON.parse(rows.stdout) as { totals: { calls: number }[]; rows: { clientIp: string; transport: string }[] };
    expect([json.totals.map((t) => t.calls), json.rows.map((r) => `${r.transport} ${r.clientIp}`)]).toEqual([[1], ["grpc 2001:db8::7"]]);
    // As CSV for a spreadsheet or a billing system: the totals per address, and the rows when they are asked for.
    const csv = await runCli(["usage", "--account", a.key, "--by-address", "--csv"], env);
    const table = readCsv(csv.stdout);
    expect(table[0]).toEqual(["day", "account", "operation", "code", "charge", "calls", "amount", "cache_hits", "client_ip", "upstream_requests"]);
    expect(table.slice(1).map((r) => `${r[1] === a.key} ${r[3]} ${r[5]} ${r[8]}`).sort()).toEqual(["true 0000 1 127.0.0.1", "true 0000 1 2001:db8::7", "true 0000 2 10.1.2.3"]);
    const csvRows = readCsv((await runCli(["usage", "--address", "10.0.0.0/8", "--rows", "10", "--csv"], env)).stdout);
    expect(csvRows[0]).toEqual(["request_id", "time", "day", "account", "operation", "code", "charge", "price", "cache_hit", "latency_us", "transport", "client_ip", "upstream_requests"]);
    expect(csvRows.slice(1).map((r) => `${r[10]} ${r[11]}`)).toEqual(["legacy 10.200.0.1", "connect 10.1.2.3", "legacy 10.1.2.3"]);
    expect((await runCli(["usage", "--csv", "--json"], env)).stderr).toContain("--csv and --json: one or the other");
    const bad = await runCli(["usage", "--address", "example.com"], env);
    expect([bad.code, bad.stderr]).toEqual([2, expect.stringContaining(`the calls' address: "example.com" is not an address or a network`)]);
  });

  it("finds one call by the request id its caller quotes, on the AdminService and the CLI", async () => {
    const a = await gw.newAccount({ name: "quoting" });
    const client = createClient(RetailService, createConnectTransport({ baseUrl: gw.base, httpVersion: "1.1" }));
    const res = await client.itemGet({ numIid: demo.retailNumIid }, { headers: { "x-api-key": a.key, "x-api-secret": a.secret, "x-forwarded-for": "10.7.7.7" } });
    const id = res.status!.requestId;
    for (let i = 0; i < 3; i++) await legacy(a, "10.7.7.7");
    const admin = createClient(AdminService, createConnectTransport({ baseUrl: gw.base, httpVersion: "1.1" }));
    const found = await admin.queryUsage({ requestId: id, rows: 10 }, { headers: { authorization: `Bearer ${adminToken}` } });
    expect([found.calls, found.rows.map((r) => `${r.requestId} ${r.account === a.key} ${r.transport} ${r.clientIp}`)]).toEqual([1n, [`${id} true connect 10.7.7.7`]]);
    const cli = await runCli(["usage", "--request-id", id, "--json"], { GATEWAY_DATA_DIR: gw.config.dataDir });
    const json = JSON.parse(cli.stdout) as { totals: { calls: number }[]; rows: { requestId: string; clientIp: string }[] };
    expect([json.totals.map((t) => t.calls), json.rows.map((r) => `${r.requestId} ${r.clientIp}`)]).toEqual([[1], [`${id} 10.7.7.7`]]);
  });
});
