import { create, toBinary } from "@bufbuild/protobuf";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { DatabaseSync } from "node:sqlite";
import { afterAll, describe, expect, it } from "vitest";
import { readLegacyMessage } from "../src/catalogue/legacy-message.ts";
import { defaultConfig } from "../src/config.ts";
import { ItemDetailSchema } from "../src/gen/gateway/catalogue/v1/retail_pb.js";
import { ItemSearchPeerbuyResponseSchema, PeerViewedItemSchema } from "../src/gen/gateway/catalogue/v1/wholesale_pb.js";
import { databasePath, openRuntime } from "../src/runtime.ts";
import { migrations } from "../src/stores/embedded/sqlite-database.ts";
import { retailItemGet } from "../src/operations/retail-item-get.ts";
import { wholesaleItemSearchPeerbuy } from "../src/operations/wholesale-item-search-peerbuy.ts";
import { demoRecords } from "../src/catalogue/demo-dataset.ts";

const dir = mkdtempSync(join(tmpdir(), "gateway-migration-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe("a data directory of schema 4 (before the descriptor table and the balances table)", () => {
  it("moves its retail items and peer-viewed lists into the one catalogue table, and serves them as before", async () => {
    const lines = demoRecords();
    const detail = lines.find((l) => l.kind === "item_detail")!;
    const peers = lines.find((l) => l.kind === "peer_viewed" && (l.item as unknown[]).length > 0)!;
    const item = readLegacyMessage(ItemDetailSchema, detail.item, "item");
    const list = (peers.item as unknown[]).map((e, i) => readLegacyMessage(PeerViewedItemSchema, e, `item[${i}]`));

    // The store as a gateway of schema 4 left it.
    const config = { ...defaultConfig, dataDir: dir };
    const old = new DatabaseSync(databasePath(config));
    for (const step of migrations.slice(0, 4)) old.exec(step);
    old.exec("PRAGMA user_version = 4");
    old.prepare("INSERT INTO retail_items (num_iid, detail, obtainable, stored_at) VALUES (?, ?, 1, 1700000000)").run(item.numIid, toBinary(ItemDetailSchema, item));
    old.prepare("INSERT INTO retail_items (num_iid, detail, obtainable, stored_at) VALUES ('42', x'', 0, 1700000000)").run();
    old
      .prepare("INSERT INTO wholesale_peers (num_iid, sid, items, stored_at) VALUES (?, ?, ?, 1700000001)")
      .run(String(peers.num_iid), String(peers.sid), toBinary(ItemSearchPeerbuyResponseSchema, create(ItemSearchPeerbuyResponseSchema, { item: list })));
    // Schema 4 kept the balance on the account row; 6 gives it to the meter's own table.
    const account = (key: string, balance: bigint | null) =>
      old
        .prepare("INSERT INTO accounts (key, name, secret_hash, secret_salt, status, operations, daily_max, expires, zone, created_at, balance) VALUES (?, 'old', 'h', 's', 'active', '{}', 10, '2099-01-01', 'Asia/Shanghai', 1, ?)")
        .run(key, balance);
    account("prepaid0000000001", 1_234_567n);
    account("unbilled000000001", null);
    old.close();

    const runtime = await openRuntime(config);
    try {
      expect((await runtime.accounts.find("prepaid0000000001"))!.balance).toBe(1_234_567n);
      expect((await runtime.accounts.find("unbilled000000001"))!.balance).toBeUndefined();
      await runtime.meter.adjustBalance("prepaid0000000001", { kind: "top-up", amount: 1n, at: Date.now() });
      expect((await runtime.accounts.find("prepaid0000000001"))!.balance).toBe(1_234_568n);
      // The balance held before changes were recorded is carried over as the first, then each change with the balance it left.
      const changes = (await runtime.meter.balanceRecord("prepaid0000000001")).changes;
      expect(changes.map(({ kind, amount, balance }) => ({ kind, amount, balance }))).toEqual([
        { kind: "carried", amount: 1_234_567n, balance: 1_234_567n },
        { kind: "top-up", amount: 1n, balance: 1_234_568n },
      ]);
      expect(Math.abs(changes[0]!.at - Date.now())).toBeLessThan(60_000);
      expect((await runtime.meter.balanceRecord("unbilled000000001")).changes).toEqual([]);
      const found = await runtime.catalogue.fetch(retailItemGet, { num_iid: item.numIid, is_promotion: "1" });
      expect(found.found && found.storedAt).toBe(1700000000);
      expect(found.found && found.value).toEqual(item);
      expect(await runtime.catalogue.fetch(retailItemGet, { num_iid: "42", is_promotion: "" })).toEqual({ found: false, reason: "item 42 cannot be obtained" });
      const viewed = await runtime.catalogue.fetch(wholesaleItemSearchPeerbuy, { num_iid: String(peers.num_iid), sid: String(peers.sid) });
      expect(viewed.found && viewed.value).toEqual(list);
      expect([...(await runtime.catalogue.size())]).toEqual([
        ["retail/item_detail", 2],
        ["wholesale/peer_viewed", 1],
      ]);
    } finally {
      await runtime.close();
    }
  });
});
