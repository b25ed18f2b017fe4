// Issue 11, items 1, 3, 4 and 11: the ledger under a full disk, refusals that do
// not grow it row by row, retention, the replay guard across restarts, and
// refusals of known accounts carrying their account.
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import http from "node:http";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { DatabaseSync } from "node:sqlite";
import { afterAll, describe, expect, it } from "vitest";
import { deriveSigningKey, newNonce, signCall } from "../src/client/browser-signature.ts";
import { formatDateTime } from "../src/core/clock.ts";
import { legacySign, legacySigningKey } from "../src/core/legacy-signature.ts";
import { RetailService } from "../src/gen/gateway/catalogue/v1/retail_pb.js";
import { StatusBlockSchema } from "../src/gen/gateway/catalogue/v1/status_pb.js";
import { databasePath, openRuntime } from "../src/runtime.ts";
import { defaultConfig } from "../src/config.ts";
import { demo, legacyGet, startGateway, type GatewayFixture } from "./support/gateway-fixture.ts";

const dirs: string[] = [];
function freshDir(): string {
  const d = mkdtempSync(join(tmpdir(), "gateway-hardening-"));
  dirs.push(d);
  return d;
}
afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

function ledgerRows(gw: GatewayFixture): number {
  const db = new DatabaseSync(databasePath(gw.config), { readOnly: true });
  try {
    return Number((db.prepare("SELECT count(*) AS n FROM ledger").get() as { n: number }).n);
  } finally {
    db.close();
  }
}

const item = (gw: GatewayFixture, account = gw.account, extra: Record<string, string> = {}) =>
  legacyGet(gw.base, "/retail/item_get/", { key: account.key, secret: account.secret, num_iid: demo.retailNumIid, ...extra });

describe("11.1 a full disk", () => {
  it("never crashes: unrecordable calls answer 4000 uncharged, refusals keep being served, and it resumes by itself when space returns", async () => {
    // The store may grow to 48 MiB; a second connection (no cap) then takes the rest,
    // as another file on a full disk would, and gives it back later.
    const gw = await startGateway({ config: { storeMaxBytes: 48 * 1048576 } });
    const errors: unknown[] = [];
    const onError = (e: unknown) => errors.push(e);
    process.on("uncaughtException", onError);
    const filler = new DatabaseSync(databasePath(gw.config));
    try {
      const account = await gw.newAccount({ balance: 1_000_000_000n, prices: new Map([["retail/item_get", 1_000_000n]]) });
      expect((await item(gw, account)).json.error_code).toBe("0000");

      filler.exec("CREATE TABLE filler (b BLOB)");
      const pageSize = Number((filler.prepare("PRAGMA page_size").get() as { page_size: number }).page_size);
      const size = () => Number((filler.prepare("PRAGMA page_count").get() as { page_count: number }).page_count) * pageSize;
      while (size() < 49 * 1048576) filler.exec("INSERT INTO filler VALUES (zeroblob(1048576))");

      const codes: string[] = [];
      let full: Record<string, unknown> | undefined;
      for (let i = 0; i < 400 && full === undefined; i++) {
        const r = await item(gw, account, { cache: i % 2 === 0 ? "no" : "yes" });
        codes.push(String(r.json.error_code));
        if (r.json.error_code === "4000") full = r.json;
      }
      expect(full, `no 4000 after ${codes.length} calls: ${codes.slice(-5).join(",")}`).toBeDefined();
      expect(full!.reason).toMatch(/usage ledger cannot be written/);
      expect(full).not.toHaveProperty("item");

      // While full: a paid call answers 4000 (uncharged), a refusal keeps its own code, RPC says internal with the detail.
      const balanceBefore = (await gw.runtime.admin.get(account.key)).balance;
      expect((await item(gw, account)).json.error_code).toBe("4000");
      expect((await legacyGet(gw.base, "/retail/item_get/", { key: "no-such-key", secret: "x", num_iid: "1" })).json.error_code).toBe("4004");
      const rpc = await createClient(RetailService, createConnectTransport({ baseUrl: gw.base, httpVersion: "1.1" }))
        .itemGet({ numIid: demo.retailNumIid }, { headers: { "x-api-key": account.key, "x-api-secret": account.secret } })
        .catch((e: unknown) => ConnectError.from(e));
      expect(rpc).toBeInstanceOf(ConnectError);
      expect((rpc as ConnectError).code).toBe(Code.Internal);
      expect((rpc as ConnectError).findDetails(StatusBlockSchema)[0]?.errorCode).toBe(4000);
      expect((await gw.runtime.admin.get(account.key)).balance).toBe(balanceBefore);

      // Space returns: the gateway resumes without a restart.
      filler.exec("DROP TABLE filler");
      let resumed = false;
      for (let i = 0; i < 50 && !resumed; i++) {
        resumed = (await item(gw, account)).json.error_code === "0000";
        if (!resumed) await new Promise((r) => setTimeout(r, 100));
      }
      expect(resumed).toBe(true);
      // What was charged is exactly what the ledger says.
      const report = await gw.runtime.meter.query({ account: account.key });
      const charged = report.totals.filter((t) => t.charge === "charged").reduce((n, t) => n + t.calls, 0);
      expect(1_000_000_000n - (await gw.runtime.admin.get(account.key)).balance!).toBe(BigInt(charged) * 1_000_000n);
      expect(errors).toEqual([]);
    } finally {
      process.off("uncaughtException", onError);
      filler.close();
      await gw.close();
    }
  });
});

