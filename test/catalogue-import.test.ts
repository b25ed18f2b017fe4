import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { importFile } from "../src/catalogue/file-import.ts";
import { demoRecords } from "../src/catalogue/demo-dataset.ts";
import { defaultConfig } from "../src/config.ts";
import { openRuntime, type Runtime } from "../src/runtime.ts";
import type { ItemDetail } from "../src/gen/gateway/catalogue/v1/retail_pb.js";
import { retailItemGet } from "../src/operations/retail-item-get.ts";
import { wholesaleItemSearchPeerbuy } from "../src/operations/wholesale-item-search-peerbuy.ts";
import { runCli } from "./support/cli.ts";

const [retail] = demoRecords();
const item = (numIid: string, extra: Record<string, unknown> = {}) =>
  JSON.stringify({ kind: "item_detail", item: { ...(retail!.item as object), num_iid: numIid, ...extra } });

const lines = [
  item("700000000001"),
  "{not json",
  item("700000000002", { price: "cheap" }),
  "",
  JSON.stringify({ kind: "peer_viewed", num_iid: "710000000001", sid: "b2b-1", item: [{ num_iid: "1", price: "1.00", pic_url: "https://img.example.com/1.jpg", title: "袜子", sales: "3", seller_id: "9", detail_url: "https://detail.example.com/1" }] }),
  JSON.stringify({ kind: "peer_viewed", num_iid: "abc", sid: "b2b-1", item: [] }),
  JSON.stringify({ kind: "shop" }),
  item("700000000003", { props_list: [], seller_info: [], promo_type: null }),
  JSON.stringify({ kind: "item_detail", item: { num_iid: "700000000004", no_such_field: 1 } }),
  JSON.stringify({ kind: "item_detail", item: { num_iid: "700000000005", title: "下架商品" }, obtainable: false }),
  "[1,2]",
];

let dir: string;
let runtime: Runtime;

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), "gateway-import-"));
  writeFileSync(join(dir, "items.ndjson"), `${lines.join("\n")}\n`);
  runtime = await openRuntime({ ...defaultConfig, dataDir: join(dir, "lib") });
});
afterAll(async () => {
  await runtime.close();
  rmSync(dir, { recursive: true, force: true });
});

const expectedSkips = [2, 3, 6, 7, 9, 11];

