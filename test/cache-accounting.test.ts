// The response cache's bound counts what its entries really hold: the
// decoded answer and every rendering memoised for it, measured (not guessed
// from the wire size), including renderings added after the entry is stored.
import { create, toBinary } from "@bufbuild/protobuf";
import { setFlagsFromString } from "node:v8";
import { runInNewContext } from "node:vm";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { importRecords } from "../src/catalogue/catalogue-import.ts";
import { EntryMemo, entryBytes, type CacheEntry } from "../src/core/response-cache.ts";
import { retainedBytes } from "../src/core/retained-size.ts";
import { ItemGetRequestSchema } from "../src/gen/gateway/catalogue/v1/retail_pb.js";
import { MemoryCache } from "../src/stores/embedded/response-cache.ts";
import { distinctItems } from "./support/catalogue.ts";
import { startGateway, type GatewayFixture } from "./support/gateway-fixture.ts";

setFlagsFromString("--expose-gc");
const gc = runInNewContext("gc") as () => void;

function entry(value: unknown): CacheEntry {
  return { value, reason: "", storedAt: 0, token: "0".repeat(32), freshUntil: Number.MAX_SAFE_INTEGER, staleUntil: Number.MAX_SAFE_INTEGER, bytes: entryBytes(value, ""), memo: new EntryMemo() };
}

describe("retainedBytes", () => {
  it("counts strings by their encoding, objects and arrays by their slots, buffers by their bytes, shared objects once", () => {
    expect(retainedBytes("abcdefgh")).toBe(16 + 8);
    expect(retainedBytes("商品")).toBe(16 + 8); // two characters, two bytes each
    expect(retainedBytes("x".repeat(1000))).toBe(16 + 1000);
    expect(retainedBytes("")).toBe(0); // V8's own
    expect(retainedBytes({ a: 1, b: 2 })).toBe(24 + 16);
    expect(retainedBytes({ a: 1, b: 2, c: 3, d: 4, e: 5 })).toBe(24 + 40 + 32); // a property array past four
    // Past 16 properties added one by one, a hash table of three slots an entry, 32 entries for 20 keys.
    expect(retainedBytes(Object.fromEntries(Array.from({ length: 20 }, (_, i) => [`k${i}`, i])))).toBe(24 + 64 + 24 * 32);
    expect(retainedBytes([1, 2, 3])).toBe(32 + 16 + 8 * 16); // the capacity pushing three would give
    expect(retainedBytes([])).toBe(32);
    expect(retainedBytes(Buffer.alloc(4096))).toBe(80 + 4096);
    const shared = { big: "y".repeat(800) };
    expect(retainedBytes([shared, shared])).toBe(32 + 16 + 8 * 16 + retainedBytes(shared));
  });
});

describe("the embedded cache's bound", () => {
  it("counts renderings memoised after an entry is stored, and lets older entries go when they push it past the bound", () => {
    const first = entry({ title: "a".repeat(1000) });
    const cache = new MemoryCache(3 * first.bytes + 500);
    const entries = [first, entry({ title: "b".repeat(1000) }), entry({ title: "c".repeat(1000) })];
    entries.forEach((e, i) => cache.set(`k${i}`, e));
    const before = cache.bytes;
    expect(before).toBe(entries.reduce((n, e) => n + e.bytes, 0));
    entries[2]!.memo.set("json", "z".repeat(400));
    expect(entries[2]!.memo.bytes).toBe(16 + 400);
    expect(cache.bytes).toBe(before + 416);
    // A rendering larger than what is left pushes the least recently used entry out.
    entries[2]!.memo.set("xml", Buffer.alloc(2000));
    expect(cache.bytes).toBeLessThanOrEqual(3 * first.bytes + 500);
    expect(cache.get("k0")).toBeUndefined();
  });
});

describe("measured against the heap", () => {
  const n = 600;
  let gw: GatewayFixture;
  beforeAll(async () => {
    gw = await startGateway({ config: { cacheMaxBytes: 2 ** 31 } });
    // n distinct items: the demo's detail records under new ids, as a real catalogue would hold them.
    const report = await importRecords(gw.runtime.catalogue, distinctItems(n, 700_000_000_000) as never, { storedAt: Math.floor(Date.now() / 1000) });
    expect(report.skipped).toEqual([]);
  }, 60_000);
  afterAll(() => gw?.close());

  it(`holds the heap growth of ${n} entries, each rendered as legacy json and as binary RPC, within 1.5x of what the cache accounts (either way)`, async () => {
    const q = (id: string) => `/retail/item_get/?${new URLSearchParams({ key: gw.account.key, secret: gw.account.secret, num_iid: id })}`;
    const rpc = (id: string) =>
      gw.app.inject({
        method: "POST",
        url: "/gateway.catalogue.v1.RetailService/ItemGet",
        headers: { "content-type": "application/proto", "x-api-key": gw.account.key, "x-api-secret": gw.account.secret },
        payload: Buffer.from(toBinary(ItemGetRequestSchema, create(ItemGetRequestSchema, { numIid: id }))),
      });
    // Warm every path first, so what grows below is the entries.
    for (let i = 0; i < 20; i++) {
      await gw.app.inject(q(String(600_000_000_000 + i)));
      await rpc(String(600_000_000_000 + i));
    }
    const cache = gw.runtime.cache!;
    const measure = async () => {
      await gw.runtime.meter.flush();
      for (let i = 0; i < 3; i++) gc();
      const m = process.memoryUsage();
      return m.heapUsed + m.arrayBuffers;
    };
    const heapBefore = await measure();
    const accountedBefore = cache.bytes;
    // Each item bought once, then answered from the cache: its entry gains the legacy json
    // rendering (text, then bytes on the next hit) and the binary RPC bytes.
    for (let pass = 0; pass < 2; pass++) {
      for (let i = 0; i < n; i++) {
        const id = String(700_000_000_000 + i);
        expect(JSON.parse((await gw.app.inject(q(id))).body).error_code).toBe("0000");
        expect((await rpc(id)).statusCode).toBe(200);
      }
    }
    const grown = (await measure()) - heapBefore;
    const accounted = cache.bytes - accountedBefore;
    const ratio = grown / accounted;
    console.log(`cache accounting: ${n} entries, accounted ${(accounted / n / 1024).toFixed(1)} KiB an entry, heap grew ${(grown / n / 1024).toFixed(1)} KiB an entry (measured/accounted ${ratio.toFixed(2)})`);
    expect(ratio).toBeGreaterThan(1 / 1.5);
    expect(ratio).toBeLessThan(1.5);
  }, 120_000);
});
