// Issue 13, "moving up": an embedded data directory copied into PostgreSQL, checked.
import { fromBinary } from "@bufbuild/protobuf";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ItemDetailSchema } from "../src/gen/gateway/catalogue/v1/retail_pb.js";
import { lockDataDirectory } from "../src/stores/embedded/data-directory-lock.ts";
import { migrateSchema, migrations, openPostgres } from "../src/stores/postgres/postgres-database.ts";
import { runCli } from "./support/cli.ts";
import { demo, legacyGet, startGateway } from "./support/gateway-fixture.ts";
import { freshDatabase } from "./support/postgres.ts";
import { AdminTokens } from "../src/core/admin-tokens.ts";
import { systemClock } from "../src/core/clock.ts";
import { PostgresAdminTokens } from "../src/stores/postgres/admin-tokens.ts";

const dataDir = mkdtempSync(join(tmpdir(), "gateway-migrate-"));
let target: Awaited<ReturnType<typeof freshDatabase>>;
let pool: pg.Pool;
const embedded: {
  paying?: { key: string; secret: string };
  balance?: bigint;
  charged?: number;
  adminToken?: string;
  alerted?: { key: string; alertSecret: string };
  firstAlertSecret?: string;
  late?: string;
} = {};
let keyedRequestId = "";

beforeAll(async () => {
  target = await freshDatabase("migrate");
  pool = openPostgres(target.url);
  // An embedded gateway with some history: a prepaid account that paid for calls, a refusal, a switch.
  const gw = await startGateway({ dataDir });
  try {
    const paying = await gw.newAccount({ name: "paying", externalId: "cus_paying", balance: 5_000_000n, prices: new Map([["retail/item_get", 250_000n]]), rate: { calls: 600, seconds: 60, burst: 50 }, allowedFrom: ["127.0.0.1", "2001:db8::/32"] });
    for (let i = 0; i < 3; i++) await legacyGet(gw.base, "/retail/item_get/", { key: paying.key, secret: paying.secret, num_iid: demo.retailNumIid });
    await legacyGet(gw.base, "/retail/item_get/", { key: paying.key, secret: "wrong", num_iid: demo.retailNumIid });
    // A fourth call, named by an Idempotency-Key: its key is kept with its charge.
    const keyed = await fetch(`${gw.base}/retail/item_get/?${new URLSearchParams({ key: paying.key, secret: paying.secret, num_iid: demo.retailNumIid })}`, { headers: { "idempotency-key": "migrated-1" } });
    keyedRequestId = ((await keyed.json()) as { request_id: string }).request_id;
    await legacyGet(gw.base, "/nowhere/at_all/", {});
    await gw.runtime.switches.setMaintenance("wholesale/item_get", true, { at: 1_800_000_000_000, by: "cli ops@host" });
    // A rotation still keeping the old secret: the grace moves with the account.
    await gw.runtime.admin.rotateSecret(paying.key, 3_600_000);
    embedded.adminToken = (await gw.runtime.admins.add("erin")).token;
    // Usage alerts: one recorded and not yet delivered (this gateway delivers none); and an account whose alerts were
    // set after its calls had crossed the line, which has none to tell, on either store.
    const alerted = await gw.newAccount({ name: "alerted", dailyMax: 4 });
    const { secret: firstAlertSecret } = await gw.runtime.admin.setAlerts(alerted.key, { url: "https://hooks.example.com/a", usagePercents: [50, 100] });
    // A new alert secret keeping the first signing for an hour: both move with the account.
    const { secret: alertSecret } = await gw.runtime.admin.setAlerts(alerted.key, { url: "https://hooks.example.com/a", usagePercents: [50, 100] }, { newSecret: true, keepOldMs: 3_600_000 });
    embedded.firstAlertSecret = firstAlertSecret!;
    const late = await gw.newAccount({ name: "late", dailyMax: 2 });
    for (const a of [alerted, alerted, late, late]) await legacyGet(gw.base, "/retail/item_get/", { key: a.key, secret: a.secret, num_iid: demo.retailNumIid });
    await gw.runtime.admin.setAlerts(late.key, { url: "https://hooks.example.com/b", usagePercents: [50] });
    embedded.alerted = { key: alerted.key, alertSecret: alertSecret! };
    embedded.late = late.key;
    embedded.paying = paying;
    embedded.balance = (await gw.runtime.accounts.find(paying.key))!.balance;
    embedded.charged = (await gw.runtime.meter.usage(paying.key, "9999-12-31", "9999-12-30")).before;
  } finally {
    await gw.close();
  }
});
afterAll(async () => {
  await pool?.end();
  await target?.drop();
  rmSync(dataDir, { recursive: true, force: true });
});

