// Random status blocks for tests that hold a fast writer to the generic one:
// every field, empty and set, long and short strings, lone surrogates,
// negative and huge numbers, -0.
import { create } from "@bufbuild/protobuf";
import { LanguageInfoSchema, StatusBlockSchema, type StatusBlock } from "../../src/gen/gateway/catalogue/v1/status_pb.js";

/** A deterministic generator, so a failure names its seed. */
export function random(seed: number): () => number {
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

export function statusBlock(r: () => number): StatusBlock {
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