describe("import", () => {
  it("skips each bad line with its line number and imports every other line", async () => {
    const report = await importFile(runtime.catalogue, join(dir, "items.ndjson"), { storedAt: 1_700_000_000, workers: 0 });
    expect(report.skipped.map((s) => s.line)).toEqual(expectedSkips);
    expect(report.imported).toBe(4);
    expect(report.skipped.find((s) => s.line === 3)!.message).toMatch(/price/);
    expect(report.skipped.find((s) => s.line === 9)!.message).toMatch(/no_such_field/);

    const itemGet = (num_iid: string) => runtime.catalogue.fetch(retailItemGet, { num_iid, is_promotion: "1" });
    for (const id of ["700000000001", "700000000003"]) {
      const found = await itemGet(id);
      expect(found.found).toBe(true);
    }
    const stored = await itemGet("700000000003");
    expect(stored.found && (stored.value as ItemDetail).promoType).toBeUndefined();
    expect(stored.found && stored.storedAt).toBe(1_700_000_000);
    const unobtainable = await itemGet("700000000005");
    expect(unobtainable).toEqual({ found: false, reason: "item 700000000005 cannot be obtained" });
    expect((await runtime.catalogue.fetch(wholesaleItemSearchPeerbuy, { num_iid: "710000000001", sid: "b2b-1" })).found).toBe(true);
    expect((await itemGet("700000000002")).found).toBe(false);
  });

  it("reads a file of many parcels the same with worker threads as on one thread: line numbers, order, CRLF, BOM, a last line without newline", async () => {
    // About 3.5 MiB: several parcels, with bad lines and a repeated key (the later line wins) spread across them.
    const many: string[] = [];
    for (let i = 0; i < 700; i++) {
      if (i % 97 === 5) many.push("{broken");
      else if (i % 131 === 7) many.push("");
      else many.push(item(String(720000000000 + (i % 650)), { title: `line ${i + 1}` }));
    }
    const text = `\ufeff${many.join("\n").replace(/\n(?=.*"line 300")/, "\r\n")}`;
    writeFileSync(join(dir, "many.ndjson"), text); // no newline after the last line
    const reports = [];
    for (const workers of [0, 2]) {
      const r = await openRuntime({ ...defaultConfig, dataDir: join(dir, `many-${workers}`) });
      try {
        const progress: number[] = [];
        const report = await importFile(r.catalogue, join(dir, "many.ndjson"), { storedAt: 1_700_000_000, workers, onProgress: (d) => progress.push(d.lines) });
        expect(progress.at(-1)).toBe(700);
        reports.push(report);
        const repeated = await r.catalogue.fetch(retailItemGet, { num_iid: "720000000010", is_promotion: "1" });
        expect(repeated.found && (repeated.value as ItemDetail).title).toBe("line 661");
        expect((await r.catalogue.size()).get("retail/item_detail")).toBe(new Set(many.flatMap((l, i) => (l.startsWith("{\"") ? [i % 650] : []))).size);
      } finally {
        await r.close();
      }
    }
    expect(reports[0]!.skipped.map((s) => s.line)).toEqual(many.flatMap((l, i) => (l === "{broken" ? [i + 1] : [])));
    expect(reports[1]).toEqual(reports[0]);
    expect(reports[0]!.imported).toBe(many.filter((l) => l.startsWith("{\"")).length);
  });

  it("reads lines longer than a parcel, and skips a line past the limit unread, with its line number", async () => {
    const long = item("730000000002", { desc: "长".repeat(900_000) }); // about 2.6 MiB: runs across three 1 MiB chunks
    const junk = "x".repeat(5 << 20); // 5 MiB, past the 4 MiB limit set below
    const file = join(dir, "long.ndjson");
    writeFileSync(file, [item("730000000001"), long, junk, item("730000000003"), junk].join("\n")); // the last line has no newline
    for (const workers of [0, 2]) {
      const r = await openRuntime({ ...defaultConfig, dataDir: join(dir, `long-${workers}`) });
      try {
        const report = await importFile(r.catalogue, file, { storedAt: 1_700_000_000, workers, maxLineBytes: 4 << 20 });
        expect(report.imported).toBe(3);
        expect(report.skipped.map((s) => s.line)).toEqual([3, 5]);
        expect(report.skipped[0]!.message).toMatch(/the line is 5242881 bytes long, more than the 4194304 bytes a line may have/);
        expect(report.skipped[1]!.message).toMatch(/the line is 5242880 bytes long/);
        const found = await r.catalogue.fetch(retailItemGet, { num_iid: "730000000002", is_promotion: "1" });
        expect(found.found && (found.value as ItemDetail).desc.length).toBe(900_000);
        expect((await r.catalogue.fetch(retailItemGet, { num_iid: "730000000003", is_promotion: "1" })).found).toBe(true);
      } finally {
        await r.close();
      }
    }
  });

  it("works from the CLI, reporting skipped lines and exiting 1", async () => {
    const env = { GATEWAY_DATA_DIR: join(dir, "cli") };
    const text = await runCli(["import", join(dir, "items.ndjson")], env);
    expect(text.code).toBe(1);
    expect(text.stdout).toContain("imported 4 records, skipped 6");
    for (const line of expectedSkips) expect(text.stderr).toContain(`line ${line}:`);

    const bad = await runCli(["import", join(dir, "items.ndjson"), "--workers", "lots"], env);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toContain("--workers must be a whole number from 0 to 64");

    const json = await runCli(["import", join(dir, "items.ndjson"), "--json", "--workers", "1"], env);
    const report = JSON.parse(json.stdout) as { imported: number; skipped: { line: number }[] };
    expect(report.imported).toBe(4);
    expect(report.skipped.map((s) => s.line)).toEqual(expectedSkips);
  });
});