describe("11.3 refusals do not grow the ledger row by row", () => {
  it("counts calls with no account per day, code and address, with a cap on addresses, and keeps QueryUsage totals", async () => {
    const gw = await startGateway({ config: { refusalAddressesPerDay: 2, authLockAfter: 100_000, authSlowAfter: 100_000 } });
    try {
      const rowsBefore = ledgerRows(gw);
      const from = (address: string, n: number) =>
        Promise.all(
          Array.from(
            { length: n },
            () =>
              new Promise<void>((resolve, reject) => {
                http.get(`${gw.base}/retail/item_get/?key=unknown-key&secret=x&num_iid=1`, { localAddress: address, agent: false }, (res) => {
                  res.resume();
                  res.on("end", resolve);
                }).on("error", reject);
              }),
          ),
        );
      await from("127.0.0.1", 150);
      await from("127.0.0.2", 30);
      await from("127.0.0.3", 20);
      await fetch(`${gw.base}/nowhere/at_all/`);
      expect(ledgerRows(gw)).toBe(rowsBefore);

      const db = new DatabaseSync(databasePath(gw.config), { readOnly: true });
      const byAddress = db.prepare("SELECT client_ip, sum(calls) AS n FROM refusals WHERE error_code = 4004 GROUP BY client_ip ORDER BY client_ip").all();
      db.close();
      // The third address is past the cap of 2 and is counted under "other".
      expect(byAddress.map((r) => [r.client_ip, Number(r.n)])).toEqual([
        ["127.0.0.1", 150],
        ["127.0.0.2", 30],
        ["other", 20],
      ]);
      const totals = (await gw.runtime.meter.query({})).totals.filter((t) => t.account === undefined);
      expect(totals.filter((t) => t.code === 4004).reduce((n, t) => n + t.calls, 0)).toBe(200);
      expect(totals.filter((t) => t.code === 4010).reduce((n, t) => n + t.calls, 0)).toBe(1);
    } finally {
      await gw.close();
    }
  });

  it("drops ledger rows past the retention setting while per-day totals and api_info stay", async () => {
    const dataDir = freshDir();
    const old = Date.UTC(2026, 0, 10, 4); // 2026-01-10, noon in Asia/Shanghai
    const clock = { at: old, now() { return this.at; } };
    const gw = await startGateway({ dataDir, clock });
    const account = gw.account;
    for (let i = 0; i < 3; i++) expect((await item(gw)).json.error_code).toBe("0000");
    clock.at = Date.now();
    expect((await item(gw)).json.error_code).toBe("0000");
    const before = await item(gw);
    expect(before.json.api_info).toMatch(/all\[5=2\+0\+3\]/);
    await gw.close();

    // A restart with a 30-day retention sweeps January's rows into per-day totals, before the first call is served.
    const runtime = await openRuntime({ ...defaultConfig, dataDir, ledgerRetentionDays: 30 }, { retention: true });
    try {
      const db = new DatabaseSync(databasePath({ dataDir }), { readOnly: true });
      const oldRows = Number((db.prepare("SELECT count(*) AS n FROM ledger WHERE day < '2026-02-01'").get() as { n: number }).n);
      db.close();
      expect(oldRows).toBe(0);
      const january = await runtime.meter.query({ account: account.key, from: "2026-01-10", to: "2026-01-10" });
      // The first two calls read the item (the embedded catalogue's answer is kept from its second
      // request on), the third came from the cache: the fold keeps that too.
      expect(january.totals.map((t) => [t.day, t.code, t.charge, t.calls, t.cacheHits])).toEqual([["2026-01-10", 0, "charged", 3, 1]]);
      expect((await runtime.meter.usage(account.key, "2099-01-01", "2098-12-31")).before).toBe(5);
    } finally {
      await runtime.close();
    }
  });

  it("refuses new calls with 4000 below the free-space floor, before the disk fills", async () => {
    const gw = await startGateway({ config: { minFreeMb: 1_000_000_000 } });
    try {
      const r = await item(gw);
      expect(r.json.error_code).toBe("4000");
      expect(r.json.reason).toMatch(/free/);
    } finally {
      await gw.close();
    }
  });
});

