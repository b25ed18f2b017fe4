import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { demoRecords } from "../src/catalogue/demo-dataset.ts";
import { demo, legacyGet, startGateway, type GatewayFixture } from "./support/gateway-fixture.ts";

// Key orders as legacy-wire-notes.md gives them.
const itemDetailTopKeys = [
  "item", "error", "secache", "secache_time", "secache_date", "translate_status", "translate_time",
  "language", "reason", "error_code", "cache", "api_info", "execution_time", "server_time", "client_ip",
  "call_args", "api_type", "translate_language", "translate_engine", "server_memory", "request_id", "last_id",
];
const itemKeysFromNotes = [
  "num_iid", "title", "desc_short", "price", "total_price", "suggestive_price", "orginal_price", "nick", "num",
  "min_num", "detail_url", "pic_url", "brand", "brandId", "rootCatId", "cid", "crumbs", "created_time",
  "modified_time", "delist_time", "desc", "item_imgs", "item_weight", "item_size", "location", "post_fee",
  "express_fee", "ems_fee", "shipping_to", "has_discount", "video", "is_virtual", "sample_id", "is_promotion",
  "props_name", "prop_imgs", "property_alias", "props", "total_sold", "skus", "seller_id", "sales", "shop_id",
  "props_list", "seller_info", "tmall", "error", "warning",
];
// Spec 2.3 fields missing from the notes' list, in the spec's order.
const itemKeysAfterNotes = [
  "favcount", "fanscount", "url_log", "shop_item", "relate_items", "stuff_status", "rate_grade", "shopinfo",
  "data_from", "method", "promo_type", "props_img",
];

let gw: GatewayFixture;
let auth: Record<string, string>;

beforeAll(async () => {
  gw = await startGateway();
  auth = { key: gw.account.key, secret: gw.account.secret };
});
afterAll(() => gw.close());

