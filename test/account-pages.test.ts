// ListAccounts' pages (src/core/account-pages.ts) over each store's own listing (AccountStore.listing): the same
// accounts, in the same order, filtered the same way, on the embedded store and on PostgreSQL.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { AccountListingTooLarge, accountPage, maxAccountPageSize } from "../src/core/account-pages.ts";
import type { AccountStore } from "../src/core/account-store.ts";
import type { Account } from "../src/core/accounts.ts";
import { PostgresAccountStore } from "../src/stores/postgres/account-store.ts";
import { migrateSchema, openPostgres } from "../src/stores/postgres/postgres-database.ts";
import { startGateway, type GatewayFixture } from "./support/gateway-fixture.ts";
import { freshDatabase } from "./support/postgres.ts";
import type pg from "pg";

let gw: GatewayFixture;
let db: Awaited<ReturnType<typeof freshDatabase>>;
let pool: pg.Pool;
let template: Account;
beforeAll(async () => {
  gw = await startGateway();
  db = await freshDatabase("pages");
  pool = openPostgres(db.url, { max: 2 });
  await migrateSchema(pool);
  template = (await gw.runtime.admin.create({ name: "template" })).account;
});
afterAll(async () => {
  await pool?.end();
  await db?.drop();
  await gw?.close();
});

const at = Date.UTC(2030, 0, 1);
/** Accounts made at two moments: keys that differ in case, and names in other scripts (Cyrillic folds case, Chinese has none). */
const accounts = (): Account[] =>
  [
    ["b", "Команда b", 0, "active"],
    ["B", "команда B", 0, "stopped"],
    ["a", "Team A", 0, "active"],
    ["c", "团队 c", 0, "active"],
    ["0", "TEAM zero", 1, "stopped"],
  ].map(([key, name, later, status]) => ({ ...template, key: `pg-${key}`, name: name as string, createdAt: at + (later as number), status: status as Account["status"], balance: undefined }));

describe.each([
  ["the embedded store", () => gw.runtime.accounts],
  ["PostgreSQL", () => new PostgresAccountStore(pool)],
] as const)("%s", (_name, store: () => AccountStore) => {
  let s: AccountStore;
  beforeAll(async () => {
    s = store();
    for (const a of accounts()) await s.insert(a, { at: a.createdAt, kind: "created", by: "test", changes: [] });
  });
  const pages = async (request: { query?: string; status?: Account["status"]; pageSize: number }) => {
    const out: string[][] = [];
    let pageToken = "";
    do {
      const page = await accountPage((ask) => s.listing(ask), { ...request, pageToken });
      out.push(page.accounts.map((a) => a.key));
      pageToken = page.nextPageToken;
    } while (pageToken !== "" && out.length < 10);
    return out;
  };

  it("pages in the order the accounts were made, then by key by code unit, whatever the database's collation", async () => {
    expect(await pages({ query: "pg-", pageSize: 2 })).toEqual([["pg-B", "pg-a"], ["pg-b", "pg-c"], ["pg-0"]]);
    expect((await s.list()).map((a) => a.key).filter((k) => k.startsWith("pg-"))).toEqual(["pg-B", "pg-a", "pg-b", "pg-c", "pg-0"]);
  });

  it("finds a part of a key or a name in any case, in any script, and filters by status", async () => {
    expect(await pages({ query: "КОМАНДА", pageSize: 10 })).toEqual([["pg-B", "pg-b"]]);
    expect(await pages({ query: "团队", pageSize: 10 })).toEqual([["pg-c"]]);
    expect(await pages({ query: "team", status: "stopped", pageSize: 1 })).toEqual([["pg-0"]]);
    expect(await pages({ query: "PG-", status: "active", pageSize: 2 })).toEqual([["pg-a", "pg-b"], ["pg-c"]]);
    const all = await accountPage((ask) => s.listing(ask), { query: "pg-", pageSize: 0 });
    expect([all.accounts.length, all.totalSize, all.nextPageToken]).toEqual([5, 5, ""]);
    // Asked whole, a listing holds at most so many, and is refused past it, with how many match.
    expect((await accountPage((ask) => s.listing(ask), { query: "pg-", pageSize: 0, maxWhole: 5 })).accounts).toHaveLength(5);
    await expect(accountPage((ask) => s.listing(ask), { query: "pg-", pageSize: 0, maxWhole: 4 })).rejects.toThrow(
      new AccountListingTooLarge("5 accounts match, more than one answer may hold (4): ask for them a page at a time (page_size, at most 1000), or narrow the query"),
    );
    const none = await accountPage((ask) => s.listing(ask), { query: "no such account", pageSize: 5 });
    expect([none.accounts.length, none.totalSize, none.nextPageToken]).toEqual([0, 0, ""]);
  });
});

it("holds at most the most a page may, however many are asked for", async () => {
  const many = Array.from({ length: maxAccountPageSize + 500 }, (_, i) => ({ ...template, key: `k${String(i).padStart(5, "0")}`, createdAt: i }));
  let asked = -1;
  const listing = async (ask: { limit: number; after?: { key: string } | undefined }) => {
    asked = ask.limit;
    const from = ask.after === undefined ? 0 : many.findIndex((a) => a.key === ask.after!.key) + 1;
    return { accounts: many.slice(from, ask.limit === 0 ? undefined : from + ask.limit), total: many.length };
  };
  const page = await accountPage(listing, { pageSize: 5000 });
  expect([page.accounts.length, page.totalSize, asked]).toEqual([1000, 1500, 1001]);
  // Asked whole: one more than the most it may hold is read, not all of them; the CLI, in its own process, reads all.
  await expect(accountPage(listing, { pageSize: 0, maxWhole: 1200 })).rejects.toThrow(AccountListingTooLarge);
  expect(asked).toBe(1201);
  expect((await accountPage(listing, { pageSize: 0, maxWhole: Infinity })).accounts).toHaveLength(1500);
  expect(asked).toBe(0);
  expect((await accountPage(listing, { pageSize: 5000, pageToken: page.nextPageToken })).accounts.length).toBe(500);
});
