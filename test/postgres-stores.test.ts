// Issue 13: the shared store's other ports, each seen from two replicas (two pools) on one PostgreSQL.
import { secretMatches } from "../src/core/accounts.ts";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { importRecords } from "../src/catalogue/catalogue-import.ts";
import { demoRecords } from "../src/catalogue/demo-dataset.ts";
import { AccountAdmin } from "../src/core/account-admin.ts";
import { systemClock } from "../src/core/clock.ts";
import { operations } from "../src/operations/index.ts";
import { EmbeddedCatalogue } from "../src/stores/embedded/catalogue-store.ts";
import { openDatabase } from "../src/stores/embedded/sqlite-database.ts";
import { PostgresAccountStore } from "../src/stores/postgres/account-store.ts";
import { PostgresAdminTokens } from "../src/stores/postgres/admin-tokens.ts";
import { AdminTokens } from "../src/core/admin-tokens.ts";
import { PostgresCatalogue } from "../src/stores/postgres/catalogue-store.ts";
import { PostgresMeter } from "../src/stores/postgres/meter.ts";
import { PostgresOperatorSwitches } from "../src/stores/postgres/operator-switches.ts";
import { migrateSchema, openPostgres } from "../src/stores/postgres/postgres-database.ts";
import { PostgresReplayGuard } from "../src/stores/postgres/replay-guard.ts";
import { freshDatabase, watchQueries, type Hold } from "./support/postgres.ts";
import type pg from "pg";

let db: Awaited<ReturnType<typeof freshDatabase>>;
let a: pg.Pool;
let b: pg.Pool;
const meters: PostgresMeter[] = [];
const extraPools: pg.Pool[] = [];

beforeAll(async () => {
  db = await freshDatabase("stores");
  a = openPostgres(db.url, { max: 4 });
  b = openPostgres(db.url, { max: 4 });
  await migrateSchema(a);
});
afterAll(async () => {
  for (const m of meters) m.close();
  await Promise.all(extraPools.map((p) => p.end()));
  await a?.end();
  await b?.end();
  await db?.drop();
});

function admin(pool: pg.Pool): { admin: AccountAdmin; accounts: PostgresAccountStore } {
  const accounts = new PostgresAccountStore(pool);
  const meter = new PostgresMeter(pool);
  meters.push(meter);
  return { admin: new AccountAdmin(accounts, meter, systemClock, operations), accounts };
}

const waitFor = async <T>(read: () => T | Promise<T>, want: T, ms = 1500): Promise<number> => {
  const started = Date.now();
  while ((await read()) !== want) {
    if (Date.now() - started > ms) throw new Error(`still not ${String(want)} after ${ms} ms`);
    await new Promise((r) => setTimeout(r, 20));
  }
  return Date.now() - started;
};

describe("accounts", () => {
  it("one replica creates and changes an account; the other sees each change within a second", async () => {
    const one = admin(a);
    const two = admin(b);
    const { account, secret } = await one.admin.create({ name: "shared", balance: 2_000_000n, prices: new Map([["retail/item_get", 10n]]) });
    expect(secret).toHaveLength(40);
    const seen = (await two.accounts.find(account.key))!;
    expect(seen).toMatchObject({ name: "shared", status: "active", balance: 2_000_000n, dailyMax: account.dailyMax, expires: account.expires });
    expect(seen.prices.get("retail/item_get")).toBe(10n);
    expect([...seen.operations.keys()].sort()).toEqual(operations.map((op) => op.id).sort());
    expect(seen.secretHash).toBe(account.secretHash);

    await one.admin.setStatus(account.key, "stopped");
    expect(await waitFor(async () => (await two.accounts.find(account.key))!.status, "stopped")).toBeLessThan(1200);
    await one.admin.topUp(account.key, 500_000n);
    await waitFor(async () => (await two.accounts.find(account.key))!.balance, 2_500_000n);
    expect((await two.admin.list()).map((x) => x.key)).toContain(account.key);
    expect(await two.accounts.find("no-such-key")).toBeUndefined();

    // A rotation that keeps the old secret: the other replica accepts both within a second, then only the new one.
    const rotated = await one.admin.rotateSecret(account.key, 60_000);
    await waitFor(async () => secretMatches((await two.accounts.find(account.key))!, rotated, Date.now()), true);
    const seenAfter = (await two.accounts.find(account.key))!;
    expect(secretMatches(seenAfter, secret, Date.now())).toBe(true);
    expect(secretMatches(seenAfter, secret, seenAfter.previousSecrets![0]!.until)).toBe(false);
    expect(seenAfter.previousSecrets).toMatchObject([{ secretHash: account.secretHash, legacySigningKey: account.legacySigningKey, hmacKey: account.hmacKey }]);
    await one.admin.rotateSecret(account.key);
    await waitFor(async () => (await two.accounts.find(account.key))!.previousSecrets, undefined);

    // The addresses the key works from, set on one replica, are the other's within a second; and removed.
    await one.admin.setPlan(account.key, { allowedFrom: ["10.0.0.0/8", "2001:db8::/32"] });
    await waitFor(async () => (await two.accounts.find(account.key))!.allowedFrom?.join(" "), "10.0.0.0/8 2001:db8::/32");
    await one.admin.setPlan(account.key, { allowedFrom: null });
    await waitFor(async () => (await two.accounts.find(account.key))!.allowedFrom, undefined);
  });
});

