// Records decoded into messages kept in fast mode (src/core/message-shape.ts):
// to protobuf-es the same messages as fromBinary/fromJson make, field for
// field and in the same order, and counted by the cache as what they hold.
import { create, equals, fromBinary, fromJson, toBinary, toJsonString, type DescMessage } from "@bufbuild/protobuf";
import { setFlagsFromString } from "node:v8";
import { runInNewContext } from "node:vm";
import { describe, expect, it } from "vitest";
import { readCatalogueRecord } from "../src/catalogue/catalogue-record.ts";
import { demoDetailCopies, demoRecords } from "../src/catalogue/demo-dataset.ts";
import { decodeMessage, heldInPlace, maxPlacedProperties, messageFromJson, zeroMessage } from "../src/core/message-shape.ts";
import { retainedBytes } from "../src/core/retained-size.ts";
import * as retail from "../src/gen/gateway/catalogue/v1/retail_pb.js";
import * as status from "../src/gen/gateway/catalogue/v1/status_pb.js";
import * as wholesale from "../src/gen/gateway/catalogue/v1/wholesale_pb.js";
import { ItemDetailSchema } from "../src/gen/gateway/catalogue/v1/retail_pb.js";

setFlagsFromString("--expose-gc");
const gc = runInNewContext("gc") as () => void;

const schemas = [retail, wholesale, status].flatMap((m) => Object.values(m).filter((v): v is DescMessage => (v as DescMessage)?.kind === "message"));
const records = demoRecords().map((line) => readCatalogueRecord(line));

/** The same message, and built the same way: keys in the same order, at every level. */
function expectSame(desc: DescMessage, ours: unknown, theirs: unknown): void {
  expect(equals(desc, ours as never, theirs as never)).toBe(true);
  expect(ours).toStrictEqual(theirs);
  const order = (v: unknown): unknown => (Array.isArray(v) ? v.map(order) : v !== null && typeof v === "object" && !ArrayBuffer.isView(v) ? Object.entries(v).map(([k, x]) => [k, order(x)]) : v);
  expect(order(ours)).toEqual(order(theirs));
  expect(toBinary(desc, ours as never)).toEqual(toBinary(desc, theirs as never));
  expect(toJsonString(desc, ours as never, { alwaysEmitImplicit: true })).toBe(toJsonString(desc, theirs as never, { alwaysEmitImplicit: true }));
}

describe("zeroMessage", () => {
  it("is create()'s zero message for every message type of the contract, in place where the type has many fields", () => {
    expect(schemas.length).toBeGreaterThan(10);
    for (const desc of schemas) {
      expectSame(desc, zeroMessage(desc), create(desc));
      expect(heldInPlace(zeroMessage(desc)), desc.typeName).toBe(desc.members.length >= maxPlacedProperties);
    }
    expect(heldInPlace(zeroMessage(ItemDetailSchema))).toBe(true);
    expect(heldInPlace(create(ItemDetailSchema))).toBe(false);
  });

  it("gives each message its own lists and maps", () => {
    const a = zeroMessage(ItemDetailSchema);
    a.props.push(create(retail.PropSchema, { name: "n" }));
    a.propsList["1:2"] = "x";
    const b = zeroMessage(ItemDetailSchema);
    expect(b.props).toEqual([]);
    expect(b.propsList).toEqual({});
  });
});

describe("decodeMessage", () => {
  it("decodes every demo record as fromBinary does", () => {
    expect(records.length).toBeGreaterThan(400);
    for (const r of records) {
      expectSame(r.kind.schema, decodeMessage(r.kind.schema, r.bytes), fromBinary(r.kind.schema, r.bytes));
    }
  });

  it("merges a record written twice, and keeps unknown fields, as fromBinary does", () => {
    const [a, b] = [...demoDetailCopies(2, 900_000_000_000)].map((line) => readCatalogueRecord(line).bytes);
    const unknown = Uint8Array.of(0xb8, 0x3e, 0x96, 0x01); // field 999 as a varint (tag 7992), the value 150
    for (const bytes of [Buffer.concat([a!, b!]), Buffer.concat([a!, unknown]), Buffer.concat([unknown, b!, a!]), new Uint8Array()]) {
      expectSame(ItemDetailSchema, decodeMessage(ItemDetailSchema, bytes), fromBinary(ItemDetailSchema, bytes));
    }
  });

  it("refuses what fromBinary refuses", () => {
    const bad = Uint8Array.of(0x0a, 0x05, 0x61); // a length past the end
    expect(() => fromBinary(ItemDetailSchema, bad)).toThrow();
    expect(() => decodeMessage(ItemDetailSchema, bad)).toThrow();
  });
});

describe("messageFromJson", () => {
  it("reads every demo record's JSON as fromJson does", () => {
    for (const r of records) {
      const json = JSON.parse(toJsonString(r.kind.schema, fromBinary(r.kind.schema, r.bytes)));
      expectSame(r.kind.schema, messageFromJson(r.kind.schema, json), fromJson(r.kind.schema, json));
    }
  });
});

describe("what a decoded record holds", () => {
  it("is counted as its fields in place, and the heap agrees", () => {
    const detail = records.filter((r) => r.kind.schema === ItemDetailSchema);
    const inPlace = decodeMessage(ItemDetailSchema, detail[0]!.bytes);
    const hashed = fromBinary(ItemDetailSchema, detail[0]!.bytes);
    const keys = Object.keys(inPlace).length;
    // The same nested objects and strings; the top object's hash table (3,160 bytes for 61 keys) against its slots.
    expect(retainedBytes(hashed) - retainedBytes(inPlace)).toBe(24 + 64 + 24 * 128 - (24 + 8 * keys));

    const n = 3000;
    const lines = [...demoDetailCopies(n, 910_000_000_000)].map((line) => readCatalogueRecord(line).bytes);
    const heapPerItem = (decode: (bytes: Uint8Array) => unknown): { measured: number; counted: number } => {
      for (let i = 0; i < 3; i++) gc();
      const before = process.memoryUsage().heapUsed;
      const kept = lines.map(decode);
      for (let i = 0; i < 3; i++) gc();
      const measured = (process.memoryUsage().heapUsed - before) / n;
      const counted = kept.reduce((s: number, m) => s + retainedBytes(m), 0) / n;
      return { measured, counted };
    };
    const ours = heapPerItem((b) => decodeMessage(ItemDetailSchema, b));
    const theirs = heapPerItem((b) => fromBinary(ItemDetailSchema, b));
    console.log(
      `decoded ItemDetail: fromBinary ${Math.round(theirs.measured)} bytes on the heap (counted ${Math.round(theirs.counted)}), decodeMessage ${Math.round(ours.measured)} (counted ${Math.round(ours.counted)})`,
    );
    // Most of the hash table's 2.6 KB is really saved, and each is counted within 1.5x of what it holds.
    expect(theirs.measured - ours.measured).toBeGreaterThan(1500);
    for (const { measured, counted } of [ours, theirs]) {
      expect(measured / counted).toBeGreaterThan(1 / 1.5);
      expect(measured / counted).toBeLessThan(1.5);
    }
  });
});
