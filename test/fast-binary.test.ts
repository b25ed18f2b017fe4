// fastToBinary must write exactly what toBinary writes: random status blocks
// (every field, empty and set, long and short strings, lone surrogates,
// negative and huge numbers, -0) and messages it does not take itself.
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { describe, expect, it } from "vitest";
import { ItemDetailSchema, ItemGetResponseSchema } from "../src/gen/gateway/catalogue/v1/retail_pb.js";
import { LanguageInfoSchema, StatusBlockSchema, type StatusBlock } from "../src/gen/gateway/catalogue/v1/status_pb.js";
import { fastMessageField, fastToBinary } from "../src/transports/connect/fast-binary.ts";
import { demoRecords } from "../src/catalogue/demo-dataset.ts";
import { readCatalogueRecord } from "../src/catalogue/catalogue-record.ts";

/** A deterministic generator, so a failure names its seed. */
function random(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (Math.imul(s ^ (s >>> 15), 0x2c1b3c6d) + 0x9e3779b9) >>> 0;
    return s / 2 ** 32;
  };
}

function text(r: () => number): string {
  const pick = r();
  if (pick < 0.3) return "";
  const length = pick < 0.6 ? Math.floor(r() * 20) : pick < 0.9 ? 100 + Math.floor(r() * 300) : 5000 + Math.floor(r() * 20000);
  const alphabet = ["a", "Z", "0", " ", "/", "\u00e9", "\u4e2d", "\u6587", "\ud83d\ude00", "\ud800", "\udc00", "\u0000", "\n"];
  let out = "";
  for (let i = 0; i < length; i++) out += alphabet[Math.floor(r() * (r() < 0.8 ? 5 : alphabet.length))];
  return out;
}

function number(r: () => number): number {
  const pick = r();
  if (pick < 0.3) return 0;
  if (pick < 0.35) return -0;
  if (pick < 0.5) return r() * 1e-3;
  if (pick < 0.6) return -r() * 1e300;
  return r() * 1000;
}

function statusBlock(r: () => number): StatusBlock {
  const callArgs: Record<string, string> = {};
  for (let i = Math.floor(r() * 4); i > 0; i--) callArgs[text(r) || String(i)] = text(r);
  const int32 = () => (r() < 0.3 ? 0 : r() < 0.5 ? -Math.floor(r() * 2 ** 31) : Math.floor(r() * 2 ** 31));
  const int64 = () => (r() < 0.3 ? 0n : r() < 0.5 ? -BigInt(Math.floor(r() * 2 ** 53)) * 1000n : BigInt(Math.floor(r() * 2 ** 53)) * 1000n);
  return create(StatusBlockSchema, {
    error: text(r),
    reason: text(r),
    errorCode: r() < 0.3 ? 0 : r() < 0.5 ? 4005 : int32(),
    ...(r() < 0.5 ? { success: r() < 0.3 ? 0 : int32() } : {}),
    cache: r() < 0.5,
    apiInfo: text(r),
    executionTime: number(r),
    serverTime: text(r),
    callArgs,
    apiType: text(r),
    requestId: text(r),
    translateLanguage: text(r),
    translateEngine: text(r),
    serverMemory: text(r),
    clientIp: text(r),
    ddf: text(r),
    lastId: text(r),
    secache: text(r),
    secacheTime: int64(),
    secacheDate: text(r),
    translateStatus: text(r),
    translateTime: number(r),
    ...(r() < 0.6 ? { language: create(LanguageInfoSchema, r() < 0.2 ? {} : { currentLang: text(r), sourceLang: text(r) }) } : {}),
  });
}

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
