// Usage alerts: an account names a URL, and the gateway tells it, by a signed POST, when the day's charged calls
// reach shares of the daily maximum and when the balance falls below a floor. The embedded store here, in one
// process, with a real receiver on loopback that can refuse or stall on purpose; the shared store's replicas are
// in replicas.test.ts.
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { createHmac } from "node:crypto";
import { mkdtempSync, rmSync } from "node:fs";
import { createServer } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { alertAttempts, alertHostAllowed, checkAlertSettings } from "../src/core/alerts.ts";
import { AlertDeliveries, AlertSender } from "../src/exporters/alert-webhooks.ts";
import { toJsonString } from "@bufbuild/protobuf";
import { AccountEventKind, AccountSchema, AdminService } from "../src/gen/gateway/admin/v1/admin_pb.js";
import { AccountService } from "../src/gen/gateway/account/v1/account_pb.js";
import type pg from "pg";
import { AccountAdmin } from "../src/core/account-admin.ts";
import { dayOf, nextDay, systemClock } from "../src/core/clock.ts";
import { operations } from "../src/operations/index.ts";
import { PostgresAccountStore } from "../src/stores/postgres/account-store.ts";
import { PostgresAlertOutbox } from "../src/stores/postgres/alert-outbox.ts";
import { PostgresMeter } from "../src/stores/postgres/meter.ts";
import { migrateSchema, openPostgres } from "../src/stores/postgres/postgres-database.ts";
import { runCli } from "./support/cli.ts";
import { receiver, type Delivery } from "./support/receiver.ts";
import { freshDatabase } from "./support/postgres.ts";
import { adminToken, demo, legacyGet, startGateway, type GatewayFixture } from "./support/gateway-fixture.ts";