/** A pool of its own whose account reads are watched (see watchQueries). */
function watchedPool(): { pool: pg.Pool; reads: () => number; hold: (hold?: Hold) => void } {
  const pool = openPostgres(db.url, { max: 4 });
  extraPools.push(pool);
  const { count, hold } = watchQueries(pool, "FROM accounts a");
  return { pool, reads: count, hold };
}

describe("accounts, changed at once on two replicas", () => {
  it("keep every change, undo no rotation, and record each with who made it", async () => {
    const one = { ...admin(a), by: "admin-api 10.0.0.1" };
    const two = { ...admin(b), by: "admin-api 10.0.0.2" };
    const first = one.admin.as(one.by);
    const second = two.admin.as(two.by);
    const { account } = await first.create({ name: "raced" });
    const ops = operations.map((op) => op.id);
    // Each replica's changes race the other's: prices on one, operation switches and the rotation on the
    // other, a plan change on each. Before, each wrote every column from what it had read, so most were lost,
    // and the rotation could be undone by a plan change that had read the old secret.
    let rotated = "";
    await Promise.all([
      ...ops.map((op, i) => first.setPrice(account.key, op, BigInt(i + 1))),
      ...ops.map((op) => second.setOperation(account.key, op, "stopped")),
      first.setPlan(account.key, { dailyMax: 5 }),
      second.setPlan(account.key, { concurrency: 3 }),
      second.rotateSecret(account.key).then((s) => (rotated = s)),
    ]);
    const after = await admin(a).admin.get(account.key);
    expect(Object.fromEntries(after.prices)).toEqual(Object.fromEntries(ops.map((op, i) => [op, BigInt(i + 1)])));
    expect(Object.fromEntries(after.operations)).toEqual(Object.fromEntries(ops.map((op) => [op, "stopped"])));
    expect([after.dailyMax, after.concurrency]).toEqual([5, 3]);
    expect(secretMatches(after, rotated, Date.now())).toBe(true);
    // One record per change, each with its maker and only what it moved.
    const history = await first.history(account.key);
    expect(history).toHaveLength(1 + 2 * ops.length + 3);
    expect(history.filter((e) => e.kind === "price").every((e) => e.by === one.by && e.changes.length === 1 && e.changes[0]!.field.startsWith("prices["))).toBe(true);
    expect(history.filter((e) => e.kind === "operation").every((e) => e.by === two.by && e.changes.length === 1)).toBe(true);
    expect(history.find((e) => e.kind === "secret")!.changes).toEqual([{ field: "secret", before: "", after: "rotated" }]);
    expect(history.filter((e) => e.kind === "plan").map((e) => e.changes)).toEqual(
      expect.arrayContaining([[{ field: "dailyMax", before: "10000", after: "5" }], [{ field: "concurrency", before: "20", after: "3" }]]),
    );
    // A top-up is in the history too, with who made it and the balance it left.
    await second.topUp(account.key, 1_500_000n);
    expect((await first.history(account.key)).at(-1)).toMatchObject({ kind: "top-up", by: two.by, changes: [{ field: "balance", before: "", after: "1.5" }] });
  });
});

describe("a balance statement", () => {
  it("read on one replica just after a top-up on the other shows the top-up, not calls taking it", async () => {
    const one = admin(a).admin;
    const two = admin(b).admin;
    const { account } = await one.create({ name: "stated", balance: 5_000_000n });
    expect((await two.balanceStatement(account.key)).takenSinceLast).toBe(0n); // the other replica now remembers a balance of 5
    await one.topUp(account.key, 10_000_000n);
    // Before: balance 5 from the replica's memory (trusted for a second), changes from the database (a top-up
    // leaving 15), so the statement said calls took 10 since the top-up.
    const statement = await two.balanceStatement(account.key);
    expect([statement.account.balance, statement.takenSinceLast]).toEqual([15_000_000n, 0n]);
  });
});