describe("item detail success (retail item_get)", () => {
  it("has the legacy key order and value types", async () => {
    const { status, json, headers } = await legacyGet(gw.base, "/retail/item_get/", { ...auth, num_iid: demo.retailNumIid, is_promotion: "1" });
    expect(status).toBe(200);
    expect(headers.get("content-type")).toBe("application/json; charset=utf-8");
    expect(Object.keys(json)).toEqual(itemDetailTopKeys);
    const item = json.item as Record<string, unknown>;
    expect(Object.keys(item)).toEqual([...itemKeysFromNotes, ...itemKeysAfterNotes]);

    expect(json.error).toBe("");
    expect(json.reason).toBe("");
    expect(json.error_code).toBe("0000");
    expect(json.cache).toBe(0);
    expect(json.secache).toMatch(/^[0-9a-f]{32}$/);
    expect(Number.isInteger(json.secache_time)).toBe(true);
    expect(json.secache_date).toMatch(/^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}$/);
    expect(json.translate_status).toBe("");
    expect(json.translate_time).toBe(0);
    expect(json.language).toEqual({ current_lang: "cn", source_lang: "cn" });
    expect(json.execution_time).toMatch(/^\d+\.\d{3}$/);
    expect(json.server_time).toMatch(/^Beijing\/\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}$/);
    expect(json.client_ip).toBe("127.0.0.1");
    expect(json.call_args).toEqual({ num_iid: demo.retailNumIid, is_promotion: "1" });
    expect(json.api_type).toBe("retail");
    expect(json.translate_language).toBe("zh-CN");
    expect(json.server_memory).toMatch(/^\d+\.\d{2}MB$/);
    expect(json.request_id).toMatch(/^gw-1\.[0-9a-f]{13}$/);
    expect(json.api_info).toMatch(/^today:\d+ max:10000 all\[\d+=\d+\+0\+0\];expires:\d{4}-\d{2}-\d{2}$/);
    expect(json.last_id).toMatch(/^\d+$/);

    expect(item.num_iid).toBe(demo.retailNumIid);
    for (const k of ["price", "total_price", "suggestive_price", "min_num"]) expect(typeof item[k]).toBe("number");
    expect(item.orginal_price).toMatch(/^\d+\.\d{2}$/);
    for (const k of ["crumbs", "video", "url_log", "shop_item", "relate_items"]) expect(item[k]).toEqual([]);
    expect(item.promo_type).toBeNull();
    expect(String(item.pic_url).startsWith("//")).toBe(true);
    const skus = (item.skus as { sku: Record<string, string>[] }).sku;
    expect(skus.length).toBeGreaterThan(1);
    expect(Object.keys(skus[0]!)).toEqual(["price", "orginal_price", "properties", "properties_name", "quantity", "sku_id"]);
    for (const sku of skus) {
      expect(sku.properties).toMatch(/^\d+:\d+(;\d+:\d+)*$/);
      expect(typeof sku.quantity).toBe("string");
    }
    const props = item.props_list as Record<string, string>;
    for (const [code, text] of Object.entries(props)) {
      expect(code).toMatch(/^\d+:\d+$/);
      expect(text).toContain(":");
    }
    expect(Object.keys(item.seller_info as object)).toEqual(["title", "shop_name", "nick", "sid", "zhuy", "shop_type", "user_num_id"]);
    expect(Object.keys(item.shopinfo as object)).toEqual(["shop_name", "shop_id"]);
    expect(Object.keys((item.prop_imgs as { prop_img: object[] }).prop_img[0]!)).toEqual(["properties", "url"]);
  });

  it("charges the call: today counts up by one per success", async () => {
    const before = await legacyGet(gw.base, "/retail/item_get/", { ...auth, num_iid: demo.retailNumIid });
    const after = await legacyGet(gw.base, "/retail/item_get/", { ...auth, num_iid: demo.retailNumIid });
    const today = (r: { json: Record<string, unknown> }) => Number(/today:(\d+)/.exec(String(r.json.api_info))![1]);
    expect(today(after)).toBe(today(before) + 1);
  });

  it("gives promotion prices only with is_promotion=1", async () => {
    const promo = (await legacyGet(gw.base, "/retail/item_get/", { ...auth, num_iid: demo.retailNumIid, is_promotion: "1" })).json.item as Record<string, unknown>;
    const plain = (await legacyGet(gw.base, "/retail/item_get/", { ...auth, num_iid: demo.retailNumIid })).json.item as Record<string, unknown>;
    expect(plain.price).toBe(Number(plain.orginal_price));
    expect(promo.price).toBeLessThan(plain.price as number);
  });
});

