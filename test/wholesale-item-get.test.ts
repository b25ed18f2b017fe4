import { createClient, createRouterTransport } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { demoRecords } from "../src/catalogue/demo-dataset.ts";
import { importRecords } from "../src/catalogue/catalogue-import.ts";
import { ErrorCode } from "../src/gen/gateway/catalogue/v1/status_pb.js";
import { WholesaleService } from "../src/gen/gateway/catalogue/v1/wholesale_pb.js";
import { operations } from "../src/operations/index.ts";
import { wholesaleItemGet } from "../src/operations/wholesale-item-get.ts";
import { catalogueRoutes } from "../src/transports/connect/catalogue-services.ts";
import { adminToken, demo, startGateway, type GatewayFixture } from "./support/gateway-fixture.ts";
import { runCli } from "./support/cli.ts";
import { demoAccount, demoAccountName } from "../src/runtime.ts";

/**
 * `wholesale/item_get`, the third operation, where its logic lives: the
 * handlers over an in-memory router transport and the legacy shim through
 * app.inject(). Transports, the PHP oracle, the upstream source and the
 * error codes cover it with the other operations in their own files.
 */
let gw: GatewayFixture;
let headers: Record<string, string>;
const lines = demoRecords();
const wholesaleDetails = lines.filter((l) => l.kind === "item_detail" && l.catalogue === "wholesale");

beforeAll(async () => {
  gw = await startGateway();
  headers = { "x-api-key": gw.account.key, "x-api-secret": gw.account.secret };
});
afterAll(() => gw.close());

function inject(params: Record<string, string>) {
  return gw.app.inject({ method: "GET", url: `/wholesale/item_get/?${new URLSearchParams({ key: gw.account.key, secret: gw.account.secret, ...params })}` });
}

describe("the demo catalogue", () => {
  it("has a detail record for every wholesale item, whose seller_info.sid is the shop its peer-viewed record is keyed by", () => {
    const peers = lines.filter((l) => l.kind === "peer_viewed");
    expect(peers.length).toBeGreaterThan(100);
    expect(wholesaleDetails.map((l) => [(l.item as { num_iid: string }).num_iid, (l.item as { seller_info: { sid: string } }).seller_info.sid])).toEqual(
      peers.map((p) => [p.num_iid, p.sid]),
    );
  });
});

describe("handlers (in-memory router transport)", () => {
  it("ItemGet answers the record, and every sid it gives opens ItemSearchPeerbuy for the same item", async () => {
    const client = createClient(WholesaleService, createRouterTransport(catalogueRoutes(gw.runtime.gateway, operations)));
    for (const line of wholesaleDetails.slice(0, 15)) {
      const numIid = (line.item as { num_iid: string }).num_iid;
      const detail = await client.itemGet({ numIid }, { headers });
      expect(detail.item?.numIid).toBe(numIid);
      expect(detail.status?.apiType).toBe("wholesale");
      const sid = detail.item!.sellerInfo!.sid;
      const peers = await client.itemSearchPeerbuy({ numIid, sid }, { headers }).then(
        (r) => r.status!.errorCode,
        () => "error",
      );
      // A wholesale item either has peer-viewed items (0000) or a real, charged "none" (2000, a NotFound error): never a wrong shop.
      const expected = lines.find((l) => l.kind === "peer_viewed" && l.num_iid === numIid)!;
      expect(peers).toBe((expected.item as unknown[]).length > 0 ? ErrorCode.SUCCESS : "error");
    }
  });
});