describe("accounts, read together", () => {
  it("reread a stale account once however many calls find it stale at once", async () => {
    const { account } = await admin(a).admin.create({ name: "stampede" });
    let now = 1_000_000;
    const { pool, reads } = watchedPool();
    const store = new PostgresAccountStore(pool, () => now);
    const first = await Promise.all(Array.from({ length: 50 }, () => store.find(account.key)));
    expect(first.every((x) => x?.name === "stampede")).toBe(true);
    expect(reads()).toBe(1);
    now += 1001; // stale for every caller at once
    const again = await Promise.all(Array.from({ length: 50 }, () => store.find(account.key)));
    expect(again.every((x) => x?.name === "stampede")).toBe(true);
    expect(reads()).toBe(2);
    // Unknown keys are shared too: a flood of one wrong key costs one query.
    await Promise.all(Array.from({ length: 20 }, () => store.find("no-such-key-at-all")));
    expect(reads()).toBe(3);
  });

  it("do not keep a read that a change on this replica overtook", async () => {
    const other = admin(a);
    const { account } = await other.admin.create({ name: "before" });
    const { pool, hold } = watchedPool();
    const store = new PostgresAccountStore(pool);
    let release!: () => void;
    let answered!: () => void;
    const read = new Promise<void>((r) => (answered = r));
    hold({ until: new Promise<void>((r) => (release = r)), answered });
    const overtaken = store.find(account.key);
    hold(undefined);
    await read; // it has read "before"; its answer is held
    await other.accounts.change(account.key, () => ({ fields: { name: "after" }, change: { at: Date.now(), kind: "plan", by: "test", changes: [{ field: "name", before: "before", after: "after" }] } }));
    store.forget(account.key); // as the meter does once this replica changed the account
    release();
    expect((await overtaken)?.name).toBe("before");
    expect((await store.find(account.key))?.name).toBe("after");
  });
});

describe("named admins", () => {
  it("added on one replica are taken on the other within a second, and refused there within a second of their revocation", async () => {
    const one = new AdminTokens(new PostgresAdminTokens(a), systemClock, "cli ops@host");
    const two = new AdminTokens(new PostgresAdminTokens(b), systemClock);
    const { token } = await one.add("dana");
    expect(await waitFor(async () => (await two.identify(token))?.name, "dana")).toBeLessThan(1200);
    await expect(two.add("dana")).rejects.toThrow("there is already an admin named dana");
    await one.revoke("dana");
    expect(await waitFor(async () => (await two.identify(token))?.revokedBy, "cli ops@host")).toBeLessThan(1200);
    expect(await two.identify(`gwa_${"y".repeat(40)}`)).toBeUndefined();
    const rows = JSON.stringify((await a.query("SELECT * FROM admin_tokens")).rows);
    expect(rows).not.toContain(token);
  });

  it("are listed in the order they were added, by time as a number (read back as text, 12 digits before 13)", async () => {
    const store = new PostgresAdminTokens(a);
    // 2001-09-09, a millisecond apart: the last time with 12 digits, the first with 13.
    expect(await store.add({ name: "twelve-digits", createdAt: 999_999_999_999, createdBy: "test" }, "a".repeat(64))).toBe(true);
    expect(await store.add({ name: "thirteen-digits", createdAt: 1_000_000_000_000, createdBy: "test" }, "b".repeat(64))).toBe(true);
    const listed = (await store.list()).filter((x) => x.name.endsWith("-digits"));
    expect(listed.map((x) => [x.name, x.createdAt])).toEqual([
      ["twelve-digits", 999_999_999_999],
      ["thirteen-digits", 1_000_000_000_000],
    ]);
  });
});

