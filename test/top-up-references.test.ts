// A top-up names the payment it is for (its reference): a second top-up with the same reference adds nothing.
// Payment systems deliver their events at least once, so a billing integration that tops up on each one would
// otherwise credit a retried delivery twice. Both stores: the embedded one through the AdminService and the CLI,
// the shared one at the port, two replicas at once.
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import type pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { AdminService, BalanceChangeKind } from "../src/gen/gateway/admin/v1/admin_pb.js";
import { BalanceReferenceConflict } from "../src/core/meter.ts";
import { PostgresMeter } from "../src/stores/postgres/meter.ts";
import { migrateSchema, openPostgres } from "../src/stores/postgres/postgres-database.ts";
import { runCli } from "./support/cli.ts";
import { adminToken, startGateway, type GatewayFixture } from "./support/gateway-fixture.ts";
import { freshDatabase } from "./support/postgres.ts";

describe("a top-up with a reference, through the AdminService and the CLI", () => {
  let gw: GatewayFixture;
  beforeAll(async () => {
    gw = await startGateway();
  });
  afterAll(() => gw.close());
  const ok = { headers: { authorization: `Bearer ${adminToken}` } };
  const admin = () => createClient(AdminService, createConnectTransport({ baseUrl: gw.base, httpVersion: "1.1" }));

  it("adds once: the same reference again adds nothing and says so; with another amount it is refused", async () => {
    const { key } = await gw.newAccount({ balance: 1_000_000n });
    const c = admin();
    const first = await c.topUp({ key, amount: "5", reference: "pay_1" }, ok);
    expect([first.account!.balance, first.repeated]).toEqual(["6", false]);
    const again = await c.topUp({ key, amount: "5", reference: "pay_1" }, ok);
    expect([again.account!.balance, again.repeated]).toEqual(["6", true]);
    const other = await c.topUp({ key, amount: "7", reference: "pay_1" }, ok).then(() => undefined, ConnectError.from);
    expect(other?.code).toBe(Code.InvalidArgument);
    expect(other?.rawMessage).toMatch(/pay_1.*5/);
    // At once, twelve deliveries of one payment: one adds.
    const burst = await Promise.all(Array.from({ length: 12 }, () => c.topUp({ key, amount: "2", reference: "pay_2" }, ok)));
    expect(burst.filter((r) => !r.repeated)).toHaveLength(1);
    expect((await c.getAccount({ key }, ok)).account!.balance).toBe("8");
    // Without a reference, each top-up adds, as before.
    await c.topUp({ key, amount: "1" }, ok);
    await c.topUp({ key, amount: "1" }, ok);
    expect((await c.getAccount({ key }, ok)).account!.balance).toBe("10");
    // The statement names each top-up's reference.
    const statement = await c.getBalanceStatement({ key }, ok);
    expect(statement.changes.map(({ kind, amount, reference }) => [kind, amount, reference])).toEqual([
      [BalanceChangeKind.OPENING, "1", ""],
      [BalanceChangeKind.TOP_UP, "5", "pay_1"],
      [BalanceChangeKind.TOP_UP, "2", "pay_2"],
      [BalanceChangeKind.TOP_UP, "1", ""],
      [BalanceChangeKind.TOP_UP, "1", ""],
    ]);
    // A reference is the account's own: another account may use the same.
    const { key: other2 } = await gw.newAccount({ balance: 0n });
    expect((await c.topUp({ key: other2, amount: "3", reference: "pay_1" }, ok)).repeated).toBe(false);
  });

  it("takes --reference on the CLI, and prints the reference in the statement", async () => {
    const env = { GATEWAY_DATA_DIR: gw.config.dataDir };
    const { key } = await gw.newAccount({ balance: 0n });
    const first = await runCli(["accounts", "top-up", key, "1.5", "--reference", "inv-2026-11"], env);
    expect(first.code).toBe(0);
    expect(first.stdout).toContain('"balance":"1.5"');
    const again = await runCli(["accounts", "top-up", key, "1.5", "--reference", "inv-2026-11"], env);
    expect(again.code).toBe(0);
    expect(again.stdout).toContain('"balance":"1.5"');
    expect(again.stderr).toMatch(/already topped up by reference inv-2026-11; nothing added/);
    const text = await runCli(["accounts", "statement", key], env);
    expect(text.stdout).toMatch(/top-up +\+1\.5 +balance 1\.5 +ref inv-2026-11/);
  });
});

describe("the shared store's top-ups with a reference", () => {
  let db: Awaited<ReturnType<typeof freshDatabase>>;
  const pools: pg.Pool[] = [];
  beforeAll(async () => {
    db = await freshDatabase("topups");
    const admin = openPostgres(db.url, { max: 2 });
    pools.push(admin);
    await migrateSchema(admin);
  });
  afterAll(async () => {
    await Promise.all(pools.map((p) => p.end()));
    await db?.drop();
  });

  it("add once across replicas, however many deliveries of one payment arrive at once", async () => {
    const replicas = [0, 1].map((i) => {
      const pool = openPostgres(db.url, { max: 6 });
      pools.push(pool);
      return new PostgresMeter(pool, { holder: `r${i}` });
    });
    try {
      const at = Date.now();
      const outcomes = await Promise.all(Array.from({ length: 20 }, (_, i) => replicas[i % 2]!.adjustBalance("acct-shared", { kind: "top-up", amount: 2_000_000n, at, reference: "pay_9" })));
      expect(outcomes.filter((o) => o === "applied")).toHaveLength(1);
      expect(outcomes.filter((o) => o === "repeated")).toHaveLength(19);
      expect(await replicas[0]!.balance("acct-shared")).toBe(2_000_000n);
      await expect(replicas[1]!.adjustBalance("acct-shared", { kind: "top-up", amount: 3_000_000n, at, reference: "pay_9" })).rejects.toThrow(BalanceReferenceConflict);
      expect(await replicas[1]!.adjustBalance("acct-shared", { kind: "top-up", amount: 1_000_000n, at })).toBe("applied");
      const record = await replicas[1]!.balanceRecord("acct-shared");
      expect([record.balance, record.changes.map((c) => [c.amount, c.reference])]).toEqual([3_000_000n, [[2_000_000n, "pay_9"], [1_000_000n, ""]]]);
    } finally {
      for (const r of replicas) r.close();
    }
  });
});