describe("peer-viewed success (wholesale item_search_peerbuy)", () => {
  it("has item, the status block and the peer-viewed extras", async () => {
    const { json } = await legacyGet(gw.base, "/wholesale/item_search_peerbuy/", { ...auth, num_iid: demo.wholesaleNumIid, sid: demo.wholesaleSid });
    expect(Object.keys(json)).toEqual([
      "item", "error", "reason", "error_code", "cache", "api_info", "execution_time", "server_time", "client_ip",
      "call_args", "api_type", "translate_language", "translate_engine", "server_memory", "request_id", "_ddf", "last_id",
    ]);
    const items = json.item as Record<string, unknown>[];
    expect(items.length).toBeGreaterThan(0);
    for (const i of items) {
      expect(Object.keys(i)).toEqual(["num_iid", "price", "pic_url", "title", "sales", "seller_id", "detail_url"]);
      for (const v of Object.values(i)) expect(typeof v).toBe("string");
      expect(String(i.pic_url)).toMatch(/^https:\/\//);
    }
    expect(json.error_code).toBe("0000");
    expect(json.api_type).toBe("wholesale");
    expect(json.call_args).toEqual({ num_iid: demo.wholesaleNumIid, sid: demo.wholesaleSid });
    expect(json._ddf).toBe("embedded");
    expect(json.last_id).toBe(items.at(-1)!.num_iid);
  });
});

describe("error shape", () => {
  it("is the status block alone with success 0, and call_args [] when there are none", async () => {
    const { body, json } = await legacyGet(gw.base, "/retail/item_get/", { ...auth });
    expect(Object.keys(json)).toEqual([
      "error", "reason", "error_code", "success", "cache", "api_info", "execution_time", "server_time",
      "call_args", "api_type", "translate_language", "translate_engine", "server_memory", "request_id",
    ]);
    expect(json.success).toBe(0);
    expect(json.error_code).toBe("4014");
    expect(body).toContain('"call_args":[]');
  });
});

describe("legacy bytes", () => {
  it("is compact, escapes / and non-ASCII for json, keeps UTF-8 for jsonu", async () => {
    const params = { ...auth, num_iid: demo.retailNumIid };
    const json = await legacyGet(gw.base, "/retail/item_get/", params);
    const jsonu = await legacyGet(gw.base, "/retail/item_get/", { ...params, result_type: "jsonu" });
    expect(json.body).not.toMatch(/": |, "/);
    expect(json.body).toMatch(/"pic_url":"\\\/\\\/img/);
    expect(json.body).toMatch(/^[\x20-\x7e]*$/);
    expect(json.body).toMatch(/\\u[0-9a-f]{4}/);
    expect(jsonu.body).toContain((json.json.item as { title: string }).title);
    expect(jsonu.body).toMatch(/"pic_url":"\\\/\\\/img/);
    expect(jsonu.json.item).toEqual(json.json.item);
  });

  it("writes non-BMP characters as surrogate pairs in json", async () => {
    const withEmoji = demoRecords().find((r) => r.kind === "item_detail" && r.obtainable && /\p{Extended_Pictographic}/u.test((r.item as { title: string }).title) && /[\u{10000}-\u{10FFFF}]/u.test((r.item as { title: string }).title));
    expect(withEmoji, "the demo dataset has an obtainable item with a non-BMP title").toBeDefined();
    const item = withEmoji!.item as { num_iid: string; title: string };
    const astral = [...item.title].find((c) => c.codePointAt(0)! > 0xffff)!;
    const pair = [astral.charCodeAt(0), astral.charCodeAt(1)].map((u) => `\\u${u.toString(16)}`).join("");
    const json = await legacyGet(gw.base, "/retail/item_get/", { ...auth, num_iid: item.num_iid });
    const jsonu = await legacyGet(gw.base, "/retail/item_get/", { ...auth, num_iid: item.num_iid, result_type: "jsonu" });
    expect(json.body).toContain(pair);
    expect(jsonu.body).toContain(astral);
    expect((json.json.item as { title: string }).title).toBe(item.title);
  });

  it("answers with and without the trailing slash alike", async () => {
    const a = await legacyGet(gw.base, "/retail/item_get/", { ...auth, num_iid: demo.retailNumIid });
    const b = await legacyGet(gw.base, "/retail/item_get", { ...auth, num_iid: demo.retailNumIid });
    expect(b.json.item).toEqual(a.json.item);
  });

  it("gives unique, time-ordered request ids", async () => {
    const ids: string[] = [];
    for (let i = 0; i < 20; i++) ids.push(String((await legacyGet(gw.base, "/retail/item_get/", { num_iid: "1" })).json.request_id));
    expect(new Set(ids).size).toBe(20);
    expect([...ids].sort()).toEqual(ids);
  });

  it("answers HEAD with the headers of GET and no body", async () => {
    const res = await fetch(`${gw.base}/retail/item_get/?${new URLSearchParams({ ...auth, num_iid: demo.retailNumIid })}`, { method: "HEAD" });
    expect(res.status).toBe(200);
    expect(res.headers.get("content-type")).toBe("application/json; charset=utf-8");
    expect(await res.text()).toBe("");
  });
});