const count = async (table: string) => Number((await pool.query<{ n: string }>(`SELECT count(*)::text AS n FROM ${table}`)).rows[0]!.n);

describe("gateway migrate --to postgres://…", () => {
  it("copies every table of the data directory into an empty database, and says what it checked", async () => {
    expect(embedded.balance).toBe(4_000_000n);
    expect(embedded.charged).toBe(4);
    const r = await runCli(["migrate", "--to", target.url, "--json"], { GATEWAY_DATA_DIR: dataDir });
    expect(r.stderr).toBe("");
    expect(r.code).toBe(0);
    const report = JSON.parse(r.stdout) as { tables: { table: string; embedded: number; postgres: number }[] };
    for (const t of report.tables) expect(t.postgres, t.table).toBe(t.embedded);
    expect(report.tables.map((t) => t.table)).toEqual(["accounts", "balances", "rate_arrivals", "idempotency_keys", "balance_changes", "account_changes", "admin_tokens", "maintenance", "maintenance_changes", "alerts", "usage_daily", "ledger", "ledger_daily_totals", "refusals", "catalogue_records"]);

    // Secrets stay hashed; the balance, prices and operations arrive as they were.
    const account = (await pool.query("SELECT a.*, b.micros::text AS balance FROM accounts a LEFT JOIN balances b ON b.account = a.key WHERE a.key = $1", [embedded.paying!.key])).rows[0];
    expect(account.secret_hash).toMatch(/^[0-9a-f]{64}$/);
    expect(JSON.stringify(account)).not.toContain(embedded.paying!.secret);
    expect(account.balance).toBe("4000000");
    expect(account.prices).toEqual({ "retail/item_get": "250000" });
    expect(account.previous_secret[0].secretHash).toMatch(/^[0-9a-f]{64}$/);
    expect(account.previous_secret[0].until).toBeGreaterThan(Date.now());
    expect(account.rate).toEqual({ calls: 600, seconds: 60, burst: 50 });
    // And its place under the rate, so the first calls on the shared store are held to it (four calls, 100 ms each).
    const arrivals = (await pool.query("SELECT tat::text AS tat FROM rate_arrivals WHERE account = $1", [embedded.paying!.key])).rows;
    expect(arrivals).toHaveLength(1);
    expect(BigInt(arrivals[0].tat)).toBeGreaterThan(BigInt(Date.now() - 60_000) * 1_000_000n);
    expect(account.allowed_from).toEqual(["127.0.0.1", "2001:db8::/32"]);
    // Its external id and the digest of the request that made it: the same creation sent to the shared store is a repeat.
    expect([account.external_id, account.created_with]).toEqual(["cus_paying", expect.stringMatching(/^[0-9a-f]{64}$/)]);
    // The charged call's idempotency key, so a retry after the move is still answered again, not charged.
    expect((await pool.query("SELECT request_id, token FROM idempotency_keys WHERE account = $1 AND key = 'migrated-1'", [embedded.paying!.key])).rows).toEqual([{ request_id: keyedRequestId, token: null }]);
    // The balance's record comes with it, and the next change recorded there follows it.
    const changes = (await pool.query("SELECT id::int AS id, kind, amount::text AS amount, balance::text AS balance FROM balance_changes WHERE account = $1 ORDER BY id", [embedded.paying!.key])).rows;
    expect(changes.map(({ kind, amount, balance }) => ({ kind, amount, balance }))).toEqual([{ kind: "opening", amount: "5000000", balance: "5000000" }]);
    const next = await pool.query("INSERT INTO balance_changes (account, at, kind, amount, balance) VALUES ('x', 0, 'top-up', 1, 1) RETURNING id::int AS id");
    expect(next.rows[0].id).toBeGreaterThan(changes.at(-1)!.id);
    await pool.query("DELETE FROM balance_changes WHERE account = 'x'");
    // So does the record of its settings (who did what, never a secret), and the next change recorded there follows it.
    const history = (await pool.query("SELECT id::int AS id, kind, actor, changes FROM account_changes WHERE account = $1 ORDER BY id", [embedded.paying!.key])).rows;
    expect(history.map((h) => h.kind)).toEqual(["created", "secret"]);
    expect(history[1].changes).toEqual([["oldSecretUntil", "", expect.stringMatching(/^\d{4}-\d\d-\d\dT/)], ["secret", "", "rotated"]]);
    expect(JSON.stringify(history)).not.toContain(account.secret_hash);
    const after = await pool.query("INSERT INTO account_changes (account, at, kind, actor, changes) VALUES ('x', 0, 'plan', 'test', '[]') RETURNING id::int AS id");
    expect(after.rows[0].id).toBeGreaterThan(history.at(-1)!.id);
    await pool.query("DELETE FROM account_changes WHERE account = 'x'");
    // Named admins come with their token's hash, never the token: the same token works on the shared store.
    expect((await pool.query("SELECT name, created_by FROM admin_tokens")).rows).toEqual([{ name: "erin", created_by: "gateway" }]);
    expect(JSON.stringify((await pool.query("SELECT * FROM admin_tokens")).rows)).not.toContain(embedded.adminToken);
    expect((await new AdminTokens(new PostgresAdminTokens(pool), systemClock).identify(embedded.adminToken!))?.name).toBe("erin");
    expect(account.operations).toMatchObject({ "wholesale/item_get": "enabled" });
    // The ledger: the four charged calls, each with its row; the wrong secret had no account, so it is counted as a refusal.
    const rows = (await pool.query("SELECT error_code, charge, price::text AS price, cache_hit FROM ledger WHERE account = $1 ORDER BY request_id", [embedded.paying!.key])).rows;
    expect(rows.filter((x) => x.charge === "charged").map((x) => x.price)).toEqual(["250000", "250000", "250000", "250000"]);
    expect(rows).toHaveLength(4);
    // Each with the address it came from.
    expect((await pool.query("SELECT DISTINCT client_ip FROM ledger WHERE account = $1", [embedded.paying!.key])).rows).toEqual([{ client_ip: "127.0.0.1" }]);
    expect((await pool.query("SELECT sum(calls)::int AS n FROM refusals WHERE error_code = 4005")).rows[0].n).toBeGreaterThan(0);
    expect((await pool.query("SELECT charged::text AS c FROM usage_daily WHERE account = $1", [embedded.paying!.key])).rows[0].c).toBe("4");
    expect(await count("refusals")).toBeGreaterThan(0);
    expect((await pool.query("SELECT operation FROM maintenance")).rows).toEqual([{ operation: "wholesale/item_get" }]);
    expect((await pool.query("SELECT at::text AS at, operation, switched_on, actor FROM maintenance_changes")).rows).toEqual([
      { at: "1800000000000", operation: "wholesale/item_get", switched_on: true, actor: "cli ops@host" },
    ]);
    // Alerts: the settings and their secret, the one waiting with its id, and none made by the copy itself.
    const alerted = (await pool.query("SELECT alerts, alert_secret, previous_alert_secret FROM accounts WHERE key = $1", [embedded.alerted!.key])).rows[0];
    expect(alerted).toEqual({
      alerts: { url: "https://hooks.example.com/a", usage: [50, 100] },
      alert_secret: embedded.alerted!.alertSecret,
      previous_alert_secret: [{ secret: embedded.firstAlertSecret, until: expect.any(Number) }],
    });
    const waiting = (await pool.query("SELECT id::int AS id, account, kind, level::int AS level, value::int AS value, attempts, next_at IS NOT NULL AS due FROM alerts")).rows;
    expect(waiting.map(({ id: _, ...rest }) => rest)).toEqual([{ account: embedded.alerted!.key, kind: "usage", level: 50, value: 2, attempts: 0, due: true }]);
    expect((await pool.query("SELECT count(*)::int AS n FROM alerts WHERE account = $1", [embedded.late])).rows[0].n).toBe(0);
    // The triggers are on again after the copy: the next crossing is recorded, after the copied id.
    await pool.query("UPDATE usage_daily SET charged = charged + 2 WHERE account = $1", [embedded.alerted!.key]);
    const recorded = (await pool.query("SELECT id::int AS id, level::int AS level FROM alerts WHERE account = $1 ORDER BY id", [embedded.alerted!.key])).rows;
    expect(recorded.map((x) => x.level)).toEqual([50, 100]);
    expect(recorded[1].id).toBeGreaterThan(recorded[0].id);
    await pool.query("UPDATE usage_daily SET charged = charged - 2 WHERE account = $1", [embedded.alerted!.key]);
    await pool.query("DELETE FROM alerts WHERE account = $1 AND level = 100", [embedded.alerted!.key]);
    // The catalogue: every record, its bytes intact.
    expect(await count("catalogue_records")).toBe(560);
    const record = (await pool.query("SELECT record FROM catalogue_records WHERE catalogue = 'retail' AND kind = 'item_detail' AND key = $1", [demo.retailNumIid])).rows[0];
    expect(fromBinary(ItemDetailSchema, record.record as Buffer).numIid).toBe(demo.retailNumIid);
  });

  it("refuses a database that already holds gateway data, changing nothing", async () => {
    const before = await count("ledger");
    const r = await runCli(["migrate", "--to", target.url], { GATEWAY_DATA_DIR: dataDir });
    expect(r.code).toBe(2);
    expect(r.stderr).toContain("already holds gateway data");
    expect(await count("ledger")).toBe(before);
  });

  it("refuses while a gateway serves from the data directory, and never prints the URL's password", async () => {
    const lock = lockDataDirectory(dataDir);
    try {
      const r = await runCli(["migrate", "--to", target.url.replace("postgres@", "postgres:hunter2@")], { GATEWAY_DATA_DIR: dataDir });
      expect(r.code).toBe(2);
      expect(r.stderr).toContain("is already served by");
      expect(r.stderr + r.stdout).not.toContain("hunter2");
    } finally {
      lock.release();
    }
    const wrong = await runCli(["migrate", "--to", "postgres://nobody:hunter2@127.0.0.1:1/none"], { GATEWAY_DATA_DIR: dataDir });
    expect(wrong.code).toBe(1);
    expect(wrong.stderr).toContain("127.0.0.1:1/none");
    expect(wrong.stderr).not.toContain("hunter2");
  });
});

describe("the shared schema", () => {
  it("is brought up to date once when replicas start at once", async () => {
    const db = await freshDatabase("schema");
    const pools = Array.from({ length: 4 }, () => openPostgres(db.url, { max: 1 }));
    try {
      const results = await Promise.all(pools.map((p) => migrateSchema(p)));
      expect(results.filter((r) => r.from === 0)).toHaveLength(1);
      expect(results.every((r) => r.to === migrations.length)).toBe(true);
      const versions = (await pools[0]!.query("SELECT version FROM schema_migrations ORDER BY version")).rows.map((r) => r.version);
      expect(versions).toEqual(migrations.map((_, i) => i + 1));
      expect(await migrateSchema(pools[0]!)).toEqual({ from: migrations.length, to: migrations.length });
    } finally {
      await Promise.all(pools.map((p) => p.end()));
      await db.drop();
    }
  });
});
