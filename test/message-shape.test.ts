// Records decoded into messages kept in fast mode (src/core/message-shape.ts):
// to protobuf-es the same messages as fromBinary/fromJson make, field for
// field and in the same order, and counted by the cache as what they hold.
import { create, createFileRegistry, equals, fromBinary, fromJson, toBinary, toJsonString, type DescMessage } from "@bufbuild/protobuf";
import { FieldDescriptorProto_Label, FieldDescriptorProto_Type, FileDescriptorProtoSchema } from "@bufbuild/protobuf/wkt";
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

/** A proto3 message of 20 fields with every kind of member a zero message holds an object for: bytes, a list, a oneof, a nested message. */
function wideMessage(): DescMessage {
  const { BYTES: TYPE_BYTES, STRING: TYPE_STRING, INT64: TYPE_INT64, DOUBLE: TYPE_DOUBLE, MESSAGE: TYPE_MESSAGE } = FieldDescriptorProto_Type;
  const { OPTIONAL: LABEL_OPTIONAL, REPEATED: LABEL_REPEATED } = FieldDescriptorProto_Label;
  const types = [TYPE_BYTES, TYPE_STRING, TYPE_INT64, TYPE_DOUBLE];
  const field = Array.from({ length: 16 }, (_, i) => ({ name: `f${i}`, jsonName: `f${i}`, number: i + 1, type: types[i % 4]!, label: i === 5 ? LABEL_REPEATED : LABEL_OPTIONAL }));
  field.push({ name: "a", jsonName: "a", number: 17, type: TYPE_STRING, label: LABEL_OPTIONAL, oneofIndex: 0 } as never);
  field.push({ name: "b", jsonName: "b", number: 18, type: TYPE_BYTES, label: LABEL_OPTIONAL, oneofIndex: 0 } as never);
  field.push({ name: "inner", jsonName: "inner", number: 19, type: TYPE_MESSAGE, typeName: ".t.Inner", label: LABEL_OPTIONAL } as never);
  field.push({ name: "more", jsonName: "more", number: 20, type: TYPE_BYTES, label: LABEL_OPTIONAL });
  const file = create(FileDescriptorProtoSchema, {
    name: "t.proto",
    package: "t",
    syntax: "proto3",
    messageType: [
      { name: "Wide", field, oneofDecl: [{ name: "choice" }] },
      { name: "Inner", field: [{ name: "x", jsonName: "x", number: 1, type: TYPE_STRING, label: LABEL_OPTIONAL }] },
    ],
  });
  return createFileRegistry(file, () => undefined).getMessage("t.Wide")!;
}

describe("a message type with every kind of member", () => {
  it("has create()'s zero message in place, and decodes as fromBinary does", () => {
    const desc = wideMessage();
    expect(desc.members.length).toBeGreaterThanOrEqual(maxPlacedProperties);
    const zero = zeroMessage(desc) as unknown as Record<string, unknown>;
    expectSame(desc, zero, create(desc));
    expect(heldInPlace(zero)).toBe(true);
    expect(zeroMessage(desc)).not.toBe(zero);
    expect((zeroMessage(desc) as unknown as Record<string, unknown>).f0).not.toBe(zero.f0);
    const full = create(desc, { f0: Uint8Array.of(1, 2), f1: "é中", f2: -5n, f3: 0.1, f5: ["x", "", "z"], f7: 2.5e-300, choice: { case: "b", value: Uint8Array.of(9) }, inner: { x: "y" }, more: Uint8Array.of(7) } as never);
    const bytes = toBinary(desc, full);
    expectSame(desc, decodeMessage(desc, bytes), fromBinary(desc, bytes));
    expect(equals(desc, decodeMessage(desc, bytes), full)).toBe(true);
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
