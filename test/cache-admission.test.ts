// The response cache's admission: an answer of the gateway's own catalogue is kept from the second
// request for its key on (a walk over the catalogue does not push the popular items out, nor
// costs an entry per item walked); a paid provider's answer is kept from the first (nothing is
// bought twice).
import { create } from "@bufbuild/protobuf";
import { describe, expect, it } from "vitest";
import { CachedCatalogue, defaultCachePolicy } from "../src/core/cached-catalogue.ts";
import type { CatalogueSource, Found } from "../src/core/catalogue-source.ts";
import { Doorkeeper } from "../src/core/doorkeeper.ts";
import { ItemDetailSchema } from "../src/gen/gateway/catalogue/v1/retail_pb.js";
import { retailItemGet } from "../src/operations/retail-item-get.ts";
import { MemoryCache } from "../src/stores/embedded/response-cache.ts";

/** A source that answers every item and counts what it was asked. */
function countingSource(local: boolean, delayMs = 0): CatalogueSource & { fetches: Map<string, number> } {
  const fetches = new Map<string, number>();
  return {
    label: local ? "embedded" : "upstream",
    local,
    fetches,
    async fetch(_op, args): Promise<Found> {
      fetches.set(args.num_iid!, (fetches.get(args.num_iid!) ?? 0) + 1);
      await new Promise((r) => setTimeout(r, delayMs));
      return { found: true, value: create(ItemDetailSchema, { numIid: args.num_iid!, title: "商品".repeat(20) }), storedAt: 1_700_000_000, token: "0".repeat(32) };
    },
  };
}

function catalogueOver(source: CatalogueSource, cacheBytes = 64 << 20) {
  const cache = new MemoryCache(cacheBytes);
  return { cache, catalogue: new CachedCatalogue(new Map([["retail", source]]), cache, defaultCachePolicy) };
}

const ask = (c: CachedCatalogue, id: string) => c.answer(retailItemGet, { num_iid: id, is_promotion: "1" }, "cn", true, new AbortController().signal);

describe("the doorkeeper", () => {
  it("says a key is new the first time and seen after, and forgets it two generations later", () => {
    const d = new Doorkeeper(1000);
    expect(d.seenBefore("a")).toBe(false);
    expect(d.seenBefore("a")).toBe(true);
    for (let i = 0; i < 1000; i++) d.seenBefore(`k${i}`);
    expect(d.seenBefore("a")).toBe(true); // in the older generation now
    for (let i = 1000; i < 3000; i++) d.seenBefore(`k${i}`);
    expect(d.seenBefore("a")).toBe(false);
  });

  it("takes few new keys for seen at a full generation (Bloom filter false positives)", () => {
    const d = new Doorkeeper(100_000);
    for (let i = 0; i < 99_999; i++) d.seenBefore(`retail/item_get\u0000${700_000_000_000 + i}\u00001\u0000cn`);
    let wrong = 0;
    for (let i = 0; i < 10_000; i++) if (d.seenBefore(`retail/item_get\u0000${800_000_000_000 + i}\u00001\u0000cn`)) wrong++;
    expect(wrong / 10_000).toBeLessThan(0.03);
  });
});

describe("admission to the response cache", () => {
  it("keeps a local catalogue's answer from its second request: read, read, then hit", async () => {
    const source = countingSource(true);
    const { cache, catalogue } = catalogueOver(source);
    const first = await ask(catalogue, "700000000001");
    expect([first.fromCache, first.memo]).toEqual([false, undefined]); // nothing kept, nothing to memoise
    expect(cache.bytes).toBe(0);
    const second = await ask(catalogue, "700000000001");
    expect(second.fromCache).toBe(false);
    expect(second.memo).toBeDefined();
    expect(cache.bytes).toBeGreaterThan(0);
    expect((await ask(catalogue, "700000000001")).fromCache).toBe(true);
    expect(source.fetches.get("700000000001")).toBe(2);
  });

  it("keeps a paid provider's answer from the first request: nothing is bought twice", async () => {
    const source = countingSource(false);
    const { catalogue } = catalogueOver(source);
    expect((await ask(catalogue, "700000000002")).fromCache).toBe(false);
    for (let i = 0; i < 3; i++) expect((await ask(catalogue, "700000000002")).fromCache).toBe(true);
    expect(source.fetches.get("700000000002")).toBe(1);
  });

  it("still makes one read for simultaneous first requests of a local item", async () => {
    const source = countingSource(true, 5);
    const { catalogue } = catalogueOver(source);
    await Promise.all(Array.from({ length: 20 }, () => ask(catalogue, "700000000003")));
    expect(source.fetches.get("700000000003")).toBe(1);
  });

  it("keeps the popular item through a walk over a catalogue larger than the cache", async () => {
    const source = countingSource(true);
    // Room for about a hundred entries.
    const { cache, catalogue } = catalogueOver(source, 100 * 3000);
    await ask(catalogue, "700000000004");
    await ask(catalogue, "700000000004");
    for (let i = 0; i < 5000; i++) await ask(catalogue, String(710_000_000_000 + i));
    expect((await ask(catalogue, "700000000004")).fromCache).toBe(true);
    // The walk kept nothing: each item was asked for once.
    expect(cache.bytes).toBeLessThan(2 * 3000);
  });
});