async function until<T>(what: () => T | undefined, ms = 10_000): Promise<T> {
  const end = Date.now() + ms;
  for (;;) {
    const v = what();
    if (v !== undefined) return v;
    if (Date.now() > end) throw new Error("timed out");
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** A delivery's Gateway-Signature as a receiver reads it: its time, and each `v1` (one per secret it was signed with). */
function signatures(d: Delivery): { t: string; v1: string[] } | undefined {
  const m = /^t=(\d+)((?:,v1=[0-9a-f]{64})+)$/.exec(String(d.headers["gateway-signature"]));
  return m === null ? undefined : { t: m[1]!, v1: m[2]!.split(",v1=").slice(1) };
}

/** Checks a delivery's Gateway-Signature as a receiver would: HMAC-SHA256 of `<t>.<body>` under the secret, matching any `v1`. */
function signedBy(d: Delivery, secret: string): boolean {
  const sig = signatures(d);
  if (sig === undefined) return false;
  if (Math.abs(Date.now() / 1000 - Number(sig.t)) > 300) return false;
  return sig.v1.includes(createHmac("sha256", secret).update(`${sig.t}.${d.body}`).digest("hex"));
}

const ok = { headers: { authorization: `Bearer ${adminToken}` } };

const nextDays = (day: string, n: number) => {
  let d = day;
  for (let i = 0; i < n; i++) d = nextDay(d);
  return d;
};

describe("usage alerts, embedded", () => {
  let gw: GatewayFixture;
  let hooks: Awaited<ReturnType<typeof receiver>>;
  beforeAll(async () => {
    hooks = await receiver();
    gw = await startGateway({ deliverAlerts: { intervalMs: 50 } });
  });
  afterAll(async () => {
    await gw.close();
    await hooks.close();
  });
  afterEach(() => {
    hooks.got.length = 0;
    hooks.answer = () => 204;
  });
  const admin = () => createClient(AdminService, createConnectTransport({ baseUrl: gw.base, httpVersion: "1.1" }));
  const call = (a: { key: string; secret: string }) => legacyGet(gw.base, "/retail/item_get/", { key: a.key, secret: a.secret, num_iid: demo.retailNumIid }).then((r) => r.json.error_code);

  it("tells each line the account's calls cross once, signed, as the commit that crossed it recorded it", async () => {
    const a = await gw.newAccount({ dailyMax: 4, balance: 300_000n, prices: new Map([["retail/item_get", 50_000n]]) });
    const set = await admin().setAlerts({ key: a.key, alerts: { url: `${hooks.url}/hooks/gw?token=t0ps3cret`, usagePercents: [100, 50], balanceBelow: "0.2" } }, ok);
    expect(set.secret).toMatch(/^whsec_[A-Za-z0-9_-]{43}$/);
    expect(set.account!.alerts).toMatchObject({ url: `${hooks.url}/hooks/gw?token=t0ps3cret`, usagePercents: [50, 100], balanceBelow: "0.2" });
    // Calls 2 (50% of 4) and 4 (100%) cross the usage lines; call 3 leaves 0.15 of the balance, below 0.2; call 5 is refused.
    const codes = [];
    for (let i = 0; i < 5; i++) codes.push(await call(a));
    expect(codes).toEqual(["0000", "0000", "0000", "0000", "4013"]);
    await until(() => (hooks.got.length >= 3 ? true : undefined));
    await new Promise((r) => setTimeout(r, 300)); // nothing more comes
    expect(hooks.got).toHaveLength(3);
    for (const d of hooks.got) {
      expect(d.path).toBe("/hooks/gw?token=t0ps3cret");
      expect(d.headers["content-type"]).toBe("application/json");
      expect(signedBy(d, set.secret)).toBe(true);
      expect(signedBy(d, "whsec_another")).toBe(false);
      expect(d.headers["gateway-alert-id"]).toBe((JSON.parse(d.body) as { id: string }).id);
    }
    const bodies = hooks.got.map((d) => JSON.parse(d.body) as { type: string; account: string; data: Record<string, unknown> }).sort((x, y) => (JSON.stringify(x.data) < JSON.stringify(y.data) ? -1 : 1));
    const day = (bodies.find((b) => b.type === "usage.threshold")!.data as { day: string }).day;
    expect(day).toMatch(/^\d{4}-\d{2}-\d{2}$/);
    expect(bodies.map((b) => [b.type, b.account, b.data])).toEqual([
      ["balance.low", a.key, { balance: "0.15", below: "0.2" }],
      ["usage.threshold", a.key, { day, percent: 100, calls: 4, dailyMax: 4 }],
      ["usage.threshold", a.key, { day, percent: 50, calls: 2, dailyMax: 4 }],
    ]);
    // What the operator reads: each delivered on its first attempt.
    const listed = await admin().listAlerts({ key: a.key }, ok);
    expect(listed.alerts.map((x) => [x.type, x.attempts, x.deliveredAtMs !== undefined, x.nextAttemptMs, x.lastError])).toEqual([
      ["usage.threshold", 1, true, undefined, ""],
      ["balance.low", 1, true, undefined, ""],
      ["usage.threshold", 1, true, undefined, ""],
    ]);
    // The team reads the same with its own key (AccountService): where alerts go (the origin only) and what they told.
    const team = createClient(AccountService, createConnectTransport({ baseUrl: gw.base, httpVersion: "1.1" }));
    const headers = { "x-api-key": a.key, "x-api-secret": a.secret };
    const mine = await team.getMyAccount({}, { headers });
    expect(mine.alerts).toMatchObject({ to: `${hooks.url}/…`, usagePercents: [50, 100], balanceBelow: "0.2" });
    expect(JSON.stringify(mine.alerts)).not.toContain("t0ps3cret");
    const told = await team.listMyAlerts({}, { headers });
    expect(told.alerts.map((x) => [x.id, x.type, JSON.parse(x.dataJson), x.attempts, x.deliveredAtMs !== undefined])).toEqual(
      listed.alerts.map((x) => [x.id, x.type, hooks.got.map((d) => JSON.parse(d.body) as { id: string; data: unknown }).find((b) => b.id === x.id)!.data, 1, true]),
    );
    const wrong = await team.listMyAlerts({}, { headers: { ...headers, "x-api-secret": "wrong" } }).then(() => undefined, ConnectError.from);
    expect(wrong?.code).toBe(Code.Unauthenticated);
    // A test alert: sent at once, signed alike, with an id of its own; nothing recorded.
    hooks.got.length = 0;
    const test = await admin().testAlerts({ key: a.key }, ok);
    expect([test.delivered, test.status, test.error, test.id]).toEqual([true, 204, "", expect.stringMatching(/^alert-test-[0-9a-f]{12}$/)]);
    expect(hooks.got).toHaveLength(1);
    expect(signedBy(hooks.got[0]!, set.secret)).toBe(true);
    expect(JSON.parse(hooks.got[0]!.body)).toMatchObject({ id: test.id, type: "alert.test", account: a.key, data: {} });
    expect((await admin().listAlerts({ key: a.key }, ok)).alerts).toHaveLength(3);
    hooks.answer = () => 401;
    expect(await admin().testAlerts({ key: a.key }, ok)).toMatchObject({ delivered: false, status: 401, error: "answered HTTP 401" });
    const none = await admin()
      .testAlerts({ key: (await gw.newAccount({})).key }, ok)
      .then(() => undefined, ConnectError.from);
    expect([none?.code, none?.rawMessage]).toEqual([Code.InvalidArgument, "this account has no alerts to test: set them first"]);
    const metrics = await (await fetch(`${gw.base}/metrics`)).text();
    expect(metrics).toMatch(/gateway_alert_attempts_total\{kind="usage",outcome="delivered"\} 2/);
    expect(metrics).toMatch(/gateway_alert_attempts_total\{kind="balance",outcome="delivered"\} 1/);
  });

  it("tells a balance floor each time calls cross it again after a top-up, and nothing for a top-up itself", async () => {
    const a = await gw.newAccount({ balance: 120_000n, prices: new Map([["retail/item_get", 50_000n]]) });
    await admin().setAlerts({ key: a.key, alerts: { url: hooks.url, balanceBelow: "0.1" } }, ok);
    expect(await call(a)).toBe("0000"); // 0.07: below
    expect(await call(a)).toBe("0000"); // 0.02: still below, not told again
    await admin().topUp({ key: a.key, amount: "0.1" }, ok); // 0.12
    expect(await call(a)).toBe("0000"); // 0.07: below again
    await until(() => (hooks.got.length >= 2 ? true : undefined));
    await new Promise((r) => setTimeout(r, 300));
    expect(hooks.got.map((d) => (JSON.parse(d.body) as { data: unknown }).data)).toEqual([
      { balance: "0.07", below: "0.1" },
      { balance: "0.07", below: "0.1" },
    ]);
  });

  it("keeps the secret when the settings change, makes another when asked, and drops it with the alerts; the history shows neither it nor the URL's path", async () => {
    const a = await gw.newAccount({});
    const c = admin();
    const first = await c.setAlerts({ key: a.key, alerts: { url: "https://hooks.example.com/T0/B1/s3cr3tpath", usagePercents: [80] } }, ok);
    expect(first.secret).not.toBe("");
    const changed = await c.setAlerts({ key: a.key, alerts: { url: "https://hooks.example.com/T0/B1/s3cr3tpath", usagePercents: [80, 90] } }, ok);
    expect(changed.secret).toBe(""); // the same secret goes on
    const renewed = await c.setAlerts({ key: a.key, alerts: { url: "https://hooks.example.com/T0/B1/s3cr3tpath", usagePercents: [80, 90] }, newSecret: true }, ok);
    expect(renewed.secret).toMatch(/^whsec_/);
    expect(renewed.secret).not.toBe(first.secret);
    const off = await c.setAlerts({ key: a.key }, ok);
    expect(off.account!.alerts).toBeUndefined();
    const history = await c.getAccountHistory({ key: a.key }, ok);
    const alertEvents = history.events.filter((e) => e.kind === AccountEventKind.ALERTS);
    expect(alertEvents.map((e) => e.changes.map((ch) => [ch.field, ch.before, ch.after]))).toEqual([
      [["alerts", "", "https://hooks.example.com/…; at 80%"], ["alertSecret", "", "made"]],
      [["alerts", "https://hooks.example.com/…; at 80%", "https://hooks.example.com/…; at 80%,90%"]],
      [["alertSecret", "", "made"]],
      [["alerts", "https://hooks.example.com/…; at 80%,90%", ""], ["alertSecret", "", "removed"]],
    ]);
    const text = JSON.stringify(history.events.map((e) => e.changes));
    expect(text).not.toContain("s3cr3tpath");
    for (const s of [first.secret, renewed.secret]) expect(text).not.toContain(s);
    // GetAccount shows the URL to an admin, never the secret.
    await c.setAlerts({ key: a.key, alerts: { url: "https://hooks.example.com/x", balanceBelow: "1" } }, ok);
    const shown = (await c.getAccount({ key: a.key }, ok)).account!;
    expect(shown.alerts).toMatchObject({ url: "https://hooks.example.com/x", usagePercents: [], balanceBelow: "1" });
    expect(toJsonString(AccountSchema, shown)).not.toMatch(/whsec_/);
  });

  it("signs with the replaced secret too while a new one keeps it, then with the new one alone", async () => {
    const a = await gw.newAccount({ dailyMax: 2 });
    const c = admin();
    const url = `${hooks.url}/rotating`;
    // Only this account's deliveries (a retry of another test's may arrive meanwhile).
    const mine = () => hooks.got.filter((d) => d.path === "/rotating");
    const s1 = (await c.setAlerts({ key: a.key, alerts: { url, usagePercents: [50] } }, ok)).secret;
    const before = Date.now();
    const kept = await c.setAlerts({ key: a.key, alerts: { url, usagePercents: [50] }, newSecret: true, keepOldSeconds: 3600 }, ok);
    const s2 = kept.secret;
    expect(s2).toMatch(/^whsec_/);
    expect(Number(kept.account!.alerts!.oldSecretUntilMs)).toBeGreaterThanOrEqual(before + 3_600_000);
    expect(Number(kept.account!.alerts!.oldSecretUntilMs)).toBeLessThanOrEqual(Date.now() + 3_600_000);
    // A test alert and a real one (the day's first call reaches 50% of 2): each with two v1, one per secret.
    await c.testAlerts({ key: a.key }, ok);
    expect(await call(a)).toBe("0000");
    await until(() => (mine().length >= 2 ? true : undefined));
    for (const d of mine()) {
      expect(signatures(d)!.v1).toHaveLength(2);
      expect([signedBy(d, s1), signedBy(d, s2), signedBy(d, "whsec_someone-else")]).toEqual([true, true, false]);
    }
    expect(mine().map((d) => (JSON.parse(d.body) as { type: string }).type).sort()).toEqual(["alert.test", "usage.threshold"]);
    // The history says until when, never a secret.
    const history = await c.getAccountHistory({ key: a.key }, ok);
    const last = history.events.filter((e) => e.kind === AccountEventKind.ALERTS).at(-1)!;
    expect(last.changes.map((ch) => [ch.field, ch.before, ch.after])).toEqual([["oldAlertSecretUntil", "", expect.stringMatching(/^\d{4}-\d\d-\d\dT/)], ["alertSecret", "", "made"]]);
    for (const secret of [s1, s2]) expect(JSON.stringify(history.events.map((e) => e.changes))).not.toContain(secret);
    // Asked for again (its answer lost): the secret receivers hold still signs, beside both new ones.
    hooks.got.length = 0;
    const s2b = (await c.setAlerts({ key: a.key, alerts: { url, usagePercents: [50] }, newSecret: true, keepOldSeconds: 3600 }, ok)).secret;
    await c.testAlerts({ key: a.key }, ok);
    const [thrice] = await until(() => (mine().length >= 1 ? mine() : undefined));
    expect([signatures(thrice!)!.v1.length, signedBy(thrice!, s1), signedBy(thrice!, s2), signedBy(thrice!, s2b)]).toEqual([3, true, true, true]);
    // A new secret without keeping: those kept stop as well.
    hooks.got.length = 0;
    const s3 = (await c.setAlerts({ key: a.key, alerts: { url, usagePercents: [50] }, newSecret: true }, ok)).secret;
    expect((await c.getAccount({ key: a.key }, ok)).account!.alerts!.oldSecretUntilMs).toBeUndefined();
    await c.testAlerts({ key: a.key }, ok);
    const [alone] = await until(() => (mine().length >= 1 ? mine() : undefined));
    expect([signatures(alone!)!.v1.length, signedBy(alone!, s3), signedBy(alone!, s2), signedBy(alone!, s1)]).toEqual([1, true, false, false]);
    // Kept for a second: signed with both, then with the new one alone once the second has passed.
    hooks.got.length = 0;
    const s4 = (await c.setAlerts({ key: a.key, alerts: { url, usagePercents: [50] }, newSecret: true, keepOldSeconds: 1 }, ok)).secret;
    await c.testAlerts({ key: a.key }, ok);
    await new Promise((r) => setTimeout(r, 1100));
    await c.testAlerts({ key: a.key }, ok);
    const [during, after] = await until(() => (mine().length >= 2 ? mine() : undefined));
    expect([signedBy(during!, s4), signedBy(during!, s3), signatures(after!)!.v1.length, signedBy(after!, s4)]).toEqual([true, true, 1, true]);
    expect((await c.getAccount({ key: a.key }, ok)).account!.alerts!.oldSecretUntilMs).toBeUndefined();
    // Refused: keeping without a new secret, or for more than 30 days; turning alerts off drops a kept secret with them.
    for (const req of [{ keepOldSeconds: 60 }, { newSecret: true, keepOldSeconds: 31 * 86_400 }]) {
      const e = await c.setAlerts({ key: a.key, alerts: { url, usagePercents: [50] }, ...req }, ok).then(() => undefined, ConnectError.from);
      expect(e?.code, JSON.stringify(req)).toBe(Code.InvalidArgument);
    }
    await c.setAlerts({ key: a.key, alerts: { url, usagePercents: [50] }, newSecret: true, keepOldSeconds: 3600 }, ok);
    await c.setAlerts({ key: a.key }, ok);
    expect((await gw.runtime.accounts.find(a.key))!.previousAlertSecrets).toBeUndefined();
  });

  it("refuses settings it cannot keep, without repeating the URL", async () => {
    const a = await gw.newAccount({});
    const refused = async (alerts: { url: string; usagePercents?: number[]; balanceBelow?: string }) => {
      const e = await admin()
        .setAlerts({ key: a.key, alerts: { usagePercents: [], ...alerts } }, ok)
        .then(() => undefined, ConnectError.from);
      expect(e?.code).toBe(Code.InvalidArgument);
      expect(e?.rawMessage).not.toContain("hunter2");
      return e!.rawMessage;
    };
    expect(await refused({ url: "ftp://h/hunter2", usagePercents: [80] })).toMatch(/http or https/);
    expect(await refused({ url: "https://me:hunter2@h/", usagePercents: [80] })).toMatch(/user or password/);
    expect(await refused({ url: "not a url hunter2", usagePercents: [80] })).toMatch(/not a URL/);
    expect(await refused({ url: "https://h/hunter2", usagePercents: [0] })).toMatch(/1 to 1000/);
    expect(await refused({ url: "https://h/hunter2", usagePercents: [1001] })).toMatch(/1 to 1000/);
    expect(await refused({ url: "https://h/hunter2", usagePercents: [1, 2, 3, 4, 5, 6, 7, 8, 9] })).toMatch(/at most 8/);
    expect(await refused({ url: "https://h/hunter2" })).toMatch(/a usage share, a balance floor or a key's expiry/);
    expect(await refused({ url: "https://h/hunter2", expiryDays: 0 } as never)).toMatch(/1 to 365/);
    expect(await refused({ url: "https://h/hunter2", expiryDays: 366 } as never)).toMatch(/1 to 365/);
    expect(await refused({ url: "https://h/hunter2", balanceBelow: "0" })).toMatch(/above 0/);
    expect(await refused({ url: "https://h/hunter2", balanceBelow: "-1" })).toMatch(/amount/);
    const e = await admin()
      .setAlerts({ key: a.key, newSecret: true }, ok)
      .then(() => undefined, ConnectError.from);
    expect(e?.code).toBe(Code.InvalidArgument);
    expect(() => checkAlertSettings({ url: "https://h/#frag", usagePercents: [5] })).toThrow(/fragment/);
    // Nothing was set by any of them.
    expect((await admin().getAccount({ key: a.key }, ok)).account!.alerts).toBeUndefined();
  });
});

describe("delivering alerts: retries, a receiver that stalls, giving up, a restart", () => {
  let hooks: Awaited<ReturnType<typeof receiver>>;
  const dirs: string[] = [];
  beforeAll(async () => {
    hooks = await receiver();
  });
  afterAll(async () => {
    await hooks.close();
    for (const d of dirs) rmSync(d, { recursive: true, force: true });
  });
  afterEach(() => {
    hooks.got.length = 0;
    hooks.answer = () => 204;
  });

  it("tries again with the same id after a refusal or no answer, doubling the wait, and gives up after the last attempt", async () => {
    const gw = await startGateway(); // no deliveries of its own: the test drives them, on a clock it moves
    try {
      const a = await gw.newAccount({ dailyMax: 1 });
      await gw.runtime.admin.setAlerts(a.key, { url: hooks.url, usagePercents: [100] });
      expect((await legacyGet(gw.base, "/retail/item_get/", { key: a.key, secret: a.secret, num_iid: demo.retailNumIid })).json.error_code).toBe("0000");
      let now = Date.now();
      const outcomes: string[] = [];
      const deliveries = new AlertDeliveries(gw.runtime.alerts, { now: () => now, timeoutMs: 300, onAttempt: (_k, o) => outcomes.push(o) });
      hooks.answer = (n) => (n === 1 ? 503 : n === 2 ? "never" : 500);
      expect(await deliveries.poll()).toBe(1); // 503
      expect(await deliveries.poll()).toBe(0); // not due for 10 s
      const [first] = await gw.runtime.alerts.recent(a.key, 1);
      expect([first!.attempts, first!.lastError, first!.nextAt! - now >= 10_000 && first!.nextAt! - now < 11_000]).toEqual([1, "answered HTTP 503", true]);
      const waits: number[] = [];
      for (let attempt = 2; attempt <= alertAttempts; attempt++) {
        const [before] = await gw.runtime.alerts.recent(a.key, 1);
        waits.push(Math.round((before!.nextAt! - now) / 1000));
        now = before!.nextAt!;
        expect(await deliveries.poll()).toBe(1);
      }
      expect(await deliveries.poll()).toBe(0);
      const [last] = await gw.runtime.alerts.recent(a.key, 1);
      expect([last!.attempts, last!.nextAt, last!.deliveredAt, last!.lastError]).toEqual([alertAttempts, undefined, undefined, "answered HTTP 500"]);
      // 10 s after the first, then doubling; the stalled attempt (the second) failed at 300 ms.
      expect(waits).toEqual([10, 20, 40, 80, 160, 320, 640, 1280, 2560, ...Array(alertAttempts - 10).fill(3600)]);
      expect(outcomes).toEqual([...Array(alertAttempts - 1).fill("retried"), "given_up"]);
      expect(new Set(hooks.got.map((d) => d.headers["gateway-alert-id"]))).toEqual(new Set([`alert-${last!.id}`]));
      expect(hooks.got).toHaveLength(alertAttempts);
      const stalled = await gw.runtime.alerts.recent(a.key, 1);
      expect(stalled[0]!.lastError).not.toContain("127.0.0.1");
    } finally {
      hooks.server.closeAllConnections();
      await gw.close();
    }
  });

  it("tells a key's coming last day once, within the days asked for, in the account's zone", async () => {
    const gw = await startGateway();
    try {
      const inDays = (n: number, zone = "Asia/Shanghai") => nextDays(dayOf(Date.now(), zone), n);
      const make = async (expires: string, expiryDays: number, zone = "Asia/Shanghai") => {
        const a = await gw.newAccount({ expires, zone });
        await gw.runtime.admin.setAlerts(a.key, { url: hooks.url, usagePercents: [], expiryDays });
        return a.key;
      };
      const soon = await make(inDays(10), 14);
      const edge = await make(inDays(14), 14);
      const later = await make(inDays(15), 14);
      const today = await make(inDays(0, "Pacific/Kiritimati"), 1, "Pacific/Kiritimati");
      const stopped = await make(inDays(3), 14);
      await gw.runtime.admin.setStatus(stopped, "stopped");
      const now = Date.now();
      expect(await gw.runtime.alerts.recordExpiring(now)).toBe(3);
      // Once per last day: asked again a minute later, unless that minute starts a new day in one of the zones
      // (then a key one day further out is rightly told), and then at the same moment.
      const sameDay = (zone: string) => dayOf(now + 60_000, zone) === dayOf(now, zone);
      expect(await gw.runtime.alerts.recordExpiring(sameDay("Asia/Shanghai") && sameDay("Pacific/Kiritimati") ? now + 60_000 : now)).toBe(0);
      const told = async (key: string) => (await gw.runtime.alerts.recent(key, 5)).map((r) => [r.kind, r.day, Number(r.level), Number(r.value)]);
      expect(await told(soon)).toEqual([["expiry", inDays(10), 14, 10]]);
      expect(await told(edge)).toEqual([["expiry", inDays(14), 14, 14]]);
      expect(await told(later)).toEqual([]);
      expect(await told(today)).toEqual([["expiry", inDays(0, "Pacific/Kiritimati"), 1, 0]]);
      expect(await told(stopped)).toEqual([]);
      // Delivered as the receiver reads it.
      const deliveries = new AlertDeliveries(gw.runtime.alerts, { now: () => now, expiryEveryMs: Infinity });
      expect(await deliveries.poll()).toBe(3);
      const soonBody = hooks.got.map((d) => JSON.parse(d.body) as { type: string; account: string; data: unknown }).find((b) => b.account === soon)!;
      expect(soonBody).toMatchObject({ type: "key.expiring", data: { expires: inDays(10), daysLeft: 10 } });
      // A key given a later last day is told again when that one comes near.
      await gw.runtime.admin.setPlan(soon, { expires: inDays(12) });
      expect(await gw.runtime.alerts.recordExpiring(now)).toBe(1);
      expect((await told(soon))[0]).toEqual(["expiry", inDays(12), 14, 12]);
      // Pruned after 30 days, but an expiry alert not before its last day: one asked for 60 days ahead is told once
      // (last: the clock only moves on from here).
      const far = await make(inDays(50), 60);
      expect(await gw.runtime.alerts.recordExpiring(now)).toBe(1);
      expect(await deliveries.poll()).toBe(2); // its and the later last day's: delivered, prunable once old enough
      const month = now + 31 * 86_400_000;
      await gw.runtime.alerts.claimDue(month, 100, 1000); // settles nothing due; prunes
      expect(await gw.runtime.alerts.recordExpiring(month)).toBe(0);
      expect(await told(far)).toEqual([["expiry", inDays(50), 60, 50]]);
    } finally {
      await gw.close();
    }
  });

  it("says when a receiver did not answer in time, and when the account's alerts were turned off meanwhile", async () => {
    const gw = await startGateway();
    try {
      const a = await gw.newAccount({ dailyMax: 2 });
      await gw.runtime.admin.setAlerts(a.key, { url: `${hooks.url}/x`, usagePercents: [50, 100] });
      hooks.answer = () => "never";
      for (let i = 0; i < 2; i++) await legacyGet(gw.base, "/retail/item_get/", { key: a.key, secret: a.secret, num_iid: demo.retailNumIid });
      let now = Date.now();
      const deliveries = new AlertDeliveries(gw.runtime.alerts, { now: () => now, timeoutMs: 200 });
      expect(await deliveries.poll()).toBe(2);
      expect((await gw.runtime.alerts.recent(a.key, 2)).map((r) => r.lastError)).toEqual(["no answer within 200 ms", "no answer within 200 ms"]);
      await gw.runtime.admin.setAlerts(a.key, null);
      now += 60_000;
      expect(await deliveries.poll()).toBe(2);
      expect((await gw.runtime.alerts.recent(a.key, 2)).map((r) => [r.lastError, r.nextAt])).toEqual([
        ["the account's alerts were turned off", undefined],
        ["the account's alerts were turned off", undefined],
      ]);
      expect(hooks.got).toHaveLength(2); // nothing sent once they were off
    } finally {
      hooks.server.closeAllConnections();
      await gw.close();
    }
  });

  it("takes a receiver that answers with a body that never ends, or cuts the connection, without harm", async () => {
    const gw = await startGateway();
    const hostile = createServer((req, res) => {
      req.resume();
      req.on("end", () => {
        if (req.url === "/cut") return req.socket.destroy();
        res.writeHead(200, { "content-type": "text/plain" });
        const chunk = Buffer.alloc(16_384, 120);
        const more = () => {
          while (res.write(chunk));
        };
        res.on("drain", more);
        more();
      });
    });
    await new Promise<void>((resolve) => hostile.listen(0, "127.0.0.1", resolve));
    try {
      const base = `http://127.0.0.1:${(hostile.address() as { port: number }).port}`;
      const endless = await gw.newAccount({ dailyMax: 1 });
      const cut = await gw.newAccount({ dailyMax: 1 });
      await gw.runtime.admin.setAlerts(endless.key, { url: `${base}/endless`, usagePercents: [100] });
      await gw.runtime.admin.setAlerts(cut.key, { url: `${base}/cut`, usagePercents: [100] });
      for (const a of [endless, cut]) await legacyGet(gw.base, "/retail/item_get/", { key: a.key, secret: a.secret, num_iid: demo.retailNumIid });
      const deliveries = new AlertDeliveries(gw.runtime.alerts, { timeoutMs: 2000 });
      expect(await deliveries.poll()).toBe(2);
      const [e] = await gw.runtime.alerts.recent(endless.key, 1);
      const [c] = await gw.runtime.alerts.recent(cut.key, 1);
      expect(e!.deliveredAt).toBeDefined(); // a 200 is an answer; what follows it is read up to 64 KiB and dropped
      expect([c!.deliveredAt, c!.lastError]).toEqual([undefined, expect.stringMatching(/^the connection failed/)]);
      await deliveries.stop();
    } finally {
      hostile.closeAllConnections();
      await new Promise((r) => hostile.close(r));
      await gw.close();
    }
  });

  it("sends a backlog at once, a full batch after another, not a batch a second", async () => {
    const gw = await startGateway();
    try {
      const accounts = await Promise.all(Array.from({ length: 40 }, () => gw.newAccount({ dailyMax: 1 })));
      for (const a of accounts) await gw.runtime.admin.setAlerts(a.key, { url: hooks.url, usagePercents: [100] });
      await Promise.all(accounts.map((a) => legacyGet(gw.base, "/retail/item_get/", { key: a.key, secret: a.secret, num_iid: demo.retailNumIid })));
      // Looked for once a minute, 16 at a time: 40 would take three minutes if each batch waited for the next look.
      const deliveries = new AlertDeliveries(gw.runtime.alerts, { intervalMs: 60_000, batch: 16 });
      const started = Date.now();
      deliveries.start();
      await until(() => (hooks.got.length >= 40 ? true : undefined), 20_000);
      expect(Date.now() - started).toBeLessThan(20_000);
      expect(new Set(hooks.got.map((d) => d.headers["gateway-alert-id"])).size).toBe(40);
      await deliveries.stop();
    } finally {
      await gw.close();
    }
  });

  it("sends alerts only to the hosts an operator lists (GATEWAY_ALERT_HOSTS), refusing others when set and giving up on those set before", async () => {
    expect(alertHostAllowed("https://hooks.example.com/x", [".example.com"])).toBe(true);
    expect(alertHostAllowed("https://example.com/x", [".example.com"])).toBe(true);
    expect(alertHostAllowed("https://HOOKS.Example.com/x", [".example.com"])).toBe(true);
    expect(alertHostAllowed("https://evilexample.com/x", [".example.com"])).toBe(false);
    expect(alertHostAllowed("https://example.com.evil.net/x", [".example.com"])).toBe(false);
    expect(alertHostAllowed("http://[::1]:8080/x", ["::1"])).toBe(true);
    expect(alertHostAllowed("http://10.0.0.7/x", ["10.0.0.70"])).toBe(false);
    expect(alertHostAllowed("http://10.0.0.7/x", [])).toBe(true);
    const dataDir = mkdtempSync(join(tmpdir(), "gateway-alert-hosts-"));
    dirs.push(dataDir);
    // Set before the operator listed hosts: an internal address.
    const before = await startGateway({ dataDir });
    const early = await before.newAccount({ dailyMax: 1 });
    await before.runtime.admin.setAlerts(early.key, { url: "http://10.255.255.1:9/internal", usagePercents: [100] });
    await before.close();
    const gw = await startGateway({ dataDir, config: { alertHosts: "127.0.0.1, .example.com" } });
    try {
      const a = await gw.newAccount({ dailyMax: 1 });
      const c = createClient(AdminService, createConnectTransport({ baseUrl: gw.base, httpVersion: "1.1" }));
      const refused = await c.setAlerts({ key: a.key, alerts: { url: "http://10.255.255.1:9/x", usagePercents: [100] } }, ok).then(() => undefined, ConnectError.from);
      expect([refused?.code, refused?.rawMessage]).toEqual([Code.InvalidArgument, "the alert URL's host is not one this gateway sends alerts to (GATEWAY_ALERT_HOSTS)"]);
      await c.setAlerts({ key: a.key, alerts: { url: "https://hooks.example.com/x", usagePercents: [100] } }, ok);
      await c.setAlerts({ key: a.key, alerts: { url: hooks.url, usagePercents: [100] } }, ok);
      expect((await c.testAlerts({ key: a.key }, ok)).delivered).toBe(true);
      // The early account's test and its real alert are refused here, before any connection: nothing is sent to 10.255.255.1.
      expect(await c.testAlerts({ key: early.key }, ok)).toMatchObject({ delivered: false, status: 0, error: "the alert URL's host is not one this gateway sends alerts to (GATEWAY_ALERT_HOSTS)", elapsedMs: 0 });
      await legacyGet(gw.base, "/retail/item_get/", { key: early.key, secret: early.secret, num_iid: demo.retailNumIid });
      const sender = new AlertSender(5000, ["127.0.0.1", ".example.com"]);
      const deliveries = new AlertDeliveries(gw.runtime.alerts, {}, sender);
      expect(await deliveries.poll()).toBe(1);
      const [given] = await gw.runtime.alerts.recent(early.key, 1);
      expect([given!.attempts, given!.nextAt, given!.deliveredAt, given!.lastError]).toEqual([1, undefined, undefined, "the alert URL's host is not one this gateway sends alerts to (GATEWAY_ALERT_HOSTS)"]);
      await deliveries.stop();
      await sender.close();
    } finally {
      await gw.close();
    }
  });

  it("keeps what it has not delivered through a restart, and delivers it then", async () => {
    const dataDir = mkdtempSync(join(tmpdir(), "gateway-alerts-"));
    dirs.push(dataDir);
    const first = await startGateway({ dataDir }); // delivers nothing
    const a = await first.newAccount({ dailyMax: 2 });
    await first.runtime.admin.setAlerts(a.key, { url: hooks.url, usagePercents: [100] });
    for (let i = 0; i < 2; i++) await legacyGet(first.base, "/retail/item_get/", { key: a.key, secret: a.secret, num_iid: demo.retailNumIid });
    await first.close();
    expect(hooks.got).toHaveLength(0);
    const second = await startGateway({ dataDir, deliverAlerts: { intervalMs: 50 } });
    try {
      await until(() => (hooks.got.length > 0 ? true : undefined));
      expect(JSON.parse(hooks.got[0]!.body)).toMatchObject({ type: "usage.threshold", account: a.key, data: { percent: 100, calls: 2, dailyMax: 2 } });
    } finally {
      await second.close();
    }
  });

  it("is set, shown and turned off from the CLI, which prints the secret once", async () => {
    const gw = await startGateway();
    try {
      const a = await gw.newAccount({});
      const env = { GATEWAY_DATA_DIR: gw.config.dataDir };
      const set = await runCli(["accounts", "alerts", a.key, "--url", `${hooks.url}/h?k=v`, "--balance-below", "2.5"], env);
      expect(set.code).toBe(0);
      expect(set.stdout).toContain(`${a.key}: alerts to ${hooks.url}/…; at 80%,100%; balance below 2.5`);
      expect(set.stdout).toMatch(/alert secret: whsec_\S{43}/);
      const again = await runCli(["accounts", "alerts", a.key, "--at", "90", "--expiry-days", "30"], env);
      expect(again.stdout).toContain(`alerts to ${hooks.url}/…; at 90%; balance below 2.5; key expiry 30 days before`);
      expect(again.stdout).not.toContain("whsec_");
      const listed = (JSON.parse((await runCli(["accounts", "list", "--json"], env)).stdout) as { key: string; alerts: string }[]).find((x) => x.key === a.key)!;
      expect(listed.alerts).toBe(`${hooks.url}/…; at 90%; balance below 2.5; key expiry 30 days before`);
      const tested = await runCli(["accounts", "alerts", a.key, "--test"], env);
      expect([tested.code, tested.stdout]).toEqual([0, expect.stringMatching(/^alert-test-[0-9a-f]{12}: delivered \(HTTP 204, \d+ ms\)\n$/)]);
      hooks.answer = () => 500;
      const refused = await runCli(["accounts", "alerts", a.key, "--test"], env);
      expect([refused.code, refused.stdout]).toEqual([1, expect.stringMatching(/not delivered: answered HTTP 500/)]);
      // A new secret keeping the old one a day: printed once, with until when the old one signs too.
      const rolled = await runCli(["accounts", "alerts", a.key, "--new-secret", "--keep-old", "24h", "--json"], env);
      const r = JSON.parse(rolled.stdout) as { secret: string; oldSecretUntil: string };
      expect(r.secret).toMatch(/^whsec_/);
      expect(Date.parse(r.oldSecretUntil) - Date.now()).toBeGreaterThan(86_300_000);
      const keepAlone = await runCli(["accounts", "alerts", a.key, "--keep-old", "1h"], env);
      expect([keepAlone.code, keepAlone.stderr]).toEqual([2, expect.stringMatching(/needs a new one/)]);
      const off = await runCli(["accounts", "alerts", a.key, "--off"], env);
      expect(off.stdout).toContain(`${a.key}: no alerts`);
      const bad = await runCli(["accounts", "alerts", a.key, "--at", "80"], env);
      expect(bad.code).not.toBe(0);
      expect(bad.stderr).toMatch(/give --url/);
    } finally {
      await gw.close();
    }
    // Ten CLI processes, each starting Node and the gateway's code: 16-18 s alone, past 30 s in a clean clone's CI
    // beside the other test files on two cores.
  }, 90_000);
});

describe("the shared store's alerts", () => {
  let db: Awaited<ReturnType<typeof freshDatabase>>;
  const pools: pg.Pool[] = [];
  const meters: PostgresMeter[] = [];
  beforeAll(async () => {
    db = await freshDatabase("alerts");
    for (let i = 0; i < 2; i++) pools.push(openPostgres(db.url, { max: 8 }));
    await migrateSchema(pools[0]!);
  });
  afterAll(async () => {
    for (const m of meters) m.close();
    await Promise.all(pools.map((p) => p.end()));
    await db?.drop();
  });

  it("records each line once when two replicas' commits move one count at once, and hands each alert to one replica at a time", async () => {
    const meter = new PostgresMeter(pools[0]!);
    meters.push(meter);
    const admin = new AccountAdmin(new PostgresAccountStore(pools[0]!), meter, systemClock, operations);
    const { account } = await admin.create({ dailyMax: 200 });
    await admin.setAlerts(account.key, { url: "https://hooks.example.com/x", usagePercents: [10, 25, 50, 75, 100] });
    // 200 commits of one call each, from both "replicas" at once, as the meter's commit moves the count.
    await Promise.all(
      Array.from({ length: 200 }, (_, i) =>
        pools[i % 2]!.query("INSERT INTO usage_daily (account, day, charged) VALUES ($1, '2026-11-27', 1) ON CONFLICT (account, day) DO UPDATE SET charged = usage_daily.charged + excluded.charged", [account.key]),
      ),
    );
    const rows = (await pools[0]!.query("SELECT level::int AS level, value::int AS value FROM alerts WHERE account = $1 ORDER BY level", [account.key])).rows;
    // Each line exactly once, by the commit that reached it: one call a commit, so the count it left is the line.
    expect(rows).toEqual([10, 25, 50, 75, 100].map((p) => ({ level: p, value: 2 * p })));
    // Both replicas claim at once: between them every alert, none twice.
    const [r1, r2] = pools.map((p) => new PostgresAlertOutbox(p));
    const now = Date.now() + 1000;
    const [c1, c2] = await Promise.all([r1!.claimDue(now, 3, 2000), r2!.claimDue(now, 3, 2000)]);
    const ids = [...c1, ...c2].map((a) => a.id);
    expect(ids).toHaveLength(5);
    expect(new Set(ids).size).toBe(5);
    for (const a of [...c1, ...c2]) expect([a.url, a.attempts, a.secret.startsWith("whsec_")]).toEqual(["https://hooks.example.com/x", 1, true]);
    // Claimed, they are no one else's until the claim lapses on PostgreSQL's clock (a replica that died mid-attempt),
    // even for a replica whose clock runs a minute ahead: then another takes them.
    expect(await r1!.claimDue(now + 60_000, 10, 30_000)).toEqual([]);
    await new Promise((r) => setTimeout(r, 2100));
    const again = await r2!.claimDue(now + 31_000, 10, 30_000);
    expect(again.map((a) => [a.id, a.attempts]).sort()).toEqual(ids.sort().map((id) => [id, 2]));
    // Settled: delivered is done; failed waits for its time.
    await r1!.settle(again[0]!.id, { delivered: true }, now + 31_500, undefined);
    for (const a of again.slice(1)) await r2!.settle(a.id, { delivered: false, error: "answered HTTP 500" }, now + 31_500, now + 60_000);
    expect(await r1!.claimDue(now + 59_000, 10, 30_000)).toEqual([]);
    expect((await r1!.claimDue(now + 60_000, 10, 30_000)).map((a) => a.id).sort()).toEqual(again.slice(1).map((a) => a.id).sort());
    const recent = await r1!.recent(account.key, 10);
    expect(recent.filter((a) => a.deliveredAt !== undefined).map((a) => a.id)).toEqual([again[0]!.id]);
  });

  it("records a key's coming last day once when every replica looks at once", async () => {
    const meter = new PostgresMeter(pools[0]!);
    meters.push(meter);
    const admin = new AccountAdmin(new PostgresAccountStore(pools[0]!), meter, systemClock, operations);
    const expires = nextDays(dayOf(Date.now(), "Asia/Shanghai"), 5);
    const { account } = await admin.create({ expires });
    await admin.setAlerts(account.key, { url: "https://hooks.example.com/x", usagePercents: [], expiryDays: 7 });
    const outboxes = [...pools, ...pools].map((p) => new PostgresAlertOutbox(p));
    const recorded = await Promise.all(outboxes.map((o) => o.recordExpiring(Date.now())));
    expect(recorded.reduce((a, b) => a + b, 0)).toBe(1);
    const rows = (await pools[0]!.query("SELECT kind, day, level::int AS level, value::int AS value FROM alerts WHERE account = $1", [account.key])).rows;
    expect(rows).toEqual([{ kind: "expiry", day: expires, level: 7, value: 5 }]);
    // Delivered, and a month later pruned only once its last day has passed: not recorded again meanwhile.
    const [due] = (await outboxes[0]!.claimDue(Date.now() + 1000, 100, 1000)).filter((a) => a.account === account.key);
    await outboxes[0]!.settle(due!.id, { delivered: true }, Date.now(), undefined);
    const fresh = new PostgresAlertOutbox(pools[1]!); // prunes on its first claim
    await fresh.claimDue(Date.now() + 31 * 86_400_000, 100, 1000);
    expect((await pools[0]!.query("SELECT count(*)::int AS n FROM alerts WHERE account = $1", [account.key])).rows[0].n).toBe(0); // its day passed: pruned
    const later = nextDays(dayOf(Date.now(), "Asia/Shanghai"), 40);
    await admin.setPlan(account.key, { expires: later });
    await admin.setAlerts(account.key, { url: "https://hooks.example.com/x", usagePercents: [], expiryDays: 60 });
    expect(await fresh.recordExpiring(Date.now())).toBe(1);
    const [next] = (await fresh.claimDue(Date.now() + 1000, 100, 1000)).filter((a) => a.account === account.key);
    await fresh.settle(next!.id, { delivered: true }, Date.now(), undefined);
    await new PostgresAlertOutbox(pools[1]!).claimDue(Date.now() + 31 * 86_400_000, 100, 1000);
    expect(await fresh.recordExpiring(Date.now() + 31 * 86_400_000)).toBe(0); // kept until its last day: told once
  });

  it("tells a balance floor crossed by a commit's deduction, and not one a top-up raised the balance past", async () => {
    const meter = new PostgresMeter(pools[1]!);
    meters.push(meter);
    const admin = new AccountAdmin(new PostgresAccountStore(pools[1]!), meter, systemClock, operations);
    const { account } = await admin.create({ balance: 1_000_000n });
    await admin.setAlerts(account.key, { url: "https://hooks.example.com/x", usagePercents: [], balanceBelow: 500_000n });
    const deduct = (n: bigint) => pools[1]!.query("UPDATE balances SET micros = micros - $1 WHERE account = $2", [n.toString(), account.key]);
    await deduct(400_000n); // 0.6
    await deduct(200_000n); // 0.4: below
    await deduct(100_000n); // 0.3: still below
    await admin.topUp(account.key, 1_000_000n); // 1.3
    await deduct(900_000n); // 0.4: below again
    const rows = (await pools[1]!.query("SELECT kind, level::text AS level, value::text AS value FROM alerts WHERE account = $1 ORDER BY id", [account.key])).rows;
    expect(rows).toEqual([
      { kind: "balance", level: "500000", value: "400000" },
      { kind: "balance", level: "500000", value: "400000" },
    ]);
    // A new alert secret keeping the old one: the shared store's claim hands both to the deliverer.
    const { secret: made } = await admin.setAlerts(account.key, { url: "https://hooks.example.com/x", usagePercents: [], balanceBelow: 500_000n }, { newSecret: true, keepOldMs: 60_000 });
    const claimed = (await new PostgresAlertOutbox(pools[0]!).claimDue(Date.now(), 100, 30_000)).filter((d) => d.account === account.key);
    expect(claimed).toHaveLength(2);
    for (const d of claimed) expect([d.secret, d.previousSecrets?.length, d.previousSecrets![0]!.secret.startsWith("whsec_"), d.previousSecrets![0]!.until > Date.now()]).toEqual([made, 1, true, true]);
  });
});
