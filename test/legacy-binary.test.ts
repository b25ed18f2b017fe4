import { create, toBinary, type DescMessage } from "@bufbuild/protobuf";
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { legacyBinary, legacyBinaryList } from "../src/catalogue/legacy-binary.ts";
import { readLegacyMessage, requireComplete } from "../src/catalogue/legacy-message.ts";
import { readCatalogueRecord } from "../src/catalogue/catalogue-record.ts";
import { demoRecords } from "../src/catalogue/demo-dataset.ts";
import { ItemDetailSchema } from "../src/gen/gateway/catalogue/v1/retail_pb.js";
import { ItemSearchPeerbuyResponseSchema, PeerViewedItemSchema } from "../src/gen/gateway/catalogue/v1/wholesale_pb.js";

// The import's short path (legacy object → protobuf bytes in one walk) against the general reader
// (PHP empty arrays dropped, protobuf's JSON reader, the completeness check, protobuf's binary
// writer): whenever the short path answers, the general reader accepts the same record and writes
// the same bytes; whatever it declines, the general reader still judges.

/** The general reader's bytes for a complete record, or the error it throws. */
function general(desc: DescMessage, value: unknown): Uint8Array | Error {
  try {
    const message = readLegacyMessage(desc, value, "item");
    requireComplete(desc, value, "item");
    return toBinary(desc, message);
  } catch (e) {
    return e as Error;
  }
}

const records = demoRecords();
const details = records.filter((r) => r.kind === "item_detail" && r.obtainable !== false).map((r) => r.item as Record<string, unknown>);
const peerLists = records.filter((r) => r.kind === "peer_viewed").map((r) => r.item as Record<string, unknown>[]);

/** JSON values a hostile or sloppy file may put where a field is due. */
const anyValue: fc.Arbitrary<unknown> = fc.oneof(
  fc.constantFrom(null, [], {}, "", " 1", "1 ", "0", "-0", "1e3", "0x10", "NaN", "Infinity", true, false, 0, -0, 1, -1, -2147483648, 2147483647, 2147483648, 1.5, -7.25, 1e300),
  fc.integer(),
  fc.double({ noNaN: true, noDefaultInfinity: true }),
  fc.string({ maxLength: 60 }),
  fc.string({ unit: "grapheme", maxLength: 50 }),
  fc.string({ unit: fc.constantFrom("a", "é", "中", "😀", "\ud800", "\udc00"), maxLength: 60 }),
  fc.array(fc.string({ maxLength: 8 }), { maxLength: 3 }),
  fc.dictionary(fc.string({ maxLength: 6 }), fc.string({ maxLength: 6 }), { maxKeys: 3 }),
);

/** A demo record with a few fields changed, removed, added twice (by JSON name) or unknown. */
function mutated(base: Record<string, unknown>, desc: DescMessage) {
  const names = desc.fields.flatMap((f) => [f.name, f.jsonName]);
  const change = fc.record({ key: fc.oneof(fc.constantFrom(...names), fc.string({ maxLength: 8 })), value: anyValue, remove: fc.boolean() });
  return fc.array(change, { minLength: 1, maxLength: 3 }).map((changes) => {
    const out: Record<string, unknown> = structuredClone(base);
    for (const c of changes) {
      if (c.remove) delete out[c.key];
      else out[c.key] = c.value;
    }
    return out;
  });
}

function expectSameOrDeclined(desc: DescMessage, value: unknown): "short" | "general" {
  const short = legacyBinary(desc, value);
  const slow = general(desc, value);
  if (short === undefined) return "general";
  expect(slow).toBeInstanceOf(Uint8Array);
  expect(Buffer.from(short).equals(Buffer.from(slow as Uint8Array))).toBe(true);
  return "short";
}

