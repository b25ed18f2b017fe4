import { execFileSync } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { delimiter, join, relative } from "node:path";
import { describe, expect, it } from "vitest";
import { errorCodes, fourDigits } from "../src/contract/error-codes.ts";
import { unspecifiedApiNames } from "../src/contract/operations.ts";
import { operations } from "../src/operations/index.ts";
import { ErrorCode } from "../src/gen/gateway/catalogue/v1/status_pb.js";

const root = join(import.meta.dirname, "..");
const bin = join(root, "node_modules", ".bin");

function files(dir: string): string[] {
  return readdirSync(dir, { recursive: true, withFileTypes: true })
    .filter((e) => e.isFile())
    .map((e) => relative(dir, join(e.parentPath, e.name)))
    .sort();
}

describe("the contract", () => {
  it("src/gen is exactly what buf generate writes (generated code is never edited)", () => {
    const out = mkdtempSync(join(tmpdir(), "gen-"));
    try {
      execFileSync(join(bin, "buf"), ["generate", "-o", out], { cwd: root, env: { ...process.env, PATH: `${bin}${delimiter}${process.env.PATH}` } });
      const fresh = join(out, "src", "gen");
      const committed = join(root, "src", "gen");
      expect(files(committed)).toEqual(files(fresh));
      for (const f of files(fresh)) expect(readFileSync(join(committed, f), "utf8"), f).toBe(readFileSync(join(fresh, f), "utf8"));
    } finally {
      rmSync(out, { recursive: true, force: true });
    }
  });

  it("takes the legacy paths from the google.api.http annotations", () => {
    expect(operations.map((op) => [op.id, op.path, op.method.name])).toEqual([
      ["retail/item_get", "/retail/item_get/", "ItemGet"],
      ["wholesale/item_search_peerbuy", "/wholesale/item_search_peerbuy/", "ItemSearchPeerbuy"],
      ["wholesale/item_get", "/wholesale/item_get/", "ItemGet"],
    ]);
    expect(unspecifiedApiNames).toEqual(["item_search", "item_search_shop"]);
  });

  it("marks both RPCs free of side effects, so Connect GET works", () => {
    for (const op of operations) expect(op.method.idempotency).toBe(1 /* NO_SIDE_EFFECTS */);
  });

  it("has one table row per code, and each enum number is its four-digit code", () => {
    const codes = Object.values(ErrorCode).filter((v): v is number => typeof v === "number");
    expect([...errorCodes.keys()].sort((a, b) => a - b)).toEqual(codes.sort((a, b) => a - b));
    expect(codes.map(fourDigits)).toEqual([
      "0000", "2000", "4000", "4001", "4002", "4003", "4004", "4005", "4006", "4007", "4008", "4009", "4010", "4012",
      "4013", "4014", "4015", "4016", "4017", "5000",
    ]);
    const charged = [...errorCodes].filter(([, i]) => i.charge === "charged").map(([c]) => fourDigits(c));
    expect(charged).toEqual(["0000", "2000"]);
    const ignored = [...errorCodes].filter(([, i]) => i.charge === "ignored").map(([c]) => Number(fourDigits(c)));
    expect(ignored.every((c) => c >= 4003 && c <= 4016)).toBe(true);
  });
});
