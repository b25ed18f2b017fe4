// Account changes in the embedded store: each made on the account as committed, so one made at the same
// time by another process (the CLI beside the server) is neither lost nor undone, and each recorded with who
// made it and what it moved.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { AccountAdmin, AccountAdminError } from "../src/core/account-admin.ts";
import { secretMatches } from "../src/core/accounts.ts";
import { operations } from "../src/operations/index.ts";
import { SqliteAccountStore } from "../src/stores/embedded/account-store.ts";
import { ChangeWatch } from "../src/stores/embedded/change-watch.ts";
import { SqliteMeter } from "../src/stores/embedded/meter.ts";
import { openDatabase } from "../src/stores/embedded/sqlite-database.ts";

const dir = mkdtempSync(join(tmpdir(), "gw-account-changes-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

let clockAt = Date.parse("2026-11-26T06:00:00Z");
const clock = { now: () => clockAt };

/** One process's view of a data directory: its own connection, account cache and change watch, as the server and the CLI each have. */
function processOn(path: string, by: string) {
  const db = openDatabase(path);
  const accounts = new SqliteAccountStore(db, new ChangeWatch(db));
  const meter = new SqliteMeter(db, { onBalancesChanged: (keys) => keys.forEach((k) => accounts.forget(k)) });
  return { admin: new AccountAdmin(accounts, meter, clock, operations, by), accounts, db };
}

describe("a change made while another process's copy of the account is stale", () => {
  it("keeps a rotation the CLI made a moment before the server changed the plan", async () => {
    const path = join(dir, "rotation.db");
    const server = processOn(path, "admin-api 127.0.0.1");
    const cli = processOn(path, "cli ops@host");
    const { account, secret } = await server.admin.create({ name: "team" });
    await server.admin.get(account.key); // the server remembers the account, old secret and all
    const rotated = await cli.admin.rotateSecret(account.key);
    // Within the change watch's interval the server still holds the old secret in memory; before, the plan
    // change wrote every column from that copy, so the old secret came back and the new one was refused.
    await server.admin.setPlan(account.key, { dailyMax: 7 });
    const after = await cli.admin.get(account.key);
    expect(secretMatches(after, rotated, clockAt)).toBe(true);
    expect(secretMatches(after, secret, clockAt)).toBe(false);
    expect(after.dailyMax).toBe(7);
  });

  it("keeps both processes' operation and price changes", async () => {
    const path = join(dir, "both.db");
    const server = processOn(path, "admin-api 127.0.0.1");
    const cli = processOn(path, "cli ops@host");
    const { account } = await server.admin.create({ name: "team" });
    await server.admin.get(account.key);
    await cli.admin.setPrice(account.key, "retail/item_get", 50_000n);
    await cli.admin.setOperation(account.key, "wholesale/item_get", "stopped");
    await server.admin.setPrice(account.key, "wholesale/item_search_peerbuy", 20_000n);
    await server.admin.setOperation(account.key, "retail/item_get", "removed");
    const after = await cli.admin.get(account.key);
    expect(Object.fromEntries(after.prices)).toEqual({ "retail/item_get": 50_000n, "wholesale/item_search_peerbuy": 20_000n });
    expect(Object.fromEntries(after.operations)).toEqual({ "wholesale/item_get": "stopped", "wholesale/item_search_peerbuy": "enabled" });
    // A rotation keeping the old secret keeps the one committed, not one this process read earlier.
    const first = await cli.admin.rotateSecret(account.key);
    const second = await server.admin.rotateSecret(account.key, 60_000);
    const rotated = await cli.admin.get(account.key);
    expect(secretMatches(rotated, second, clockAt)).toBe(true);
    expect(secretMatches(rotated, first, clockAt)).toBe(true);
  });
});

describe("a balance statement", () => {
  it("read by the server just after the CLI's top-up shows the top-up, not calls taking it", async () => {
    const path = join(dir, "statement.db");
    const server = processOn(path, "admin-api 127.0.0.1");
    const cli = processOn(path, "cli ops@host");
    const { account } = await server.admin.create({ name: "team", balance: 5_000_000n });
    await server.admin.get(account.key); // the server remembers the balance of 5
    await cli.admin.topUp(account.key, 10_000_000n);
    // Before, the balance came from the server's memory (5, up to 100 ms old) and the changes from the file
    // (a top-up leaving 15): the statement said calls took 10 since the top-up, and none had run.
    const statement = await server.admin.balanceStatement(account.key);
    expect(statement.account.balance).toBe(15_000_000n);
    expect(statement.takenSinceLast).toBe(0n);
    expect(statement.entries.map((e) => [e.kind, e.takenBefore])).toEqual([["opening", 0n], ["top-up", 0n]]);
  });
});

describe("an account's history", () => {
  it("records its creation, every change with who made it and what it moved, and its balance's moves, oldest first", async () => {
    const path = join(dir, "history.db");
    const server = processOn(path, "admin-api 10.0.0.7");
    const cli = processOn(path, "cli ops@host");
    clockAt = Date.parse("2026-11-26T06:00:00Z");
    const { account, secret } = await server.admin.create({ name: "team-a", dailyMax: 5000, balance: 5_000_000n, prices: new Map([["retail/item_get", 50_000n]]), expires: "2027-06-30" });
    clockAt += 1000;
    await cli.admin.setPlan(account.key, { dailyMax: 20000, zone: "Europe/Berlin" });
    clockAt += 1000;
    await server.admin.setOperation(account.key, "wholesale/item_get", "stopped");
    clockAt += 1000;
    await cli.admin.setPrice(account.key, "retail/item_get", 100_000n);
    clockAt += 1000;
    await cli.admin.topUp(account.key, 2_500_000n);
    clockAt += 1000;
    const rotated = await server.admin.rotateSecret(account.key, 3_600_000);
    clockAt += 1000;
    await cli.admin.setStatus(account.key, "stopped");

    const history = await server.admin.history(account.key);
    const t0 = Date.parse("2026-11-26T06:00:00Z");
    expect(history.map((e) => [e.at - t0, e.kind, e.by])).toEqual([
      [0, "created", "admin-api 10.0.0.7"],
      [0, "opening", "admin-api 10.0.0.7"],
      [1000, "plan", "cli ops@host"],
      [2000, "operation", "admin-api 10.0.0.7"],
      [3000, "price", "cli ops@host"],
      [4000, "top-up", "cli ops@host"],
      [5000, "secret", "admin-api 10.0.0.7"],
      [6000, "status", "cli ops@host"],
    ]);
    expect(history[0]!.changes).toEqual([
      { field: "name", before: "", after: "team-a" },
      { field: "status", before: "", after: "active" },
      { field: "dailyMax", before: "", after: "5000" },
      { field: "concurrency", before: "", after: "20" },
      { field: "expires", before: "", after: "2027-06-30" },
      { field: "zone", before: "", after: "Asia/Shanghai" },
      { field: "operations[retail/item_get]", before: "", after: "enabled" },
      { field: "operations[wholesale/item_get]", before: "", after: "enabled" },
      { field: "operations[wholesale/item_search_peerbuy]", before: "", after: "enabled" },
      { field: "prices[retail/item_get]", before: "", after: "0.05" },
    ]);
    expect(history.slice(1).map((e) => e.changes)).toEqual([
      [{ field: "balance", before: "", after: "5" }],
      [
        { field: "dailyMax", before: "5000", after: "20000" },
        { field: "zone", before: "Asia/Shanghai", after: "Europe/Berlin" },
      ],
      [{ field: "operations[wholesale/item_get]", before: "enabled", after: "stopped" }],
      [{ field: "prices[retail/item_get]", before: "0.05", after: "0.1" }],
      [{ field: "balance", before: "5", after: "7.5" }],
      [
        { field: "oldSecretUntil", before: "", after: new Date(t0 + 5000 + 3_600_000).toISOString() },
        { field: "secret", before: "", after: "rotated" },
      ],
      [{ field: "status", before: "active", after: "stopped" }],
    ]);
    // Nothing of either secret, nor anything derived from them, is in the record.
    const stored = (await cli.admin.get(account.key)) as unknown as Record<string, unknown>;
    const text = JSON.stringify(history) + JSON.stringify(server.db.prepare("SELECT * FROM account_changes").all());
    for (const s of [secret, rotated, stored.secretHash, stored.secretSalt, stored.hmacKey, stored.legacySigningKey]) expect(text).not.toContain(String(s));
  });

  it("records neither a refused change nor one that moves nothing, and refuses an unknown key", async () => {
    const { admin } = processOn(join(dir, "refused.db"), "cli ops@host");
    const { account } = await admin.create({ name: "team-b" });
    await expect(admin.setPlan(account.key, { concurrency: 0 })).rejects.toThrow(AccountAdminError);
    await expect(admin.setPlan(account.key, { zone: "Mars/Olympus" })).rejects.toThrow("unknown time zone");
    await admin.setStatus(account.key, "active"); // already active
    await admin.setPlan(account.key, { dailyMax: account.dailyMax });
    expect((await admin.get(account.key)).concurrency).toBe(20);
    expect((await admin.history(account.key)).map((e) => e.kind)).toEqual(["created"]);
    await expect(admin.setStatus("no-such-key", "stopped")).rejects.toThrow("no account has the key no-such-key");
    await expect(admin.history("no-such-key")).rejects.toThrow("no account has the key no-such-key");
  });
});
