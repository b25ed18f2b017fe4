// Issue 13, properties 1, 2 and 4 at the port: the shared meter, several replicas on one PostgreSQL.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Account } from "../src/core/accounts.ts";
import { GatewayError } from "../src/core/gateway-error.ts";
import type { Admission, LedgerRow } from "../src/core/meter.ts";
import { idempotencyKey } from "../src/core/idempotency.ts";
import { operationById } from "../src/operations/index.ts";
import { PostgresMeter } from "../src/stores/postgres/meter.ts";
import { migrateSchema, migrations, openPostgres } from "../src/stores/postgres/postgres-database.ts";
import { freshDatabase, watchQueries } from "./support/postgres.ts";
import type pg from "pg";
import net from "node:net";

let db: Awaited<ReturnType<typeof freshDatabase>>;
const pools: pg.Pool[] = [];
const meters: PostgresMeter[] = [];
let admin: pg.Pool;

function replica(holder: string, options: Partial<ConstructorParameters<typeof PostgresMeter>[1]> = {}): PostgresMeter {
  const pool = openPostgres(db.url, { max: 4 });
  pools.push(pool);
  const meter = new PostgresMeter(pool, { holder, ...options });
  meters.push(meter);
  return meter;
}

beforeAll(async () => {
  db = await freshDatabase("meter");
  admin = openPostgres(db.url, { max: 2 });
  await migrateSchema(admin);
});
afterAll(async () => {
  for (const m of meters) m.close();
  await Promise.all([...pools, admin].map((p) => p.end()));
  await db?.drop();
});

let n = 0;
async function account(plan: Partial<Account> & { balance?: bigint } = {}): Promise<Account> {
  const key = `acct${String(++n).padStart(12, "0")}`;
  await admin.query(
    `INSERT INTO accounts (key, name, secret_hash, secret_salt, status, operations, daily_max, concurrency, prices, expires, zone, created_at)
     VALUES ($1, 't', 'h', 's', 'active', '{}', $2, $3, '{}', '2099-12-31', 'Asia/Shanghai', 0)`,
    [key, plan.dailyMax ?? 10_000, plan.concurrency ?? 1000],
  );
  if (plan.balance !== undefined) await admin.query("INSERT INTO balances (account, micros) VALUES ($1, $2)", [key, plan.balance.toString()]);
  return {
    key, name: "t", secretHash: "h", secretSalt: "s", status: "active", operations: new Map(), dailyMax: plan.dailyMax ?? 10_000, concurrency: plan.concurrency ?? 1000,
    balance: plan.balance, prices: plan.prices ?? new Map(), expires: "2099-12-31", zone: "Asia/Shanghai", createdAt: 0,
  };
}

let ids = 0;
function row(a: Account, charge: LedgerRow["charge"], price: bigint): LedgerRow {
  return { requestId: `req-${String(++ids).padStart(8, "0")}`, at: Date.now(), day: "2026-11-22", account: a.key, operation: "retail/item_get", code: charge === "charged" ? 0 : 4000, charge, price, cacheHit: false, upstreamRequests: 0, latencyMicros: 1, transport: "legacy" };
}

/** One call of `a` on `m`, admitted and recorded at once: 0, or the code it was refused with, its words kept in `reasons`. */
function admitAndRecord(m: PostgresMeter, a: Account, reasons: string[]): Promise<number> {
  return m.admit(a, "retail/item_get", "2026-11-22").then(
    async (admission) => {
      await m.record(row(a, "charged", 0n), admission);
      return 0;
    },
    (e: unknown) => {
      reasons.push((e as Error).message);
      return (e as GatewayError).code;
    },
  );
}

/** One call as the gateway makes it: admit, maybe hold the slot a while, record (charged unless told), and say the code. */
async function call(meter: PostgresMeter, a: Account, holdMs = 0, onHold?: (delta: number) => void, charge: LedgerRow["charge"] = "charged"): Promise<number> {
  let admission: Admission;
  try {
    admission = await meter.admit(a, "retail/item_get", "2026-11-22");
  } catch (e) {
    if (e instanceof GatewayError) return e.code;
    throw e;
  }
  onHold?.(1);
  if (holdMs > 0) await new Promise((r) => setTimeout(r, holdMs));
  onHold?.(-1);
  await meter.record(row(a, charge, charge === "charged" ? admission.price : 0n), admission);
  return 0;
}

const count = async (sql: string, params: unknown[]) => Number((await admin.query<{ n: string }>(sql, params)).rows[0]!.n);

