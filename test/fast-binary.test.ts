// fastToBinary must write exactly what toBinary writes: random status blocks
// (every field, empty and set, long and short strings, lone surrogates,
// negative and huge numbers, -0) and messages it does not take itself.
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { describe, expect, it } from "vitest";
import { ItemDetailSchema, ItemGetResponseSchema } from "../src/gen/gateway/catalogue/v1/retail_pb.js";
import { LanguageInfoSchema, StatusBlockSchema } from "../src/gen/gateway/catalogue/v1/status_pb.js";
import { fastMessageField, fastToBinary } from "../src/transports/connect/fast-binary.ts";
import { demoRecords } from "../src/catalogue/demo-dataset.ts";
import { readCatalogueRecord } from "../src/catalogue/catalogue-record.ts";
import { random, statusBlock } from "./support/random-status.ts";

describe("fastToBinary", () => {
  it("writes every random status block as toBinary does, alone and as a response's field", () => {
    for (let seed = 1; seed <= 1500; seed++) {
      const status = statusBlock(random(seed));
      const expected = toBinary(StatusBlockSchema, status);
      expect(Buffer.from(fastToBinary(StatusBlockSchema, status)).equals(Buffer.from(expected)), `seed ${seed}`).toBe(true);
      const field = toBinary(ItemGetResponseSchema, create(ItemGetResponseSchema, { status }));
      expect(Buffer.from(fastMessageField(2, StatusBlockSchema, status)).equals(Buffer.from(field)), `seed ${seed}`).toBe(true);
    }
  });

  it("writes the zero status block as nothing, and one with unknown fields as toBinary does", () => {
    expect(fastToBinary(StatusBlockSchema, create(StatusBlockSchema)).byteLength).toBe(0);
    const withUnknown = fromBinary(StatusBlockSchema, Buffer.concat([toBinary(StatusBlockSchema, statusBlock(random(7))), Buffer.from([0xf8, 0x3f, 0x01])]));
    expect(Buffer.from(fastToBinary(StatusBlockSchema, withUnknown))).toEqual(Buffer.from(toBinary(StatusBlockSchema, withUnknown)));
    const nested = create(StatusBlockSchema, { requestId: "r", language: fromBinary(LanguageInfoSchema, Buffer.from([0x0a, 0x01, 0x61, 0xf8, 0x3f, 0x01])) });
    expect(Buffer.from(fastToBinary(StatusBlockSchema, nested))).toEqual(Buffer.from(toBinary(StatusBlockSchema, nested)));
  });

  it("leaves a message of another shape (an item, with lists and nested lists) to toBinary", () => {
    const record = demoRecords().find((r) => r.kind === "item_detail" && r.obtainable)!;
    const item = fromBinary(ItemDetailSchema, readCatalogueRecord(record).bytes);
    expect(Buffer.from(fastToBinary(ItemDetailSchema, item))).toEqual(Buffer.from(toBinary(ItemDetailSchema, item)));
  });
});
