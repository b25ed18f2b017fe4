// The JavaScript SHA-256 that checks every plain call's secret must give
// node:crypto's digest for every string: each length around the 64-byte
// block and its 56-byte padding edge, multi-byte and astral characters, lone
// surrogates (both encode them as U+FFFD), and random text.
import { hash } from "node:crypto";
import { describe, expect, it } from "vitest";
import { sha256 } from "../src/core/sha256.ts";

const seed = Number(process.env.FUZZ_SEED ?? Date.now() % 2_147_483_647);

function random(s: number): () => number {
  let state = s >>> 0;
  return () => {
    state = (Math.imul(state ^ (state >>> 15), 0x2c1b3c6d) + 0x9e3779b9) >>> 0;
    return state / 2 ** 32;
  };
}

const expected = (text: string) => hash("sha256", text, "buffer");

describe("sha256", () => {
  it("matches node:crypto at every length from 0 to 300 bytes, and for the known vectors", () => {
    for (let n = 0; n <= 300; n++) expect(sha256("a".repeat(n)).toString("hex"), `length ${n}`).toBe(expected("a".repeat(n)).toString("hex"));
    expect(sha256("").toString("hex")).toBe("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    expect(sha256("abc").toString("hex")).toBe("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  });

  it("matches node:crypto for multi-byte, astral and lone-surrogate text", () => {
    for (const text of ["\u4e2d\u6587", "\u00e9".repeat(28), "\u4e2d".repeat(19), "\ud83d\ude00".repeat(15), "\ud800", "a\udc00b", "\ud83d", "x\u0000y", "\uffff".repeat(22)]) {
      expect(sha256(text).equals(expected(text)), JSON.stringify(text)).toBe(true);
    }
  });

  it(`matches node:crypto for 3,000 random strings (seed ${seed}; rerun with FUZZ_SEED=${seed})`, () => {
    const r = random(seed);
    const alphabet = ["a", "Z", "0", "/", "\u00e9", "\u4e2d", "\ud83d\ude00", "\ud800", "\udc00", "\u0000"];
    for (let i = 0; i < 3000; i++) {
      let text = "";
      for (let n = Math.floor(r() * (r() < 0.9 ? 100 : 3000)); n > 0; n--) text += alphabet[Math.floor(r() * (r() < 0.7 ? 4 : alphabet.length))];
      expect(sha256(text).equals(expected(text)), JSON.stringify(text.slice(0, 80))).toBe(true);
    }
  });

  it("is the same function after a long input grew its buffer", () => {
    const long = "\u4e2d".repeat(100_000);
    expect(sha256(long).equals(expected(long))).toBe(true);
    expect(sha256("abc").toString("hex")).toBe("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  });
});