describe("legacy shim (app.inject)", () => {
  it.each(["json", "jsonu", "serialize", "var_export", "xml"])("answers %s with the item detail layout of the wholesale catalogue", async (format) => {
    const res = await inject({ num_iid: demo.wholesaleNumIid, result_type: format });
    expect(res.statusCode).toBe(200);
    expect(res.body).toContain(demo.wholesaleSid);
    expect(res.body).toContain("wholesale");
    if (format === "json") {
      const json = JSON.parse(res.body) as Record<string, unknown>;
      expect(Object.keys(json)).toEqual(wholesaleItemGet.legacyLayout);
      expect(json.error_code).toBe("0000");
      expect(json.last_id).toBe("0");
      expect(json.call_args).toEqual({ num_iid: demo.wholesaleNumIid });
    }
  });

  it("is cached per catalogue: a retail item with the same id is another item", async () => {
    // An item no other test here asks for, so its first call is a miss.
    const wholesale = wholesaleDetails[40]!.item as Record<string, unknown>;
    const retailTwin = { ...(lines[0]!.item as Record<string, unknown>), num_iid: wholesale.num_iid, title: "零售同号商品" };
    await importRecords(gw.runtime.catalogue, [{ kind: "item_detail", catalogue: "retail", item: retailTwin }], { storedAt: 1_700_000_000 });
    const auth = { key: gw.account.key, secret: gw.account.secret, num_iid: String(wholesale.num_iid) };
    const first = JSON.parse((await inject({ num_iid: String(wholesale.num_iid) })).body) as { item: { title: string }; cache: number; secache: string };
    const retail = JSON.parse((await gw.app.inject({ url: `/retail/item_get/?${new URLSearchParams(auth)}` })).body) as { item: { title: string }; secache: string };
    const second = JSON.parse((await inject({ num_iid: String(wholesale.num_iid) })).body) as { item: { title: string }; cache: number; secache: string };
    const third = JSON.parse((await inject({ num_iid: String(wholesale.num_iid) })).body) as { cache: number };
    expect(first.item.title).toBe(wholesale.title);
    expect(retail.item.title).toBe("零售同号商品");
    // Kept from its second request on (the embedded catalogue's answers are cheap to read again): the third is a hit.
    expect([first.cache, second.cache, third.cache]).toEqual([0, 0, 1]);
    expect(second.item.title).toBe(wholesale.title);
    expect(second.secache).toBe(first.secache);
    expect(retail.secache).not.toBe(first.secache);
  });

  it("translates the wholesale record's texts and leaves its ids alone", async () => {
    const json = JSON.parse((await inject({ num_iid: demo.wholesaleNumIid, lang: "en" })).body) as { item: { title: string; seller_info: { sid: string } }; translate_language: string };
    expect(json.translate_language).toBe("en");
    expect(json.item.title).not.toMatch(/\p{Script=Han}{3}/u);
    expect(json.item.seller_info.sid).toBe(demo.wholesaleSid);
  });

  it("is metered and ledgered under its own operation, with its own price", async () => {
    const a = await gw.newAccount({ prices: new Map([["wholesale/item_get", 50_000n]]), balance: 1_000_000n });
    for (let i = 0; i < 3; i++) await gw.app.inject({ url: `/wholesale/item_get/?${new URLSearchParams({ key: a.key, secret: a.secret, num_iid: demo.wholesaleNumIid })}` });
    const rows = (await gw.runtime.meter.query({ account: a.key, rows: 10 })).rows;
    expect(rows.map((r) => [r.operation, r.code, r.charge, r.price])).toEqual(Array(3).fill(["wholesale/item_get", 0, "charged", 50_000n]));
    expect((await gw.runtime.accounts.find(a.key))!.balance).toBe(850_000n);
  });
});

describe("accounts", () => {
  it("a bare item_get is refused as naming two operations; the full id is taken", () => {
    expect(() => gw.runtime.admin.operation("item_get")).toThrow(/retail\/item_get, wholesale\/item_get/);
    expect(gw.runtime.admin.operation("wholesale/item_get")).toBe("wholesale/item_get");
    expect(gw.runtime.admin.operation("item_search_peerbuy")).toBe("wholesale/item_search_peerbuy");
  });

  it("new accounts get it; the CLI's --operations gives it alone, and disable-api switches it off for that account alone", async () => {
    expect([...(await gw.runtime.accounts.find(gw.account.key))!.operations.keys()]).toContain("wholesale/item_get");
    // The CLI writes the store the running gateway serves from, as an operator's would.
    const env = { GATEWAY_DATA_DIR: gw.config.dataDir, GATEWAY_ADMIN_TOKEN: adminToken };
    const created = await runCli(["accounts", "create", "--name", "wholesale-only", "--operations", "wholesale/item_get", "--json"], env);
    expect(created.stderr).toBe("");
    const account = JSON.parse(created.stdout) as { key: string; operations: Record<string, string> };
    expect(account.operations).toEqual({ "wholesale/item_get": "enabled" });
    const ambiguous = await runCli(["accounts", "disable-api", account.key, "item_get"], env);
    expect(ambiguous.code).not.toBe(0);
    expect(ambiguous.stderr).toContain("give the full id");
    expect((await runCli(["accounts", "disable-api", account.key, "wholesale/item_get"], env)).code).toBe(0);
    const call = (path: string) => gw.app.inject({ url: `${path}?${new URLSearchParams({ key: account.key, secret: JSON.parse(created.stdout).secret, num_iid: demo.wholesaleNumIid })}` });
    await expect.poll(async () => JSON.parse((await call("/wholesale/item_get/")).body).error_code, { timeout: 5000 }).toBe("4006");
    expect(JSON.parse((await call("/retail/item_get/")).body).error_code).toBe("4012");
  });

  it("a demo account from before the operation existed gets it at the next start", async () => {
    const old = await gw.runtime.admin.create({ name: demoAccountName, operations: ["retail/item_get", "wholesale/item_search_peerbuy"] });
    const demoAgain = await demoAccount(gw.runtime);
    expect(demoAgain.key).toBe(old.account.key);
    expect([...(await gw.runtime.accounts.find(old.account.key))!.operations]).toContainEqual(["wholesale/item_get", "enabled"]);
  });
});