describe("the shared meter, three replicas on one PostgreSQL", () => {
  it("admits exactly the daily maximum of 4× that many simultaneous calls spread over the replicas, one ledger row each", async () => {
    const replicas = [replica("r1"), replica("r2"), replica("r3")];
    const a = await account({ dailyMax: 50 });
    const codes = await Promise.all(Array.from({ length: 200 }, (_, i) => call(replicas[i % 3]!, a)));
    expect(codes.filter((c) => c === 0)).toHaveLength(50);
    expect(new Set(codes.filter((c) => c !== 0))).toEqual(new Set([4013]));
    expect(await count("SELECT charged::text AS n FROM usage_daily WHERE account = $1", [a.key])).toBe(50);
    expect(await count("SELECT count(*)::text AS n FROM ledger WHERE account = $1 AND charge = 'charged'", [a.key])).toBe(50);
    expect(await count("SELECT count(*)::text AS n FROM admissions WHERE account = $1", [a.key])).toBe(0);
    expect((await replicas[0]!.usage(a.key, "2026-11-22", "2026-11-21")).today).toBe(50);
  });

  it("never lets more than N calls of an account run at once across replicas, and frees every slot", async () => {
    const replicas = [replica("r4"), replica("r5"), replica("r6")];
    const a = await account({ concurrency: 3 });
    let running = 0;
    let peak = 0;
    const track = (d: number) => {
      running += d;
      peak = Math.max(peak, running);
    };
    const codes = await Promise.all(Array.from({ length: 30 }, (_, i) => call(replicas[i % 3]!, a, 80, track)));
    expect(peak).toBeLessThanOrEqual(3);
    expect(codes.filter((c) => c === 4008).length).toBeGreaterThan(0);
    expect(await Promise.all(Array.from({ length: 3 }, (_, i) => call(replicas[i]!, a, 20)))).toEqual([0, 0, 0]);
  });

  it("admits exactly an account's rate limit across replicas, refused calls costing nothing, and again as the rate allows", async () => {
    let now = 1_800_000_000_000;
    const clock = { now: () => now };
    const replicas = [replica("r31", clock), replica("r32", clock), replica("r33", clock)];
    // 10 a second, at most 4 at once. A call moves the account's arrival time on by 100 ms.
    const rated = { ...(await account()), rate: { calls: 10, seconds: 1, burst: 4 } };
    const reasons: string[] = [];
    const attempt = (m: PostgresMeter) => admitAndRecord(m, rated, reasons);
    const burst = async (calls: number) => (await Promise.all(Array.from({ length: calls }, (_, i) => attempt(replicas[i % 3]!)))).filter((c) => c === 0).length;
    expect(await burst(40)).toBe(4);
    expect(new Set(reasons.map((r) => r.replace(/\d+ ms$/, "N ms")))).toEqual(new Set(["this account's rate limit of 10/s, burst 4 is reached; the next call is admitted in N ms"]));
    // 36 refusals took nothing: 100 ms later exactly one more call fits, 250 ms later two and a half (so two).
    now += 99;
    expect(await burst(10)).toBe(0);
    now += 1;
    expect(await burst(10)).toBe(1);
    now += 250;
    expect(await burst(10)).toBe(2);
    // The rate's state is kept in PostgreSQL: a replica that never saw the account is held to it too.
    expect(await attempt(replica("r34", clock))).toBe(4008);
    // A call refused for another limit takes no place under the rate: an account at its daily maximum.
    const capped = { ...(await account({ dailyMax: 1 })), rate: { calls: 1, seconds: 60, burst: 2 } };
    expect(await call(replicas[0]!, capped)).toBe(0);
    expect(await call(replicas[1]!, capped)).toBe(4013);
    expect(await count("SELECT count(*)::text AS n FROM rate_arrivals WHERE account = $1 AND tat = $2", [capped.key, String(BigInt(now + 60_000) * 1_000_000n)])).toBe(1);
    // An account without a rate keeps no arrival time.
    const free = await account();
    expect(await call(replicas[2]!, free)).toBe(0);
    expect(await count("SELECT count(*)::text AS n FROM rate_arrivals WHERE account = $1", [free.key])).toBe(0);
    // An admission says what the limits counted once it was let through (schema step 15), for the RateLimit fields:
    // the day's calls, charged and in flight, this one included, and the rate's arrival time, whichever replica.
    const told = { ...(await account({ dailyMax: 5 })), rate: { calls: 1, seconds: 60, burst: 3 } };
    const first = await replicas[0]!.admit(told, "retail/item_get", "2026-11-22");
    const second = await replicas[1]!.admit(told, "retail/item_get", "2026-11-22");
    expect([first.dayCount, second.dayCount]).toEqual([1, 2]);
    expect([first.rate, second.rate]).toEqual([
      { tat: BigInt(now + 60_000) * 1_000_000n, at: now },
      { tat: BigInt(now + 120_000) * 1_000_000n, at: now },
    ]);
    await Promise.all([replicas[0]!.record(row(told, "charged", 0n), first), replicas[1]!.record(row(told, "charged", 0n), second)]);
    expect((await replicas[2]!.admit(told, "retail/item_get", "2026-11-22")).dayCount).toBe(3);
    // Replicas of the previous version call step 5's signature: the same body decides for them, without a rate. Its
    // verdicts now say the day's count after "ok"; a replica of the previous version reads any verdict that names no
    // limit as admitted.
    const leases = ["old-replica-1", "old-replica-2"];
    const old = await admin.query<{ v: string[] }>("SELECT gw_admit_many($1, $2, $3, $4, $5, $6, $7, $8, $9) AS v", [leases, free.key, "2026-11-22", ["0", "0"], 10_000, 1, "old", now, 30_000]);
    expect(old.rows[0]!.v).toEqual(["ok 2", "concurrency 1"]);
    await admin.query("DELETE FROM admissions WHERE lease = ANY($1)", [leases]);
  });

  it("holds a rated account to its burst when replicas' calls reach PostgreSQL in another order than they read their clocks (schema step 28)", async () => {
    const now = 1_800_000_000_000;
    // Two replicas on one clock, one call's reading 3 ms before the other's: its statement comes second.
    const later = replica("r51", { now: () => now + 3 });
    const earlier = replica("r52", { now: () => now });
    const rated = { ...(await account()), rate: { calls: 10, seconds: 1, burst: 4 } };
    const reasons: string[] = [];
    const burst = async (m: PostgresMeter, calls: number) => (await Promise.all(Array.from({ length: calls }, () => admitAndRecord(m, rated, reasons)))).filter((c) => c === 0).length;
    expect(await burst(later, 4)).toBe(4);
    // Step 26 read the time the burst left (403 ms on the earlier clock, past 300 + 100) as a step back: one more.
    expect(await burst(earlier, 10)).toBe(0);
    expect(new Set(reasons)).toEqual(new Set(["this account's rate limit of 10/s, burst 4 is reached; the next call is admitted in 103 ms"]));
  });

  it("serves a rated account at its rate after a replica's clock steps back an hour, or another's runs an hour ahead, rather than refusing it for the hour (schema step 26)", async () => {
    let now = 1_800_000_000_000;
    const clock = { now: () => now };
    const ahead = { now: () => now + 3_600_000 };
    const replicas = [replica("r41", clock), replica("r42", clock)];
    const rated = { ...(await account()), rate: { calls: 10, seconds: 1, burst: 4 } };
    const reasons: string[] = [];
    const attempt = (m: PostgresMeter) => admitAndRecord(m, rated, reasons);
    const burst = async (calls: number, on = replicas) => (await Promise.all(Array.from({ length: calls }, (_, i) => attempt(on[i % on.length]!)))).filter((c) => c === 0).length;
    expect(await burst(10)).toBe(4);
    // Both replicas' clocks step back an hour: one call at once (the burst read as spent up to now), then one an interval.
    now -= 3_600_000;
    reasons.length = 0;
    expect(await burst(10)).toBe(1);
    expect(new Set(reasons)).toEqual(new Set(["this account's rate limit of 10/s, burst 4 is reached; the next call is admitted in 100 ms"]));
    now += 100;
    expect(await burst(10)).toBe(1);
    // A replica whose clock runs an hour ahead spends the burst: the others are not refused for the hour either.
    now += 60_000;
    expect(await burst(10, [replica("r43", ahead)])).toBe(4);
    expect(await burst(10)).toBe(1);
    now += 100;
    expect(await burst(10)).toBe(1);
  });

  it("keeps leases and idempotency holds on PostgreSQL's clock (schema step 27): a replica a minute ahead takes no live one as lapsed, and one a minute behind keeps its own", async () => {
    const minute = 60_000;
    const right = replica("c1");
    const ahead = replica("c2", { now: () => Date.now() + minute });
    const behind = replica("c3", { now: () => Date.now() - minute, leaseMs: 600 });
    // One place: the call in flight on a replica holds it, and a replica whose clock runs a minute ahead is refused it.
    const one = await account({ concurrency: 1 });
    const held = await right.admit(one, "retail/item_get", "2026-11-22");
    expect(await call(ahead, one)).toBe(4008);
    await right.record(row(one, "charged", 0n), held);
    expect(await call(ahead, one)).toBe(0);
    // An idempotency key held by a call in flight is in flight for the replica ahead too, not taken a second time.
    const itemGet = operationById.get("retail/item_get")!;
    const k = idempotencyKey("skew-1", itemGet, { num_iid: "1" }, { useCache: true, lang: "cn" });
    const a = await account();
    expect((await right.claim(a.key, k, Date.now())).kind).toBe("taken");
    expect((await ahead.claim(a.key, k, Date.now() + minute)).kind).toBe("in_flight");
    // A replica a minute behind holds its own past its lease (600 ms here), renewing it on the same clock.
    const k2 = idempotencyKey("skew-2", itemGet, { num_iid: "1" }, { useCache: true, lang: "cn" });
    expect((await behind.claim(a.key, k2, Date.now() - minute)).kind).toBe("taken");
    const lease = await behind.admit(one, "retail/item_get", "2026-11-22");
    await new Promise((r) => setTimeout(r, 1200));
    expect((await right.claim(a.key, k2, Date.now())).kind).toBe("in_flight");
    expect(await call(right, one)).toBe(4008);
    await behind.record(row(one, "charged", 0n), lease);
    // What the statements read is the server's clock, whichever replica sent them.
    const skew = await admin.query<{ d: string }>("SELECT abs(gw_clock_ms() - $1::bigint)::text AS d", [Date.now()]);
    expect(Number(skew.rows[0]!.d)).toBeLessThan(5000);
  });

  it("never takes a prepaid balance below zero, and charges exactly what it admitted", async () => {
    const replicas = [replica("r7"), replica("r8"), replica("r9")];
    const a = await account({ balance: 1_000_000n, prices: new Map([["retail/item_get", 300_000n]]) });
    const codes = await Promise.all(Array.from({ length: 60 }, (_, i) => call(replicas[i % 3]!, a)));
    expect(codes.filter((c) => c === 0)).toHaveLength(3);
    expect(new Set(codes.filter((c) => c !== 0))).toEqual(new Set([4016]));
    expect(await count("SELECT micros::text AS n FROM balances WHERE account = $1", [a.key])).toBe(100_000);
  });

  it("takes from a balance only what it covers: an unbilled account's call in flight at its first, smaller top-up is served, and its batch-mates with it", async () => {
    const m = replica("r7b");
    const a = await account({ prices: new Map([["retail/item_get", 300_000n]]) });
    const other = await account({ balance: 1_000_000n, prices: new Map([["retail/item_get", 100_000n]]) });
    // Admitted with no balance to draw on, then a balance smaller than its price appears while it runs.
    const unbilled = await m.admit(a, "retail/item_get", "2026-11-22");
    await m.adjustBalance(a.key, { kind: "top-up", amount: 100_000n, at: Date.now() });
    const mate = await m.admit(other, "retail/item_get", "2026-11-22");
    // One commit for both (they are recorded in the same turn). Before, the first's deduction broke the
    // balance's check and failed the whole statement: both calls 4000, and the meter unavailable.
    const results = await Promise.allSettled([m.record(row(a, "charged", 300_000n), unbilled), m.record(row(other, "charged", 100_000n), mate)]);
    expect(results.map((r) => r.status)).toEqual(["fulfilled", "fulfilled"]);
    expect(m.unavailable(Date.now())).toBeUndefined();
    expect(await count("SELECT micros::text AS n FROM balances WHERE account = $1", [a.key])).toBe(100_000);
    expect(await count("SELECT micros::text AS n FROM balances WHERE account = $1", [other.key])).toBe(900_000);
    expect(await count("SELECT price::text AS n FROM ledger WHERE account = $1 AND charge = 'charged'", [a.key])).toBe(300_000);
  });

  it("records each top-up with the balance it left, in the statement that makes it, and accounts for the balance exactly across replicas", async () => {
    const replicas = [replica("r7c"), replica("r7d")];
    const price = 70_000n;
    const a = await account({ prices: new Map([["retail/item_get", price]]) });
    await replicas[0]!.adjustBalance(a.key, { kind: "opening", amount: 1_000_000n, at: 1 });
    const calls = Array.from({ length: 60 }, (_, i) => call(replicas[i % 2]!, a));
    const topUps = [500_000n, 250_000n, 330_000n];
    for (const [i, amount] of topUps.entries()) await replicas[i % 2]!.adjustBalance(a.key, { kind: "top-up", amount, at: 2 + i });
    const codes = await Promise.all(calls);
    const changes = (await replicas[1]!.balanceRecord(a.key)).changes;
    expect(changes.map((c) => [c.kind, c.amount, c.at])).toEqual([["opening", 1_000_000n, 1], ...topUps.map((t, i) => ["top-up", t, 2 + i])]);
    for (const [i, c] of changes.entries()) {
      const before = i === 0 ? 0n : changes[i - 1]!.balance!;
      expect(c.balance! - c.amount).toBeGreaterThanOrEqual(0n);
      expect(c.balance! - c.amount).toBeLessThanOrEqual(before);
    }
    const added = changes.reduce((sum, c) => sum + c.amount, 0n);
    const charged = BigInt(codes.filter((c) => c === 0).length) * price;
    expect(BigInt(await count("SELECT coalesce(sum(price), 0)::text AS n FROM ledger WHERE account = $1 AND charge = 'charged'", [a.key]))).toBe(charged);
    expect(BigInt(await count("SELECT micros::text AS n FROM balances WHERE account = $1", [a.key]))).toBe(added - charged);
    // Made unbilled: the balance dropped is recorded as taken away, and nothing is left to record a balance of.
    await replicas[0]!.adjustBalance(a.key, { kind: "unbilled", at: 9, by: "admin-api 10.0.0.9" });
    expect((await replicas[0]!.balanceRecord(a.key)).changes.at(-1)).toEqual({ at: 9, kind: "unbilled", amount: charged - added, balance: undefined, by: "admin-api 10.0.0.9", reference: "" });
  });

  it("gives back the places of calls that were not charged", async () => {
    const m = replica("r10");
    const a = await account({ dailyMax: 2, balance: 100n, prices: new Map([["retail/item_get", 100n]]) });
    for (let i = 0; i < 5; i++) expect(await call(m, a, 0, undefined, "uncharged")).toBe(0);
    expect(await call(m, a)).toBe(0);
    expect(await call(m, a)).toBe(4016);
    expect(await count("SELECT micros::text AS n FROM balances WHERE account = $1", [a.key])).toBe(0);
  });

  it("a replica that dies mid-call holds its slots only until its leases expire", async () => {
    const dying = replica("dying", { leaseMs: 400 });
    const other = replica("alive", { leaseMs: 400 });
    const a = await account({ concurrency: 2 });
    await dying.admit(a, "retail/item_get", "2026-11-22");
    await dying.admit(a, "retail/item_get", "2026-11-22");
    dying.close(); // no renewal, no record: as after SIGKILL
    expect(await call(other, a)).toBe(4008);
    await new Promise((r) => setTimeout(r, 600));
    expect(await call(other, a)).toBe(0);
  });

  it("keeps a long call's lease alive while it runs", async () => {
    const m = replica("renewing", { leaseMs: 300 });
    const other = replica("waiting", { leaseMs: 300 });
    const a = await account({ concurrency: 1 });
    const long = call(m, a, 900);
    await new Promise((r) => setTimeout(r, 600));
    expect(await call(other, a)).toBe(4008);
    expect(await long).toBe(0);
  });

  it("totals calls with their cache hits per account, day, operation and code", async () => {
    const m = replica("r12");
    const a = await account();
    await Promise.all([
      m.record({ ...row(a, "charged", 0n), cacheHit: true }, undefined),
      m.record({ ...row(a, "charged", 0n), cacheHit: true }, undefined),
      m.record(row(a, "charged", 0n), undefined),
    ]);
    const report = await m.query({ account: a.key });
    expect(report.totals.map((t) => [t.code, t.calls, t.cacheHits])).toEqual([[0, 3, 2]]);
  });

  it("counts calls with no account per day, code and address", async () => {
    const m = replica("r11");
    const refusal: LedgerRow = { ...row({ key: "" } as Account, "ignored", 0n), account: undefined, code: 4004, clientIp: "203.0.113.9" };
    await Promise.all([m.record(refusal, undefined), m.record({ ...refusal, requestId: "x2" }, undefined)]);
    expect(await count("SELECT calls::text AS n FROM refusals WHERE client_ip = '203.0.113.9' AND error_code = 4004", [])).toBe(2);
    const report = await m.query({ code: 4004 });
    expect(report.totals.find((t) => t.account === undefined)?.calls).toBe(2);
  });

  it("keeps each account's open leases counted exactly as the leases themselves, through admissions, commits, refusals and expiry", async () => {
    const replicas = [replica("t1", { leaseMs: 300 }), replica("t2", { leaseMs: 300 })];
    const a = await account({ concurrency: 4, dailyMax: 40, balance: 10_000n, prices: new Map([["retail/item_get", 100n]]) });
    const b = await account({ concurrency: 3 });
    const open = async (k: string) =>
      (await admin.query<{ day: string; calls: string; amount: string }>("SELECT day, calls::text, amount::text FROM admissions_open WHERE account = $1 AND calls <> 0 ORDER BY day", [k])).rows;
    const leases = async (k: string) =>
      (await admin.query<{ day: string; calls: string; amount: string }>("SELECT day, count(*)::text AS calls, sum(price)::text AS amount FROM admissions WHERE account = $1 GROUP BY day ORDER BY day", [k])).rows;
    // Charged and uncharged calls, held a while, more at once than either account allows.
    await Promise.all(Array.from({ length: 30 }, (_, i) => call(replicas[i % 2]!, i % 3 === 0 ? b : a, 30, undefined, i % 4 === 0 ? "uncharged" : "charged")));
    expect(await open(a.key)).toEqual([]);
    expect(await open(b.key)).toEqual([]);
    // Leases a dead replica left: counted while they live, and swept when they would refuse a call.
    // They live 3 s: long enough to be there at the call that must be refused, on a machine busy with other files
    // (at 300 ms, a full run once found them gone already).
    const dying = replica("t3", { leaseMs: 3000 });
    for (let i = 0; i < 3; i++) await dying.admit(b, "retail/item_get", "2026-11-22");
    dying.close();
    expect(await open(b.key)).toEqual(await leases(b.key));
    expect(await open(b.key)).toEqual([{ day: "2026-11-22", calls: "3", amount: "0" }]);
    expect(await call(replicas[0]!, b)).toBe(4008);
    await new Promise((r) => setTimeout(r, 3100));
    expect(await call(replicas[1]!, b)).toBe(0);
    expect(await open(b.key)).toEqual([]);
    expect(await leases(b.key)).toEqual([]);
    // A lease of another day, held: both days counted; once it is settled, its day's counts go at the next decision.
    const held = await replicas[0]!.admit(a, "retail/item_get", "2026-11-21");
    const today = await replicas[0]!.admit(a, "retail/item_get", "2026-11-22");
    expect(await open(a.key)).toEqual([{ day: "2026-11-21", calls: "1", amount: "100" }, { day: "2026-11-22", calls: "1", amount: "100" }]);
    expect(await open(a.key)).toEqual(await leases(a.key));
    await replicas[0]!.record({ ...row(a, "charged", 100n), day: "2026-11-21" }, held);
    await replicas[1]!.record(row(a, "charged", 100n), today);
    expect(await call(replicas[1]!, a)).toBe(0);
    expect(await count("SELECT count(*)::text AS n FROM admission_totals WHERE account = $1 AND day = '2026-11-21'", [a.key])).toBe(0);
    expect(await count("SELECT micros::text AS n FROM balances WHERE account = $1", [a.key])).toBe(10_000 - 100 * (await count("SELECT count(*)::text AS n FROM ledger WHERE account = $1 AND charge = 'charged'", [a.key])));
  });

  it("decides in as few page reads after thousands of an account's calls as after its first hundred", async () => {
    const a = await account({ concurrency: 1_000_000, dailyMax: 1_000_000 });
    const now = Date.now();
    let probes = 0;
    // What one decision reads, nested statements and triggers included, as EXPLAIN ANALYZE counts it.
    const pages = async () => {
      const lease = `probe-${++probes}`;
      const e = await admin.query<{ "QUERY PLAN": [{ Plan: Record<string, number> }] }>(
        "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT gw_admit_many(ARRAY[$1], $2, '2026-11-22', ARRAY[0]::bigint[], 1000000, 1000000, 'probe', $3, 60000)",
        [lease, a.key, now],
      );
      await admin.query("DELETE FROM admissions WHERE lease = $1", [lease]);
      const plan = e.rows[0]!["QUERY PLAN"][0].Plan;
      return plan["Shared Hit Blocks"]! + plan["Shared Read Blocks"]!;
    };
    // Calls admitted and settled, a hundred at a time, as replicas do.
    const calls = async (rounds: number) => {
      for (let r = 0; r < rounds; r++) {
        const leases = Array.from({ length: 100 }, (_, i) => `churn-${probes}-${r}-${i}`);
        await admin.query("SELECT gw_admit_many($1, $2, '2026-11-22', $3, 1000000, 1000000, 'churn', $4, 60000)", [leases, a.key, leases.map(() => 0), now]);
        await admin.query("DELETE FROM admissions WHERE lease = ANY($1)", [leases]);
      }
    };
    await calls(1);
    await pages();
    const early = await pages();
    await calls(50);
    // Counting the leases themselves, as decisions did before schema step 5, read 74 pages here, and more with every call until a vacuum.
    expect(await pages()).toBeLessThanOrEqual(early + 4);
  });

  it("lets calls past an admission stuck on a connection that stopped answering, on another connection", async () => {
    // A TCP relay to PostgreSQL whose connections can be frozen: their bytes stop, and nothing closes.
    const pairs: [net.Socket, net.Socket][] = [];
    const target = new URL(db.url);
    const relay = net.createServer((client) => {
      const server = net.connect(Number(target.port || 5432), target.hostname);
      client.on("error", () => {});
      server.on("error", () => {});
      client.pipe(server);
      server.pipe(client);
      pairs.push([client, server]);
    });
    await new Promise<void>((r) => relay.listen(0, "127.0.0.1", r));
    const url = new URL(db.url);
    url.port = String((relay.address() as net.AddressInfo).port);
    const pool = openPostgres(url.href, { max: 2 });
    pools.push(pool);
    const m = new PostgresMeter(pool, { holder: "frozen" });
    meters.push(m);
    const a = await account({ concurrency: 10 });
    try {
      await m.admit(a, "retail/item_get", "2026-11-22"); // one connection, open and idle
      for (const [client, server] of pairs) {
        client.unpipe(server);
        server.unpipe(client);
        client.pause();
        server.pause();
      }
      const stuck = m.admit(a, "retail/item_get", "2026-11-22");
      let stuckEnded = false;
      stuck.then(() => (stuckEnded = true), () => (stuckEnded = true));
      await new Promise((r) => setTimeout(r, 100));
      const next = m.admit(a, "retail/item_get", "2026-11-22"); // waits for the stuck one a second at most, then goes on its own
      const first = await Promise.race([next.then(() => "admitted"), new Promise((r) => setTimeout(() => r("still waiting after 5 s"), 5000))]);
      expect(first).toBe("admitted");
      expect(stuckEnded).toBe(false);
      for (const pair of pairs) for (const socket of pair) socket.destroy();
      expect(((await stuck.catch((e: unknown) => e)) as GatewayError).code).toBe(4000);
    } finally {
      for (const pair of pairs) for (const socket of pair) socket.destroy();
      relay.close();
    }
  }, 20_000);

  it("counts, when the schema is upgraded, the leases that calls already hold", async () => {
    const old = await freshDatabase("meter_upgrade");
    const pool = openPostgres(old.url, { max: 2 });
    try {
      // The schema as it was before the counts (steps 1 to 4), with two calls in flight under it.
      await pool.query("CREATE TABLE schema_migrations (version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())");
      for (let v = 0; v < 4; v++) {
        await pool.query(migrations[v]!);
        await pool.query("INSERT INTO schema_migrations (version) VALUES ($1)", [v + 1]);
      }
      await pool.query("SELECT gw_admit_many($1, 'acct-up', '2026-11-22', $2, 100, 2, 'old', $3, 60000)", [["l1", "l2"], [0, 0], Date.now()]);
      expect(await migrateSchema(pool)).toEqual({ from: 4, to: migrations.length });
      const m = new PostgresMeter(pool, { holder: "new" });
      meters.push(m);
      const a = { key: "acct-up", dailyMax: 100, concurrency: 2, prices: new Map(), zone: "Asia/Shanghai" } as unknown as Account;
      const e = await m.admit(a, "retail/item_get", "2026-11-22").catch((x: unknown) => x);
      expect((e as GatewayError).code).toBe(4008);
      await pool.query("DELETE FROM admissions WHERE lease = 'l1'"); // that call's commit
      expect((await m.admit(a, "retail/item_get", "2026-11-22")).lease).toBeTruthy();
    } finally {
      await pool.end();
      await old.drop();
    }
  });

  it("vacuums the lease table itself each time its commits have settled vacuumEveryLeases leases, and never with 0", async () => {
    // A database of its own: the count of manual vacuums of its lease table is this test's alone.
    const own = await freshDatabase("meter_vacuum");
    const ownAdmin = openPostgres(own.url, { max: 2 });
    const made: PostgresMeter[] = [];
    const ownPools: pg.Pool[] = [ownAdmin];
    try {
      await migrateSchema(ownAdmin);
      const meterOn = (vacuumEveryLeases: number) => {
        const pool = openPostgres(own.url, { max: 4 });
        ownPools.push(pool);
        const m = new PostgresMeter(pool, { holder: `v${vacuumEveryLeases}`, vacuumEveryLeases });
        made.push(m);
        return m;
      };
      await ownAdmin.query(
        `INSERT INTO accounts (key, name, secret_hash, secret_salt, status, operations, daily_max, concurrency, prices, expires, zone, created_at)
         VALUES ('vac', 't', 'h', 's', 'active', '{}', 1000000, 1000, '{}', '2099-12-31', 'Asia/Shanghai', 0)`,
      );
      const a = { key: "vac", dailyMax: 1_000_000, concurrency: 1000, prices: new Map(), zone: "Asia/Shanghai" } as unknown as Account;
      // Calls 40 at a time, each admitted and its row committed (which deletes its lease).
      const calls = async (m: PostgresMeter, total: number) => {
        for (let done = 0; done < total; done += 40) await Promise.all(Array.from({ length: Math.min(40, total - done) }, () => call(m, a)));
      };
      const vacuums = async () =>
        Number((await ownAdmin.query<{ n: string }>("SELECT vacuum_count::text AS n FROM pg_stat_user_tables WHERE relname = 'admissions'")).rows[0]!.n);
      const settle = () => new Promise((r) => setTimeout(r, 1000));

      await calls(meterOn(0), 400);
      await settle();
      expect(await vacuums()).toBe(0);

      const m = meterOn(300);
      await calls(m, 280);
      await settle();
      expect(await vacuums()).toBe(0);
      await calls(m, 40);
      const deadline = Date.now() + 10_000;
      while ((await vacuums()) === 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100));
      expect(await vacuums()).toBe(1);
      // Every call was recorded, before, during and after the vacuum.
      expect(Number((await ownAdmin.query<{ n: string }>("SELECT count(*)::text AS n FROM ledger")).rows[0]!.n)).toBe(720);
      expect(Number((await ownAdmin.query<{ n: string }>("SELECT count(*)::text AS n FROM admissions")).rows[0]!.n)).toBe(0);
    } finally {
      for (const m of made) m.close();
      await Promise.all(ownPools.map((p) => p.end()));
      await own.drop();
    }
  });

  it("commits a decision without waiting for the disk, and leaves the connection's next commit (the ledger's) synchronous", async () => {
    const pool = openPostgres(db.url, { max: 1 }); // one connection: the decision's and the next statement's
    pools.push(pool);
    const m = new PostgresMeter(pool, { holder: "one-connection" });
    meters.push(m);
    const a = await account();
    const admission = await m.admit(a, "retail/item_get", "2026-11-22");
    expect((await pool.query<{ synchronous_commit: string }>("SHOW synchronous_commit")).rows[0]!.synchronous_commit).toBe("on");
    await m.record(row(a, "charged", 0n), admission);
    expect((await admin.query("SELECT count(*)::int AS n FROM ledger WHERE account = $1", [a.key])).rows[0].n).toBe(1);
  });

  it("reads an account's usage once however many calls find it stale at once", async () => {
    const pool = openPostgres(db.url, { max: 4 });
    pools.push(pool);
    const reads = watchQueries(pool, "FROM usage_daily WHERE account").count;
    let now = Date.now();
    const m = new PostgresMeter(pool, { holder: "usage", now: () => now });
    meters.push(m);
    const a = await account();
    await call(m, a);
    const first = await Promise.all(Array.from({ length: 40 }, () => m.usage(a.key, "2026-11-22", "2026-11-21")));
    expect(first.every((u) => u.today === 1)).toBe(true);
    expect(reads()).toBe(1);
    (first[0] as { today: number }).today = 99; // each caller gets its own copy
    now += 1001;
    const again = await Promise.all(Array.from({ length: 40 }, () => m.usage(a.key, "2026-11-22", "2026-11-21")));
    expect(again.every((u) => u.today === 1)).toBe(true);
    expect(reads()).toBe(2);
  });

  it("refuses with 4000, naming the shared database, when PostgreSQL cannot be reached, and tries again after a second", async () => {
    const pool = openPostgres("postgres://postgres@127.0.0.1:1/none", { max: 1 });
    pools.push(pool);
    let now = 1_000_000;
    const m = new PostgresMeter(pool, { now: () => now });
    meters.push(m);
    const a = await account();
    const e = await m.admit(a, "retail/item_get", "2026-11-22").catch((x: unknown) => x);
    expect(e).toBeInstanceOf(GatewayError);
    expect((e as GatewayError).code).toBe(4000);
    expect((e as GatewayError).message).toContain("shared database (PostgreSQL)");
    expect(m.unavailable(now)).toContain("PostgreSQL");
    now += 1500;
    expect(m.unavailable(now)).toBeUndefined();
  });
});
