import { createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { demoRecords } from "../src/catalogue/demo-dataset.ts";
import { clone, toBinary } from "@bufbuild/protobuf";
import { ItemDetailSchema, RetailService } from "../src/gen/gateway/catalogue/v1/retail_pb.js";
import { Lang } from "../src/gen/gateway/catalogue/v1/status_pb.js";
import { GlossaryEngine } from "../src/translation/glossary-engine.ts";
import { LibreTranslateEngine } from "../src/translation/libretranslate-engine.ts";
import type { ItemDetail } from "../src/gen/gateway/catalogue/v1/retail_pb.js";
import { itemDetailRecord } from "../src/operations/item-detail.ts";
import { retailItemGet } from "../src/operations/retail-item-get.ts";
import { FakeUpstream } from "./support/fake-upstream.ts";
import { demo, legacyGet, startGateway, type GatewayFixture } from "./support/gateway-fixture.ts";

type Item = Record<string, unknown> & { props_name: string; property_alias: string; props_list: Record<string, string>; skus: { sku: Record<string, string>[] } };
const retailIds = demoRecords().filter((r) => r.kind === "item_detail" && r.obtainable).map((r) => (r.item as { num_iid: string }).num_iid);
const codes = (compound: string, keep: number) => compound.split(";").map((e) => e.split(":").slice(0, keep).join(":"));

describe("the glossary engine", () => {
  it("translates known terms into English and Russian, and reports what it cannot cover", async () => {
    const g = new GlossaryEngine();
    const en = await g.translate(["颜色分类", "白色", "【官方正品】云栖宽松连衣裙", "浙江 杭州", "神秘面纱"], "en");
    expect(en.texts.slice(0, 4)).toEqual(["Color", "white", "[official genuine] Yunqi loose dress", "Zhejiang Hangzhou"]);
    expect(en.texts[4]).toBe("神秘面纱");
    expect([...en.partial]).toEqual([4]);
    const ru = await g.translate(["尺码", "黑色", "运动鞋"], "ru");
    expect(ru.texts).toEqual(["Размер", "чёрный", "кроссовки"]);
  });
});

describe("translated item detail (glossary, the embedded default)", () => {
  let gw: GatewayFixture;
  beforeAll(async () => {
    gw = await startGateway();
  });
  afterAll(() => gw.close());
  const get = async (numIid: string, lang: string) =>
    (await legacyGet(gw.base, "/retail/item_get/", { key: gw.account.key, secret: gw.account.secret, num_iid: numIid, lang, result_type: "jsonu" })).json;

  it("keeps every code, number, URL and separator byte for byte, across the demo catalogue", async () => {
    for (const id of retailIds.slice(0, 40)) {
      const cn = (await get(id, "cn")).item as Item;
      for (const lang of ["en", "ru"]) {
        const r = await get(id, lang);
        const tr = r.item as Item;
        expect(r.error_code).toBe("0000");
        for (const field of ["num_iid", "price", "orginal_price", "pic_url", "detail_url", "num", "seller_id", "shop_id", "desc", "item_imgs", "prop_imgs", "props_img", "brandId"]) {
          expect(tr[field], `${id} ${lang} ${field}`).toEqual(cn[field]);
        }
        expect(codes(tr.props_name, 2)).toEqual(codes(cn.props_name, 2));
        expect(tr.props_name.split(";").every((e) => e.split(":").length === 4)).toBe(true);
        expect(codes(tr.property_alias, 2)).toEqual(codes(cn.property_alias, 2));
        expect(Object.keys(tr.props_list)).toEqual(Object.keys(cn.props_list));
        expect(Object.values(tr.props_list).every((v) => v.split(":").length === 2)).toBe(true);
        tr.skus.sku.forEach((sku, i) => {
          const src = cn.skus.sku[i]!;
          expect({ ...sku, properties_name: codes(sku.properties_name!, 2) }).toEqual({ ...src, properties_name: codes(src.properties_name!, 2) });
        });
        expect(JSON.stringify(tr.props_name)).not.toMatch(/\p{Script=Han}/u);
      }
    }
  });

  it("reports the translation in the status block, the same on the legacy and the RPC path", async () => {
    const legacy = await get(demo.retailNumIid, "en");
    expect(legacy).toMatchObject({ translate_language: "en", translate_engine: "glossary", translate_status: "", language: { current_lang: "en", source_lang: "cn" } });
    const rpc = await createClient(RetailService, createConnectTransport({ baseUrl: gw.base, httpVersion: "1.1" })).itemGet(
      { numIid: demo.retailNumIid, lang: Lang.EN },
      { headers: { "x-api-key": gw.account.key, "x-api-secret": gw.account.secret } },
    );
    expect(rpc.status).toMatchObject({ translateLanguage: "en", translateEngine: "glossary", translateStatus: "", language: { currentLang: "en", sourceLang: "cn" } });
    expect(rpc.item?.title).toBe((legacy.item as Item).title);
    const cn = await get(demo.retailNumIid, "cn");
    expect(cn).toMatchObject({ translate_language: "zh-CN", translate_time: 0, translate_status: "", language: { current_lang: "cn", source_lang: "cn" } });
  });

  it("says partial when the glossary cannot cover a text, and leaves that text as it was", async () => {
    const found = await gw.runtime.catalogue.fetch(retailItemGet, { num_iid: demo.retailNumIid, is_promotion: "1" });
    if (!found.found) throw new Error("the demo item is missing");
    const record = clone(ItemDetailSchema, { ...(found.value as ItemDetail), numIid: "700000000777", title: "神秘面纱连衣裙" });
    await gw.runtime.catalogue.storeBatch([{ kind: itemDetailRecord, catalogue: "retail", key: record.numIid, bytes: toBinary(ItemDetailSchema, record), obtainable: true }], 1);
    const r = await get("700000000777", "en");
    expect(r.translate_status).toBe("partial");
    expect((r.item as Item).title).toBe("神秘面纱 dress");
  });
});

/** A LibreTranslate stand-in on loopback: batch-translates, or misbehaves on purpose. */
class FakeLibreTranslate {
  behaviour: "normal" | "slow" | "error" | "garbage" | "endless" | "bloated" = "normal";
  /** Body bytes the server wrote (an endless answer is written as the socket takes it). */
  bytesWritten = 0;
  readonly batches: string[][] = [];
  inFlight = 0;
  peak = 0;
  private server!: http.Server;
  get url() {
    return `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
  }
  async start() {
    this.server = http.createServer((req, res) => {
      let body = "";
      req.on("data", (d: Buffer) => (body += d.toString()));
      req.on("end", () => {
        const { q, target } = JSON.parse(body) as { q: string[]; target: string };
        this.batches.push(q);
        this.peak = Math.max(this.peak, ++this.inFlight);
        const done = (status: number, text: string) => {
          this.inFlight--;
          res.writeHead(status, { "content-type": "application/json" }).end(text);
        };
        if (this.behaviour === "error") return done(500, '{"error":"boom"}');
        if (this.behaviour === "garbage") return done(200, "<html>");
        // A text of 100 kB for every segment: well-formed, and out of all proportion to the segments.
        if (this.behaviour === "bloated") return done(200, JSON.stringify({ translatedText: q.map(() => "x".repeat(100_000)) }));
        if (this.behaviour === "endless") {
          // An answer that starts well and never ends, written as fast as the gateway reads it.
          res.writeHead(200, { "content-type": "application/json" });
          const chunk = "x".repeat(65536);
          const more = () => {
            while (!res.destroyed && this.bytesWritten < 1 << 30) {
              this.bytesWritten += chunk.length;
              if (!res.write(chunk)) return void res.once("drain", more);
            }
          };
          res.write('{"translatedText":["');
          res.once("close", () => {
            res.off("drain", more);
            this.inFlight--;
          });
          return more();
        }
        setTimeout(() => done(200, JSON.stringify({ translatedText: q.map((s) => `${target}:${s.length}`) })), this.behaviour === "slow" ? 1000 : 60);
      });
    });
    await new Promise<void>((r) => this.server.listen(0, "127.0.0.1", r));
    return this;
  }
  stop() {
    this.server.closeAllConnections();
    return new Promise((r) => this.server.close(r));
  }
}

describe("the LibreTranslate engine", () => {
  let lt: FakeLibreTranslate;
  let upstream: FakeUpstream;
  let gw: GatewayFixture;
  let next = 50;
  beforeAll(async () => {
    lt = await new FakeLibreTranslate().start();
    upstream = await new FakeUpstream().start();
    gw = await startGateway({
      config: {
        translationEngine: "libretranslate", translateUrl: lt.url, translateTimeoutMs: 300, translateConcurrency: 2,
        upstreamUrl: upstream.url, upstreamKey: "k", upstreamSecret: "s",
      },
    });
  });
  afterAll(async () => {
    await gw.close();
    await lt.stop();
    await upstream.stop();
  });
  const get = async (numIid: string, lang: string, extra: Record<string, string> = {}) =>
    (await legacyGet(gw.base, "/retail/item_get/", { key: gw.account.key, secret: gw.account.secret, num_iid: numIid, lang, ...extra })).json;

  it("sends every segment of a response in one batch, and translates each text once", async () => {
    lt.behaviour = "normal";
    const before = lt.batches.length;
    const first = await get(retailIds[next++]!, "en");
    expect(first.error_code).toBe("0000");
    expect(first.translate_engine).toBe("libretranslate");
    expect(lt.batches.length - before).toBe(1);
    const batch = lt.batches.at(-1)!;
    expect(new Set(batch).size).toBe(batch.length);
    expect(batch).toContain("颜色分类");
    // Another item shares attribute values: only its new texts are sent.
    await get(retailIds[next++]!, "en");
    expect(lt.batches.at(-1)).not.toContain("颜色分类");
  });

  it("buys the item once for cn, en and ru, and caches each language apart", async () => {
    lt.behaviour = "normal";
    const id = retailIds[next++]!;
    const before = upstream.requests.length;
    for (const lang of ["cn", "en", "ru"]) expect((await get(id, lang)).error_code).toBe("0000");
    expect(upstream.requests.length - before).toBe(1);
    const batches = lt.batches.length;
    const hit = await get(id, "ru");
    expect([hit.cache, hit.translate_language, lt.batches.length]).toEqual([1, "ru", batches]);
  });

  it.each(["slow", "error", "garbage", "endless", "bloated"] as const)("answers a %s engine with 0000, the untranslated text, translate_status error, charged", async (behaviour) => {
    lt.behaviour = behaviour;
    const a = await gw.newAccount();
    const id = retailIds[next++]!;
    const r = (await legacyGet(gw.base, "/retail/item_get/", { key: a.key, secret: a.secret, num_iid: id, lang: "ru", result_type: "jsonu" })).json;
    expect(r.error_code).toBe("0000");
    expect(r.translate_status).toBe("error");
    expect(r.language).toEqual({ current_lang: "cn", source_lang: "cn" });
    expect((r.item as Item).title).toMatch(/\p{Script=Han}/u);
    expect(r.api_info).toMatch(/^today:1 /);
    lt.behaviour = "normal";
    // A failed translation is not cached: the next call translates.
    const again = await get(id, "ru");
    expect(again.translate_status).toBe("");
  });

  it("reads an endless answer no further than what the segments could translate to", async () => {
    lt.behaviour = "endless";
    lt.bytesWritten = 0;
    const engine = new LibreTranslateEngine({ url: lt.url, timeoutMs: 5000 });
    const failed = await engine.translate(["连衣裙", "红色"], "en", new AbortController().signal).then(() => "", (e: Error) => e.message);
    expect(failed).toMatch(/^the translation server's answer is longer than its segments could translate to \(\d+ bytes\)$/);
    // Cut off, not read on: the server wrote what the sockets took, under a few MB, not the GB it had.
    await new Promise((r) => setTimeout(r, 200));
    expect(lt.bytesWritten).toBeLessThan(16 << 20);
    lt.behaviour = "normal";
  });

  it("gives a translation waiting for a place among the requests in flight no more than its own time", async () => {
    lt.behaviour = "slow";
    // Two in flight, each taking 1 s on the server; ten asked at once with 300 ms each.
    const engine = new LibreTranslateEngine({ url: lt.url, timeoutMs: 300, concurrency: 2 });
    const started = performance.now();
    const ended = await Promise.all(Array.from({ length: 10 }, (_, i) => engine.translate([`文${i}`], "en", new AbortController().signal).then(() => "translated", () => performance.now() - started)));
    expect(ended.every((t) => typeof t === "number")).toBe(true);
    // Within their own 300 ms (and a slow machine's slack), not in turns of 300 ms each: the last would end at 1.5 s.
    expect(Math.max(...(ended as number[]))).toBeLessThan(1000);
    // Only the two that had places reached the server.
    expect(lt.batches.filter((b) => b[0]?.startsWith("文")).length).toBe(2);
    lt.behaviour = "normal";
  });

  it("keeps at most the configured number of translation requests in flight", async () => {
    lt.behaviour = "normal";
    // Requests the slow case gave up on may still be sleeping on the server.
    while (lt.inFlight > 0) await new Promise((r) => setTimeout(r, 50));
    lt.peak = 0;
    await Promise.all(retailIds.slice(next, next + 8).map((id) => get(id, "en")));
    next += 8;
    expect(lt.peak).toBeLessThanOrEqual(2);
    expect(lt.peak).toBeGreaterThan(0);
  });
});