describe("11.4 the replay guard survives a restart", () => {
  it("refuses a used md5 sign and a used nonce after the gateway restarts inside the window", async () => {
    const dataDir = freshDir();
    let gw = await startGateway({ dataDir });
    const account = gw.account;
    const params = { key: account.key, num_iid: demo.retailNumIid, dateline: formatDateTime(Date.now(), "Asia/Shanghai") };
    const signed = { ...params, sign: legacySign({ ...params, api_name: "item_get" }, legacySigningKey(account.secret)) };
    const ts = Math.floor(Date.now() / 1000);
    const nonce = newNonce();
    const signature = await signCall(await deriveSigningKey(account.secret), {
      method: "GET",
      path: "/retail/item_get/",
      params: { num_iid: demo.retailNumIid },
      timestamp: ts,
      nonce,
    });
    const browser = { key: account.key, num_iid: demo.retailNumIid, timestamp: String(ts), nonceStr: nonce, signature };
    expect((await legacyGet(gw.base, "/retail/item_get/", signed)).json.error_code).toBe("0000");
    expect((await legacyGet(gw.base, "/retail/item_get/", browser)).json.error_code).toBe("0000");
    await gw.close();

    gw = await startGateway({ dataDir });
    try {
      const again = await legacyGet(gw.base, "/retail/item_get/", signed);
      expect([again.json.error_code, again.json.reason]).toEqual(["4005", "this sign was already used; sign each call anew"]);
      const againBrowser = await legacyGet(gw.base, "/retail/item_get/", browser);
      expect(againBrowser.json.error_code).toBe("4005");
      expect(againBrowser.json.reason).toMatch(/nonce was already used/);
    } finally {
      await gw.close();
    }
  });
});

describe("11.11 refusals of a known account carry the account", () => {
  it("ledgers 4006, 4007, 4012, expired 4005, 4008, 4013 and 4016 under the account, with api_info", async () => {
    const gw = await startGateway({ config: { authLockAfter: 100_000 } });
    try {
      const admin = gw.runtime.admin;
      const stopped = await gw.newAccount();
      await admin.setStatus(stopped.key, "stopped");
      const apiStopped = await gw.newAccount();
      await admin.setOperation(apiStopped.key, "retail/item_get", "stopped");
      const cases: [string, { key: string; secret: string }][] = [
        ["4006", apiStopped],
        ["4007", stopped],
        ["4012", await gw.newAccount({ operations: ["wholesale/item_search_peerbuy"] })],
        ["4005", await gw.newAccount({ expires: "2020-01-01" })],
        ["4013", await gw.newAccount({ dailyMax: 0 })],
        ["4016", await gw.newAccount({ balance: 0n, prices: new Map([["retail/item_get", 1000n]]) })],
      ];
      for (const [code, account] of cases) {
        const r = await item(gw, account);
        expect(r.json.error_code, code).toBe(code);
        expect(r.json.api_info, code).toMatch(/^today:0 max:\d+ all\[0=0\+0\+0\];expires:\d{4}-\d{2}-\d{2}$/);
        const rows = (await gw.runtime.meter.query({ account: account.key, rows: 10 })).rows;
        expect(rows.map((row) => [row.code, row.account]), code).toEqual([[Number(code), account.key]]);
      }
      // 4008: the concurrency limit of an account, on a slow source.
      const busy = await gw.newAccount({ concurrency: 1 });
      const slow = gw.gatewayWith(
        new Map([["retail", { label: "slow", fetch: () => new Promise((r) => setTimeout(() => r({ found: false, reason: "slow" }), 300)) }]]),
      );
      const { operationById } = await import("../src/operations/index.ts");
      const op = operationById.get("retail/item_get")!;
      const input = { args: { num_iid: "1" }, credentials: { key: busy.key, secret: busy.secret }, transport: "legacy" as const, clientIp: "127.0.0.1" };
      const [, second] = await Promise.all([slow.call(op, input), new Promise((r) => setTimeout(r, 50)).then(() => slow.call(op, input))]);
      expect(second.status.errorCode).toBe(4008);
      expect(second.status.apiInfo).toMatch(/^today:/);
      const rows = (await gw.runtime.meter.query({ account: busy.key, code: 4008, rows: 10 })).rows;
      expect(rows.map((r) => r.account)).toEqual([busy.key]);
    } finally {
      await gw.close();
    }
  });
});
