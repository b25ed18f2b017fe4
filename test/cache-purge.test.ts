// An operator's purge of the response cache (AdminService.PurgeCache): the provider corrected an item, and the
// gateway must stop serving what it stored. Against a running gateway in front of a fake provider (a real HTTP server
// on loopback), over Connect and gRPC: what is dropped is asked of the provider again on the next call (and its row
// says so), what is not stays a hit, and a request that names nothing is refused rather than emptying the cache.
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { demoRecords } from "../src/catalogue/demo-dataset.ts";
import { AdminService } from "../src/gen/gateway/admin/v1/admin_pb.js";
import { FakeUpstream } from "./support/fake-upstream.ts";
import { adminToken, demo, legacyGet, startGateway, type GatewayFixture } from "./support/gateway-fixture.ts";

let upstream: FakeUpstream;
let gw: GatewayFixture;
const logLines: string[] = [];
const headers = { authorization: `Bearer ${adminToken}` };
const [itemA, itemB] = demoRecords()
  .filter((r) => r.kind === "item_detail" && r.obtainable && (r.catalogue ?? "retail") === "retail")
  .map((r) => (r.item as { num_iid: string }).num_iid)
  .filter((id) => id !== demo.retailNumIid);

beforeAll(async () => {
  upstream = await new FakeUpstream().start();
  gw = await startGateway({ logLines, config: { upstreamUrl: upstream.url, upstreamKey: "purge-key", upstreamSecret: "purge-secret-0123456789" } });
});
afterAll(async () => {
  await gw.close();
  await upstream.stop();
});

/** A retail item_get: whether the cache answered it, and the requests its row says it sent to the provider. */
async function get(numIid: string, isPromotion = "1"): Promise<{ cache: number; sent: number }> {
  const r = await legacyGet(gw.base, "/retail/item_get/", { key: gw.account.key, secret: gw.account.secret, num_iid: numIid, is_promotion: isPromotion });
  expect(r.json.error_code).toBe("0000");
  const row = (await gw.runtime.meter.query({ requestId: r.json.request_id as string, rows: 1 })).rows[0]!;
  return { cache: r.json.cache as number, sent: row.upstreamRequests };
}

async function peers(): Promise<number> {
  const r = await legacyGet(gw.base, "/wholesale/item_search_peerbuy/", { key: gw.account.key, secret: gw.account.secret, num_iid: demo.wholesaleNumIid, sid: demo.wholesaleSid });
  expect(r.json.error_code).toBe("0000");
  return r.json.cache as number;
}

describe("PurgeCache", () => {
  it("drops an item's every variant, of one operation or all, or an operation's every item, or everything; the next call buys again", async () => {
    for (const transport of [createConnectTransport({ baseUrl: gw.base, httpVersion: "1.1" }), createGrpcTransport({ baseUrl: gw.base })]) {
      const admin = createClient(AdminService, transport);
      expect((await admin.purgeCache({ everything: true }, { headers })).entries).toBeGreaterThanOrEqual(0n);
      // Bought once each, then hits.
      expect(await get(itemA!, "1")).toEqual({ cache: 0, sent: 1 });
      expect(await get(itemA!, "")).toEqual({ cache: 0, sent: 1 });
      expect(await get(itemB!)).toEqual({ cache: 0, sent: 1 });
      expect(await peers()).toBe(0);
      expect(await get(itemA!, "1")).toEqual({ cache: 1, sent: 0 });

      // One item of one operation: both its variants, and nothing else.
      expect((await admin.purgeCache({ operation: "retail/item_get", numIid: itemA! }, { headers })).entries).toBe(2n);
      const asked = upstream.requests.length;
      expect(await get(itemA!, "1")).toEqual({ cache: 0, sent: 1 });
      expect(upstream.requests.length).toBe(asked + 1);
      expect(await get(itemB!)).toEqual({ cache: 1, sent: 0 });
      expect(await peers()).toBe(1);

      // The same item of every operation (the wholesale item is not this one: it stays).
      expect((await admin.purgeCache({ numIid: itemA! }, { headers })).entries).toBe(1n);
      expect(await peers()).toBe(1);
      // An operation's every item.
      expect((await admin.purgeCache({ operation: "wholesale/item_search_peerbuy" }, { headers })).entries).toBe(1n);
      expect(await peers()).toBe(0);
      // Everything, asked for by name.
      expect((await admin.purgeCache({ everything: true }, { headers })).entries).toBe(2n);
      expect(await get(itemB!)).toEqual({ cache: 0, sent: 1 });
      expect(await peers()).toBe(0);
      expect(gw.runtime.cache!.bytes).toBeGreaterThan(0);
      expect((await admin.purgeCache({ everything: true }, { headers })).entries).toBe(2n);
      expect(gw.runtime.cache!.bytes).toBe(0);
    }
    // Each purge is in the log, with who made it.
    const purges = logLines.map((l) => JSON.parse(l) as { msg: string; by?: string; entries?: number; operation?: string; numIid?: string }).filter((l) => l.msg.startsWith("cached answers purged"));
    expect(purges).toHaveLength(12);
    expect(purges[1]).toMatchObject({ by: "admin-api 127.0.0.1", operation: "retail/item_get", numIid: itemA, entries: 2 });
  });

  it("refuses a request that names nothing, an unknown operation, a num_iid that is not one, and a caller without the token", async () => {
    const admin = createClient(AdminService, createConnectTransport({ baseUrl: gw.base, httpVersion: "1.1" }));
    expect(await get(itemB!)).toMatchObject({ sent: expect.any(Number) });
    for (const [request, code, words] of [
      [{}, Code.InvalidArgument, "everything"],
      [{ operation: "retail/item_list" }, Code.InvalidArgument, "retail/item_list"],
      [{ numIid: "12ab" }, Code.InvalidArgument, "num_iid"],
      [{ numIid: "1".repeat(21) }, Code.InvalidArgument, "num_iid"],
    ] as const) {
      const refused = await admin.purgeCache(request, { headers }).catch((e: unknown) => ConnectError.from(e));
      expect(refused).toMatchObject({ code });
      expect((refused as ConnectError).rawMessage).toContain(words);
    }
    const unauthenticated = await admin.purgeCache({ everything: true }).catch((e: unknown) => ConnectError.from(e));
    expect(unauthenticated).toMatchObject({ code: Code.Unauthenticated });
    // Nothing was dropped by any of them.
    expect(await get(itemB!)).toEqual({ cache: 1, sent: 0 });
  });
});