describe("the import's short path to protobuf bytes", () => {
  it("takes every demo detail record, writing the general reader's bytes exactly", () => {
    expect(details.length).toBeGreaterThan(100);
    for (const item of details) expect(expectSameOrDeclined(ItemDetailSchema, item)).toBe("short");
  });

  it("takes every demo peer-viewed list, writing the response message's bytes exactly", () => {
    for (const list of peerLists) {
      const short = legacyBinaryList(ItemSearchPeerbuyResponseSchema.field.item, list);
      const slow = toBinary(ItemSearchPeerbuyResponseSchema, create(ItemSearchPeerbuyResponseSchema, { item: list.map((e) => readLegacyMessage(PeerViewedItemSchema, e, "item")) }));
      expect(short).toBeDefined();
      expect(Buffer.from(short!).equals(Buffer.from(slow))).toBe(true);
    }
  });

  it("writes the same bytes for texts of every length and script, long nested lists, negative and edge numbers", () => {
    const base = details.find((d) => Array.isArray((d.skus as { sku: unknown[] }).sku) && (d.skus as { sku: unknown[] }).sku.length > 4)!;
    // Around the lengths where a text's own length prefix, and its message's, take a second byte.
    for (let n = 38; n <= 70; n++) {
      for (const unit of ["中", "😀", "é", "a"]) expect(expectSameOrDeclined(ItemDetailSchema, { ...base, title: unit.repeat(n), seller_info: { ...(base.seller_info as object), title: unit.repeat(n) } })).toBe("short");
    }
    const text = fc.string({ unit: fc.constantFrom("a", "é", "中", "😀", "\u0000", "\u007f", "\u0080", "\u07ff", "\u0800", "\uffff"), maxLength: 300 });
    const variant = fc.record({
      title: text,
      desc: fc.string({ unit: "grapheme", maxLength: 20000 }),
      min_num: fc.integer({ min: -2147483648, max: 2147483647 }),
      price: fc.oneof(fc.double({ noNaN: true, noDefaultInfinity: true }), fc.double({ noNaN: true, noDefaultInfinity: true }).map(String)),
      crumbs: fc.array(text, { maxLength: 5 }),
      props_list: fc.dictionary(text, text, { maxKeys: 5 }),
      promo_type: fc.option(text, { nil: null }),
      copies: fc.integer({ min: 0, max: 40 }),
    });
    fc.assert(
      fc.property(variant, (v) => {
        const skus = (base.skus as { sku: Record<string, unknown>[] }).sku;
        const item = { ...structuredClone(base), ...v, skus: { sku: Array.from({ length: v.copies }, (_, i) => ({ ...skus[i % skus.length]!, properties_name: v.title })) } };
        delete (item as Record<string, unknown>).copies;
        expect(expectSameOrDeclined(ItemDetailSchema, item)).toBe("short");
      }),
      { numRuns: 300 },
    );
  });

  it("declines whatever the general reader would judge differently, and never writes other bytes", () => {
    let short = 0;
    let declined = 0;
    fc.assert(
      fc.property(fc.constantFrom(...details.slice(0, 20)).chain((d) => mutated(d, ItemDetailSchema)), (item) => {
        if (expectSameOrDeclined(ItemDetailSchema, item) === "short") short++;
        else declined++;
      }),
      { numRuns: 2000 },
    );
    // Both ways are exercised: plain changes stay on the short path, the rest is declined.
    expect(short).toBeGreaterThan(100);
    expect(declined).toBeGreaterThan(100);
  });

  it("declines nested records off the path: a sku with an unknown key, a null message, a lone surrogate", () => {
    const base = details[0]!;
    const skus = (base.skus as { sku: Record<string, unknown>[] }).sku;
    for (const item of [
      { ...base, skus: { sku: [{ ...skus[0], colour: "red" }] } },
      { ...base, seller_info: null },
      { ...base, title: "\ud800 broken" },
      { ...base, desc: `${"长".repeat(50)}\udc00` },
      { ...base, numIid: base.num_iid },
      { ...base, brand_id: "1", brandId: "1" },
    ]) {
      expect(legacyBinary(ItemDetailSchema, item)).toBeUndefined();
    }
  });

  it("leaves the reading of import lines as it was: same keys, same bytes, same messages for bad lines", () => {
    for (const r of records) {
      const read = readCatalogueRecord(r);
      expect(read.key).toBeTruthy();
    }
    const line = (item: unknown, extra: Record<string, unknown> = {}) => ({ kind: "item_detail", item, ...extra });
    // A field by its JSON name is a field: the key is found either way.
    const camel = Object.fromEntries(Object.entries(details[0]!).map(([k, v]) => [k === "num_iid" ? "numIid" : k, v]));
    expect(legacyBinary(ItemDetailSchema, camel)).toBeDefined();
    expect(readCatalogueRecord(line(camel)).key).toBe(details[0]!.num_iid);
    expect(() => readCatalogueRecord(line({ ...details[0], num_iid: "x1" }))).toThrow("item.num_iid must be a string matching");
    expect(() => readCatalogueRecord(line({ ...details[0] }, { obtainable: "yes" }))).toThrow("obtainable must be true or false");
    const { seller_info: _, ...withoutSeller } = details[0]!;
    expect(() => readCatalogueRecord(line(withoutSeller))).toThrow("item.seller_info is missing");
    expect(() => readCatalogueRecord(line({ ...details[0], price: "cheap" }))).toThrow(/item: .*price/);
  });
});