describe("maintenance switches", () => {
  it("switched on one replica, in force on the other within a second, each switch recorded once with who made it", async () => {
    const one = new PostgresOperatorSwitches(a);
    const two = new PostgresOperatorSwitches(b);
    expect(await two.inMaintenance("wholesale/item_get")).toBe(false);
    await one.setMaintenance("wholesale/item_get", true, { at: 1000, by: "admin-api alice@10.0.0.1" });
    expect(await waitFor(() => two.inMaintenance("wholesale/item_get"), true)).toBeLessThan(1200);
    expect(await two.maintenance()).toEqual(["wholesale/item_get"]);
    // Switched on again at once on both (changing nothing): not recorded.
    await Promise.all([one.setMaintenance("wholesale/item_get", true, { at: 1500, by: "x" }), two.setMaintenance("wholesale/item_get", true, { at: 1500, by: "y" })]);
    await two.setMaintenance("wholesale/item_get", false, { at: 2000, by: "cli ops@host" });
    await waitFor(() => one.inMaintenance("wholesale/item_get"), false);
    expect(await one.maintenanceChanges()).toEqual([
      { at: 1000, operation: "wholesale/item_get", on: true, by: "admin-api alice@10.0.0.1" },
      { at: 2000, operation: "wholesale/item_get", on: false, by: "cli ops@host" },
    ]);
  });
});

describe("what a replica remembers, after its clock steps back an hour", () => {
  it("is read again within a second, not kept for the hour: an account stopped, an admin revoked, a switch made on another replica", async () => {
    let now = Date.now();
    const clock = { now: () => now };
    const other = admin(b);
    const { account } = await other.admin.create({ name: "stepped" });
    const accounts = new PostgresAccountStore(a, () => now);
    const switches = new PostgresOperatorSwitches(a, () => now);
    const admins = new AdminTokens(new PostgresAdminTokens(a, () => now), clock);
    const elsewhere = new AdminTokens(new PostgresAdminTokens(b), systemClock, "cli ops@host");
    const { token } = await elsewhere.add("erin");
    // Read (and remembered) at now; then the clock steps back an hour, and another replica changes each.
    expect((await accounts.find(account.key))?.status).toBe("active");
    expect(await switches.inMaintenance("retail/item_get")).toBe(false);
    expect((await admins.identify(token))?.revokedAt).toBeUndefined();
    now -= 3_600_000;
    await other.admin.setStatus(account.key, "stopped");
    await new PostgresOperatorSwitches(b).setMaintenance("retail/item_get", true, { at: Date.now(), by: "cli ops@host" });
    await elsewhere.revoke("erin");
    // Within a second of this clock, each is read again and the change is seen.
    now += 1000;
    expect((await accounts.find(account.key))?.status).toBe("stopped");
    expect(await switches.inMaintenance("retail/item_get")).toBe(true);
    expect((await admins.identify(token))?.revokedBy).toBe("cli ops@host");
    await new PostgresOperatorSwitches(b).setMaintenance("retail/item_get", false, { at: Date.now(), by: "cli ops@host" });
  });
});

describe("used signatures", () => {
  it("a sign used on one replica is refused on the other for its window, and free after it", async () => {
    const one = new PostgresReplayGuard(a);
    const two = new PostgresReplayGuard(b);
    const now = Date.now();
    expect(await one.seen("legacy\u0000k\u0000abc", now, 600_000)).toBe(false);
    expect(await two.seen("legacy\u0000k\u0000abc", now + 1, 600_000)).toBe(true);
    // A restarted replica (a new guard) still refuses it.
    expect(await new PostgresReplayGuard(b).seen("legacy\u0000k\u0000abc", now + 2, 600_000)).toBe(true);
    expect(await two.seen("legacy\u0000k\u0000abc", now + 600_001, 600_000)).toBe(false);
  });
});

describe("the catalogue", () => {
  it("holds the records the import writes and answers every operation as the embedded store does, token included", async () => {
    const lines = demoRecords();
    const shared = new PostgresCatalogue(a);
    expect(await shared.empty()).toBe(true);
    const report = await importRecords(shared, lines, { storedAt: 1_700_000_000, batchSize: 100 });
    expect(report).toEqual({ imported: lines.length, skipped: [] });
    const embedded = new EmbeddedCatalogue(openDatabase(":memory:"));
    await importRecords(embedded, lines, { storedAt: 1_700_000_000 });
    expect(await new PostgresCatalogue(b).size()).toEqual(await embedded.size());
    for (const op of operations) {
      const args = { ...op.example(lines)! };
      for (const a of op.args) args[a.name] ??= "";
      expect(await new PostgresCatalogue(b).fetch(op, args)).toEqual(await embedded.fetch(op, args));
      const missing = { ...args, num_iid: "1" };
      expect(await shared.fetch(op, missing)).toEqual(await embedded.fetch(op, missing));
    }
  });
});
