import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { toJsonString } from "@bufbuild/protobuf";
import { AccountEventKind, AccountStatus, AdminService, BalanceChangeKind, GetAccountHistoryResponseSchema, OperationState } from "../src/gen/gateway/admin/v1/admin_pb.js";
import { Charge } from "../src/gen/gateway/catalogue/v1/status_pb.js";
import { ErrorCode } from "../src/gen/gateway/catalogue/v1/status_pb.js";
import { adminToken, demo, legacyGet, startGateway, type GatewayFixture } from "./support/gateway-fixture.ts";
import { runCli } from "./support/cli.ts";
import { createHash } from "node:crypto";
import { join } from "node:path";
import { DatabaseSync } from "node:sqlite";

let gw: GatewayFixture;
beforeAll(async () => {
  gw = await startGateway();
});
afterAll(() => gw.close());

const admin = (grpc = false) =>
  createClient(AdminService, grpc ? createGrpcTransport({ baseUrl: gw.base }) : createConnectTransport({ baseUrl: gw.base, httpVersion: "1.1" }));
const headers = (token: string) => ({ headers: { authorization: `Bearer ${token}` } });
const ok = headers(adminToken);

describe("admin authentication", () => {
  it.each([
    ["no token", {}],
    ["a wrong token", headers("not-the-admin-token")],
    ["an account key", headers("")],
    ["a token without Bearer", { headers: { authorization: adminToken } }],
  ])("refuses %s with Unauthenticated", async (name, options) => {
    const opts = name === "an account key" ? headers(gw.account.key) : options;
    const err = await admin().listAccounts({}, opts).then(() => undefined, ConnectError.from);
    expect(err?.code).toBe(Code.Unauthenticated);
  });

  it("is off when no token is configured", async () => {
    const { buildApp } = await import("../src/transports/server/app.ts");
    const app = await buildApp({ gateway: gw.runtime.gateway, logLevel: false, admin: { ports: gw.runtime, token: "" } });
    await app.listen({ host: "127.0.0.1", port: 0 });
    try {
      const client = createClient(AdminService, createConnectTransport({ baseUrl: `http://127.0.0.1:${(app.server.address() as { port: number }).port}`, httpVersion: "1.1" }));
      const err = await client.listAccounts({}, headers("")).then(() => undefined, ConnectError.from);
      expect(err?.code).toBe(Code.Unauthenticated);
      expect(err?.rawMessage).toContain("GATEWAY_ADMIN_TOKEN");
    } finally {
      await app.close();
    }
  });
});

describe("managing accounts over the AdminService", () => {
  it("sets, changes and removes an account's rate limit, which the next call meets", async () => {
    const c = admin(true);
    const created = await c.createAccount({ name: "rated", rate: { calls: 1, seconds: 60 } }, ok);
    const key = created.account!.key;
    // A burst of 0 is as many as the rate's calls.
    expect(created.account!.rate).toMatchObject({ calls: 1, seconds: 60, burst: 1 });
    const call = () => legacyGet(gw.base, "/retail/item_get/", { key, secret: created.secret, num_iid: demo.retailNumIid }).then((r) => [r.json.error_code, r.json.reason]);
    expect((await call())[0]).toBe("0000");
    expect(await call()).toEqual(["4008", expect.stringMatching(/^this account's rate limit of 1\/min is reached; the next call is admitted in \d+ ms$/)]);
    // The burst alone: two more places at once.
    expect((await c.setPlan({ key, burst: 3 }, ok)).account!.rate).toMatchObject({ calls: 1, seconds: 60, burst: 3 });
    expect([(await call())[0], (await call())[0], (await call())[0]]).toEqual(["0000", "0000", "4008"]);
    // Removed with calls 0; a plan change that names no rate leaves it as it is.
    expect((await c.setPlan({ key, rate: { calls: 0 } }, ok)).account!.rate).toBeUndefined();
    expect((await call())[0]).toBe("0000");
    expect((await c.setPlan({ key, rate: { calls: 5, seconds: 1, burst: 2 } }, ok)).account!.rate).toMatchObject({ calls: 5, seconds: 1, burst: 2 });
    expect((await c.setPlan({ key, dailyMax: 500n }, ok)).account!.rate).toMatchObject({ calls: 5, seconds: 1, burst: 2 });
    const refused = async (request: Parameters<typeof c.setPlan>[0]) => (await c.setPlan(request, ok).then(() => undefined, ConnectError.from))!;
    for (const [request, message] of [
      [{ key, rate: { calls: 5, seconds: 86_400 } }, "a rate's period must be a second, a minute or an hour (1, 60 or 3600 s)"],
      [{ key, rate: { calls: -1, seconds: 1 } }, "a rate's calls must be a whole number from 1 to 1000000000"],
    ] as const) {
      const e = await refused(request);
      expect([e.code, e.rawMessage]).toEqual([Code.InvalidArgument, message]);
    }
    const unrated = await c.createAccount({ name: "unrated" }, ok);
    const e = await refused({ key: unrated.account!.key, burst: 2 });
    expect([e.code, e.rawMessage]).toEqual([Code.InvalidArgument, "a burst needs a rate: this account has none"]);
    const events = (await c.getAccountHistory({ key }, ok)).events.filter((x) => x.kind === AccountEventKind.PLAN).map((x) => x.changes.map((f) => `${f.field}: ${f.before} -> ${f.after}`));
    expect(events).toEqual([["rate: 1/min -> 1/min, burst 3"], ["rate: 1/min, burst 3 -> "], ["rate:  -> 5/s, burst 2"], ["dailyMax: 10000 -> 500"]]);
  });

  it("creates, reads, switches and bills an account, on Connect and gRPC alike", async () => {
    const c = admin();
    const created = await c.createAccount(
      { name: "team-a", dailyMax: 5n, concurrency: 2, balance: "1.5", expires: "2030-12-31", zone: "Europe/Berlin", prices: { "retail/item_get": "0.25" } },
      ok,
    );
    const key = created.account!.key;
    expect(created.secret).toHaveLength(40);
    expect(created.account).toMatchObject({ name: "team-a", dailyMax: 5n, concurrency: 2, balance: "1.5", expires: "2030-12-31", zone: "Europe/Berlin", status: AccountStatus.ACTIVE });
    expect(created.account!.prices).toEqual({ "retail/item_get": "0.25" });
    expect(created.account!.operations).toEqual({ "retail/item_get": OperationState.ENABLED, "wholesale/item_search_peerbuy": OperationState.ENABLED, "wholesale/item_get": OperationState.ENABLED });

    const call = () => legacyGet(gw.base, "/retail/item_get/", { key, secret: created.secret, num_iid: demo.retailNumIid }).then((r) => r.json);
    expect((await call()).error_code).toBe("0000");
    expect((await c.getAccount({ key }, ok)).account!.balance).toBe("1.25");

    const g = admin(true);
    expect((await g.stopAccount({ key }, ok)).account!.status).toBe(AccountStatus.STOPPED);
    expect((await call()).error_code).toBe("4007");
    await g.resumeAccount({ key }, ok);
    await c.setOperation({ key, operation: "retail/item_get", state: OperationState.STOPPED }, ok);
    expect((await call()).error_code).toBe("4006");
    await c.setOperation({ key, operation: "retail/item_get", state: OperationState.REMOVED }, ok);
    expect((await call()).error_code).toBe("4012");
    await c.setOperation({ key, operation: "retail/item_get", state: OperationState.ENABLED }, ok);

    await c.setPrice({ key, operation: "retail/item_get", price: "2" }, ok);
    expect((await call()).error_code).toBe("4016");
    expect((await c.topUp({ key, amount: "0.75" }, ok)).account!.balance).toBe("2");
    expect((await call()).error_code).toBe("0000");
    expect((await c.getAccount({ key }, ok)).account!.balance).toBe("0");
    // The balance accounted for: 1.5 opened, 0.25 taken, 0.75 added, 2 taken since.
    const statement = await c.getBalanceStatement({ key }, ok);
    expect(statement.account!.balance).toBe("0");
    expect(statement.changes.map(({ kind, amount, balance, takenBefore }) => ({ kind, amount, balance, takenBefore }))).toEqual([
      { kind: BalanceChangeKind.OPENING, amount: "1.5", balance: "1.5", takenBefore: "0" },
      { kind: BalanceChangeKind.TOP_UP, amount: "0.75", balance: "2", takenBefore: "0.25" },
    ]);
    expect(statement.changes[0]!.atMs).toBe(created.account!.createdAtMs);
    expect(statement.takenSinceLast).toBe("2");
    expect((await c.getBalanceStatement({ key: "nosuchkey" }, ok).then(() => undefined, ConnectError.from))?.code).toBe(Code.NotFound);

    await c.setPlan({ key, dailyMax: 2n }, ok);
    expect((await call()).error_code).toBe("4013");
    await c.setPlan({ key, dailyMax: 100n, expires: "2020-01-01" }, ok);
    expect((await call()).error_code).toBe("4005");

    expect((await c.listAccounts({}, ok)).accounts.some((a) => a.key === key)).toBe(true);

    // A rotation that keeps the old secret an hour: both work, and the account says until when.
    await c.setPlan({ key, dailyMax: 100n, expires: "2099-01-01" }, ok);
    const rotated = await c.rotateSecret({ key, keepOldSeconds: 3600 }, ok);
    const until = Number(rotated.account!.oldSecretUntilMs);
    expect(Math.abs(until - (Date.now() + 3_600_000))).toBeLessThan(60_000);
    const withSecret = (secret: string) => legacyGet(gw.base, "/retail/item_get/", { key, secret, num_iid: demo.retailNumIid }).then((r) => r.json.error_code);
    expect([await withSecret(created.secret), await withSecret(rotated.secret)]).toEqual(["4016", "4016"]); // known, and out of balance
    expect((await c.getAccount({ key }, ok)).account!.oldSecretUntilMs).toBe(rotated.account!.oldSecretUntilMs);
    expect((await c.rotateSecret({ key, keepOldSeconds: 31 * 86_400 }, ok).then(() => undefined, ConnectError.from))?.code).toBe(Code.InvalidArgument);
    // Without a grace: the old one stops at once, and the account keeps none.
    const again = await c.rotateSecret({ key }, ok);
    expect(again.account!.oldSecretUntilMs).toBeUndefined();
    expect([await withSecret(rotated.secret), await withSecret(again.secret)]).toEqual(["4005", "4016"]);

    // Everything above, as the account's history: each change by the admin API's caller, with what it moved.
    const history = await g.getAccountHistory({ key }, ok);
    expect(history.account!.key).toBe(key);
    expect(history.events.map((e) => AccountEventKind[e.kind])).toEqual([
      "CREATED", "OPENING", "STATUS", "STATUS", "OPERATION", "OPERATION", "OPERATION", "PRICE", "TOP_UP", "PLAN", "PLAN", "PLAN", "SECRET", "SECRET",
    ]);
    expect(history.events.every((e) => e.by === "admin-api 127.0.0.1")).toBe(true);
    expect(history.events[0]!.atMs).toBe(created.account!.createdAtMs);
    const moved = (i: number) => history.events[i]!.changes.map(({ field, before, after }) => [field, before, after]);
    expect(moved(0)).toContainEqual(["prices[retail/item_get]", "", "0.25"]);
    expect(moved(4)).toEqual([["operations[retail/item_get]", "enabled", "stopped"]]);
    expect(moved(5)).toEqual([["operations[retail/item_get]", "stopped", ""]]);
    expect(moved(7)).toEqual([["prices[retail/item_get]", "0.25", "2"]]);
    expect(moved(8)).toEqual([["balance", "1.25", "2"]]);
    expect(moved(10)).toEqual([["dailyMax", "2", "100"], ["expires", "2030-12-31", "2020-01-01"]]);
    expect(moved(12)).toEqual([["oldSecretUntil", "", new Date(until).toISOString()], ["secret", "", "rotated"]]);
    expect(moved(13)).toEqual([["oldSecretUntil", new Date(until).toISOString(), ""], ["secret", "", "rotated"]]);
    expect(toJsonString(GetAccountHistoryResponseSchema, history)).not.toContain(created.secret);
    expect((await c.getAccountHistory({ key: "nosuchkey" }, ok).then(() => undefined, ConnectError.from))?.code).toBe(Code.NotFound);
  });

  it("switches maintenance for everyone", async () => {
    const c = admin();
    expect((await c.setMaintenance({ operation: "item_search_peerbuy", maintenance: true }, ok)).operations).toEqual(["wholesale/item_search_peerbuy"]);
    const r = await legacyGet(gw.base, "/wholesale/item_search_peerbuy/", { key: gw.account.key, secret: gw.account.secret, num_iid: demo.wholesaleNumIid, sid: demo.wholesaleSid });
    expect(r.json.error_code).toBe("4009");
    expect((await c.setMaintenance({ operation: "item_search_peerbuy", maintenance: false }, ok)).operations).toEqual([]);
    await c.setMaintenance({ operation: "item_search_peerbuy", maintenance: false }, ok); // changes nothing: not recorded
    const { changes, operations } = await c.getMaintenanceHistory({}, ok);
    expect(operations).toEqual([]);
    expect(changes.slice(-2).map(({ operation, maintenance, by }) => ({ operation, maintenance, by }))).toEqual([
      { operation: "wholesale/item_search_peerbuy", maintenance: true, by: "admin-api 127.0.0.1" },
      { operation: "wholesale/item_search_peerbuy", maintenance: false, by: "admin-api 127.0.0.1" },
    ]);
    expect(Number(changes.at(-1)!.atMs)).toBeGreaterThan(Date.now() - 60_000);
  });

  it("queries usage by account, day, operation and code, with totals and rows", async () => {
    const c = admin();
    const { account, secret } = await c.createAccount({ name: "usage", prices: { "retail/item_get": "0.1" }, balance: "10" }, ok);
    const key = account!.key;
    for (const num_iid of [demo.retailNumIid, demo.retailNumIid, "123", "bad"]) await legacyGet(gw.base, "/retail/item_get/", { key, secret, num_iid });
    const all = await c.queryUsage({ account: key, rows: 10 }, ok);
    expect(all.calls).toBe(4n);
    expect(all.chargedCalls).toBe(3n);
    expect(all.amount).toBe("0.3");
    expect(all.rows).toHaveLength(4);
    expect(all.rows.every((r) => r.account === key && r.transport === "legacy")).toBe(true);
    // The second call of the demo item was answered from the cache, and the totals say so.
    expect(all.cacheHits).toBe(BigInt(all.rows.filter((r) => r.cacheHit).length));
    expect(all.cacheHits).toBeGreaterThanOrEqual(1n);
    const ignored = await c.queryUsage({ account: key, errorCode: ErrorCode.PARAM_ERROR }, ok);
    expect(ignored.totals).toHaveLength(1);
    expect(ignored.totals[0]).toMatchObject({ charge: Charge.IGNORED, calls: 1n, amount: "0" });
    const day = all.rows[0]!.day;
    expect((await c.queryUsage({ account: key, from: day, to: day, operation: "retail/item_get" }, ok)).calls).toBe(4n);
    expect((await c.queryUsage({ account: key, operation: "item_search_peerbuy" }, ok)).calls).toBe(0n);
  });

  it("answers NotFound for an unknown key and InvalidArgument for bad values", async () => {
    const c = admin();
    expect((await c.getAccount({ key: "nope" }, ok).then(() => undefined, ConnectError.from))?.code).toBe(Code.NotFound);
    expect((await c.topUp({ key: gw.account.key, amount: "-1" }, ok).then(() => undefined, ConnectError.from))?.code).toBe(Code.InvalidArgument);
    expect((await c.topUp({ key: gw.account.key, amount: "0.0000001" }, ok).then(() => undefined, ConnectError.from))?.code).toBe(Code.InvalidArgument);
    expect((await c.createAccount({ zone: "Mars/Base" }, ok).then(() => undefined, ConnectError.from))?.code).toBe(Code.InvalidArgument);
    expect((await c.setOperation({ key: gw.account.key, operation: "item_fly", state: OperationState.ENABLED }, ok).then(() => undefined, ConnectError.from))?.code).toBe(Code.InvalidArgument);
  });
});

describe("secrets and signing over the AdminService", () => {
  it("RotateSecret returns a new secret once; the old one stops working", async () => {
    const c = admin();
    const created = await c.createAccount({ name: "rotating" }, ok);
    const key = created.account!.key;
    const rotated = await c.rotateSecret({ key }, ok);
    expect(rotated.secret).toHaveLength(40);
    expect(rotated.secret).not.toBe(created.secret);
    expect(rotated.account?.key).toBe(key);
    const call = (secret: string) => legacyGet(gw.base, "/retail/item_get/", { key, secret, num_iid: demo.retailNumIid }).then((r) => r.json.error_code);
    expect(await call(created.secret)).toBe("4005");
    expect(await call(rotated.secret)).toBe("0000");
    const err = await c.rotateSecret({ key: "no-such-key" }, ok).then(() => undefined, ConnectError.from);
    expect(err?.code).toBe(Code.NotFound);
  });

  it("SignCall signs a legacy and an RPC call that the gateway accepts once, without the caller holding the secret", async () => {
    const c = admin();
    const key = (await c.createAccount({ name: "signed" }, ok)).account!.key;
    const params = { num_iid: demo.retailNumIid, result_type: "json" };
    const legacy = await c.signCall({ key, method: "GET", path: "/retail/item_get/", params }, ok);
    expect(legacy.signature).toMatch(/^[0-9a-f]{64}$/);
    expect(Number(legacy.timestamp)).toBeGreaterThan(Date.now() / 1000 - 60);
    const query = { key, ...params, timestamp: String(legacy.timestamp), nonceStr: legacy.nonce, signature: legacy.signature };
    expect((await legacyGet(gw.base, "/retail/item_get/", query)).json.error_code).toBe("0000");
    expect((await legacyGet(gw.base, "/retail/item_get/", query)).json.error_code).toBe("4005"); // the nonce is spent

    const rpc = await c.signCall({ key, method: "RPC", path: "/gateway.catalogue.v1.RetailService/ItemGet", params: { num_iid: demo.retailNumIid } }, ok);
    const res = await fetch(`${gw.base}/gateway.catalogue.v1.RetailService/ItemGet`, {
      method: "POST",
      headers: { "content-type": "application/json", "x-api-key": key, "x-api-timestamp": String(rpc.timestamp), "x-api-nonce": rpc.nonce, "x-api-signature": rpc.signature },
      body: JSON.stringify({ numIid: demo.retailNumIid }),
    });
    expect(res.status).toBe(200);
    const answer = (await res.json()) as { status: { errorCode?: string }; item?: unknown };
    expect(answer.status.errorCode ?? "ERROR_CODE_SUCCESS").toBe("ERROR_CODE_SUCCESS"); // the default, left out of JSON
    expect(answer.item).toBeDefined();

    // A signature covers its parameters: another item is refused.
    const other = await c.signCall({ key, method: "GET", path: "/retail/item_get/", params }, ok);
    const tampered = { key, num_iid: "600000000000", result_type: "json", timestamp: String(other.timestamp), nonceStr: other.nonce, signature: other.signature };
    expect((await legacyGet(gw.base, "/retail/item_get/", tampered)).json.error_code).toBe("4005");

    const bad = await c.signCall({ key, method: "PUT", path: "/retail/item_get/", params }, ok).then(() => undefined, ConnectError.from);
    expect(bad?.code).toBe(Code.InvalidArgument);
    const unknown = await c.signCall({ key: "no-such-key", method: "GET", path: "/retail/item_get/", params }, ok).then(() => undefined, ConnectError.from);
    expect(unknown?.code).toBe(Code.NotFound);
    const anonymous = await c.signCall({ key, method: "GET", path: "/retail/item_get/", params }).then(() => undefined, ConnectError.from);
    expect(anonymous?.code).toBe(Code.Unauthenticated);
  });
});

describe("named admins", () => {
  it("each with a token of its own: its changes are recorded under its name, and a revoked one is refused", async () => {
    const own = await startGateway();
    try {
      const client = createClient(AdminService, createConnectTransport({ baseUrl: own.base, httpVersion: "1.1" }));
      const as = (token: string) => headers(token);
      const { admin, token } = await own.runtime.admins.as("cli ops@host").add("alice");
      expect(admin).toMatchObject({ name: "alice", createdBy: "cli ops@host" });
      expect(token).toMatch(/^gwa_[A-Za-z0-9]{40}$/);
      const { account } = await client.createAccount({ name: "by-alice" }, as(token));
      await client.setPlan({ key: account!.key, dailyMax: 7n }, as(token));
      await client.setPlan({ key: account!.key, dailyMax: 8n }, ok);
      const history = await client.getAccountHistory({ key: account!.key }, ok);
      expect(history.events.map((e) => [AccountEventKind[e.kind], e.by])).toEqual([
        ["CREATED", "admin-api alice@127.0.0.1"],
        ["PLAN", "admin-api alice@127.0.0.1"],
        ["PLAN", "admin-api 127.0.0.1"],
      ]);
      // Only the token's SHA-256 is kept.
      const stored = JSON.stringify(new DatabaseSync(join(own.config.dataDir, "gateway.db"), { readOnly: true }).prepare("SELECT * FROM admin_tokens").all());
      expect(stored).not.toContain(token);
      expect(stored).toContain(createHash("sha256").update(token).digest("hex"));
      // Revoked: refused at once on this gateway, in words that say so; GATEWAY_ADMIN_TOKEN still works.
      await own.runtime.admins.as("cli ops@host").revoke("alice");
      const refused = await client.listAccounts({}, as(token)).then(() => undefined, ConnectError.from);
      expect([refused?.code, refused?.rawMessage]).toEqual([Code.Unauthenticated, "the admin token of alice was revoked"]);
      expect((await client.listAccounts({}, ok)).accounts.length).toBeGreaterThan(0);
      // A token of no admin, shaped like one, is refused as any wrong token.
      const forged = await client.listAccounts({}, as(`gwa_${"x".repeat(40)}`)).then(() => undefined, ConnectError.from);
      expect([forged?.code, forged?.rawMessage]).toEqual([Code.Unauthenticated, "the admin token is not valid"]);
      // Names are never reused, a revoked one's included; a name must be plain.
      await expect(own.runtime.admins.add("alice")).rejects.toThrow("there is already an admin named alice");
      await expect(own.runtime.admins.add("bad name")).rejects.toThrow("an admin's name is");
      await expect(own.runtime.admins.revoke("nobody")).rejects.toThrow("no admin is named nobody");
      expect((await own.runtime.admins.list()).map((a) => [a.name, a.revokedBy])).toEqual([["alice", "cli ops@host"]]);
    } finally {
      await own.close();
    }
  });

  it("turn the admin API on without GATEWAY_ADMIN_TOKEN, and it is off again when none is left", async () => {
    const own = await startGateway();
    try {
      const { buildApp } = await import("../src/transports/server/app.ts");
      const app = await buildApp({ gateway: own.runtime.gateway, logLevel: false, admin: { ports: own.runtime, token: "" } });
      await app.listen({ host: "127.0.0.1", port: 0 });
      try {
        const client = createClient(AdminService, createConnectTransport({ baseUrl: `http://127.0.0.1:${(app.server.address() as { port: number }).port}`, httpVersion: "1.1" }));
        const off = await client.listAccounts({}, headers("anything")).then(() => undefined, ConnectError.from);
        expect(off?.rawMessage).toBe("the admin API is off: set GATEWAY_ADMIN_TOKEN, or add an admin (gateway admins add NAME)");
        const { token } = await own.runtime.admins.add("bob");
        expect((await client.listAccounts({}, headers(token))).accounts.length).toBeGreaterThan(0);
        await own.runtime.admins.revoke("bob");
        await new Promise((r) => setTimeout(r, 1100)); // whether any admin is left is read at most once a second
        expect((await client.listAccounts({}, headers(token)).then(() => undefined, ConnectError.from))?.rawMessage).toContain("the admin API is off");
      } finally {
        await app.close();
      }
    } finally {
      await own.close();
    }
  });
});

describe("the CLI", () => {
  it("creates an account with --max, --concurrency, --balance and --expires, and reports usage", async () => {
    const env = { GATEWAY_DATA_DIR: gw.config.dataDir };
    const r = await runCli(["accounts", "create", "--json", "--max", "7", "--concurrency", "3", "--balance", "12.34", "--expires", "2031-01-31", "--price", "retail/item_get=0.01"], env);
    expect(r.code, r.stderr).toBe(0);
    const a = JSON.parse(r.stdout) as Record<string, unknown>;
    expect(a).toMatchObject({ max: 7, concurrency: 3, balance: "12.34", expires: "2031-01-31", prices: { "retail/item_get": "0.01" } });
    expect(typeof a.key).toBe("string");
    expect(typeof a.secret).toBe("string");

    await legacyGet(gw.base, "/retail/item_get/", { key: a.key as string, secret: a.secret as string, num_iid: demo.retailNumIid });
    const usage = await runCli(["usage", "--account", a.key as string, "--rows", "5", "--json"], env);
    const report = JSON.parse(usage.stdout) as { totals: { code: string; charge: string; calls: number; amount: string }[]; rows: unknown[] };
    expect(report.totals).toEqual([expect.objectContaining({ code: "0000", charge: "charged", calls: 1, amount: "0.01" })]);
    expect(report.rows).toHaveLength(1);

    const topUp = await runCli(["accounts", "top-up", a.key as string, "0.66"], env);
    expect(topUp.stdout).toContain('"balance":"12.99"');
    const bad = await runCli(["accounts", "create", "--balance", "lots"], env);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toContain("not an amount");
    const rotated = JSON.parse((await runCli(["accounts", "rotate-secret", a.key as string, "--json"], env)).stdout) as { key: string; secret: string };
    expect(rotated.secret).not.toBe(a.secret);
    const call = (secret: string) => legacyGet(gw.base, "/retail/item_get/", { key: a.key as string, secret, num_iid: demo.retailNumIid }).then((r) => r.json.error_code);
    let codes = [await call(rotated.secret), await call(a.secret as string)];
    for (let i = 0; i < 20 && codes[0] !== "0000"; i++) codes = [await call(rotated.secret), await call(a.secret as string)];
    expect(codes).toEqual(["0000", "4005"]);
    const maintenance = await runCli(["maintenance", "list"], env);
    expect(maintenance.stdout).toContain("under maintenance: nothing");
  });

  it("records a maintenance switch with the CLI's user and host", async () => {
    const env = { GATEWAY_DATA_DIR: gw.config.dataDir };
    expect((await runCli(["maintenance", "on", "wholesale/item_get"], env)).stdout).toContain("under maintenance: wholesale/item_get");
    await runCli(["maintenance", "off", "wholesale/item_get"], env);
    const { userInfo, hostname } = await import("node:os");
    const history = JSON.parse((await runCli(["maintenance", "history", "--json"], env)).stdout) as { operation: string; maintenance: boolean; by: string }[];
    expect(history.slice(-2).map(({ operation, maintenance, by }) => ({ operation, maintenance, by }))).toEqual([
      { operation: "wholesale/item_get", maintenance: true, by: `cli ${userInfo().username}@${hostname()}` },
      { operation: "wholesale/item_get", maintenance: false, by: `cli ${userInfo().username}@${hostname()}` },
    ]);
  });

  // Each CLI command is a process of its own (a second or more on a busy machine): the commands of one story stay in one test, a few per test.
  it("accounts for a balance: the opening balance, what calls took before the top-up, the top-up", async () => {
    const env = { GATEWAY_DATA_DIR: gw.config.dataDir };
    const a = JSON.parse((await runCli(["accounts", "create", "--json", "--balance", "12.34", "--price", "retail/item_get=0.01"], env)).stdout) as { key: string; secret: string };
    expect((await legacyGet(gw.base, "/retail/item_get/", { key: a.key, secret: a.secret, num_iid: demo.retailNumIid })).json.error_code).toBe("0000");
    expect((await runCli(["accounts", "top-up", a.key, "0.66"], env)).stdout).toContain('"balance":"12.99"');
    const statement = JSON.parse((await runCli(["accounts", "statement", a.key, "--json"], env)).stdout) as { balance: string; changes: Record<string, unknown>[]; takenSinceLast: string };
    expect(statement).toMatchObject({ balance: "12.99", takenSinceLast: "0" });
    expect(statement.changes.map(({ kind, amount, balance, takenBefore }) => ({ kind, amount, balance, takenBefore }))).toEqual([
      { kind: "opening", amount: "12.34", balance: "12.34", takenBefore: "0" },
      { kind: "top-up", amount: "0.66", balance: "12.99", takenBefore: "0.01" },
    ]);
    expect(statement.changes[0]!.at).toMatch(/^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}$/);
    const text = await runCli(["accounts", "statement", a.key], env);
    expect(text.stdout).toMatch(/calls took 0\.01\n.*top-up +\+0\.66 +balance 12\.99/);
  });

  it("rotates a secret keeping the old one a while, and refuses a duration it cannot read", async () => {
    const env = { GATEWAY_DATA_DIR: gw.config.dataDir };
    const a = await gw.newAccount({});
    const call = (secret: string) => legacyGet(gw.base, "/retail/item_get/", { key: a.key, secret, num_iid: demo.retailNumIid }).then((r) => r.json.error_code);
    const kept = JSON.parse((await runCli(["accounts", "rotate-secret", a.key, "--keep-old", "2h", "--json"], env)).stdout) as { secret: string; oldSecretUntil: string };
    expect(Math.abs(Date.parse(kept.oldSecretUntil) - (Date.now() + 7_200_000))).toBeLessThan(60_000);
    let codes = [await call(kept.secret), await call(a.secret)];
    for (let i = 0; i < 20 && codes[0] !== "0000"; i++) codes = [await call(kept.secret), await call(a.secret)];
    expect(codes).toEqual(["0000", "0000"]);
    const rotatedText = await runCli(["accounts", "rotate-secret", a.key, "--keep-old", "30m"], env);
    expect(rotatedText.stdout).toMatch(/the old secret still works until \d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2} /);
    const badDuration = await runCli(["accounts", "rotate-secret", a.key, "--keep-old", "5x"], env);
    expect({ code: badDuration.code, stderr: badDuration.stderr.trim() }).toEqual({ code: 2, stderr: '--keep-old takes a duration such as 90s, 30m, 24h or 7d, not "5x"' });
    expect((await runCli(["accounts", "statement", "nosuchkey"], env)).code).toBe(2);
  });

  it("adds, lists and revokes named admins; a token added or revoked applies to the running gateway", async () => {
    const env = { GATEWAY_DATA_DIR: gw.config.dataDir };
    const { userInfo, hostname } = await import("node:os");
    const me = `cli ${userInfo().username}@${hostname()}`;
    const added = JSON.parse((await runCli(["admins", "add", "carol", "--json"], env)).stdout) as { name: string; token: string; createdBy: string };
    expect(added).toMatchObject({ name: "carol", createdBy: me });
    const c = admin();
    const carol = async () => c.listAccounts({}, headers(added.token)).then(() => "ok", (e: unknown) => ConnectError.from(e).rawMessage);
    let seen = await carol();
    for (let i = 0; i < 20 && seen !== "ok"; i++) seen = await new Promise((r) => setTimeout(r, 100)).then(carol);
    expect(seen).toBe("ok");
    // WhoAmI: who each token is, and how its changes are recorded.
    expect(await c.whoAmI({}, headers(added.token))).toMatchObject({ name: "carol", actor: "admin-api carol@127.0.0.1", address: "127.0.0.1" });
    expect(await admin(true).whoAmI({}, ok)).toMatchObject({ name: "", actor: "admin-api 127.0.0.1", address: "127.0.0.1" });
    expect(ConnectError.from(await c.whoAmI({}, headers("wrong")).catch((e: unknown) => e)).code).toBe(Code.Unauthenticated);
    const listed = await runCli(["admins", "list"], env);
    expect(listed.stdout).toMatch(new RegExp(`^carol +added \\d{4}-\\d\\d-\\d\\d \\d\\d:\\d\\d:\\d\\d by ${me.replace(/[.]/g, "\\.")}$`, "m"));
    expect(listed.stdout).not.toContain(added.token);
    const again = await runCli(["admins", "add", "carol"], env);
    expect({ code: again.code, stderr: again.stderr.trim() }).toEqual({ code: 2, stderr: "there is already an admin named carol (names are never reused, a revoked one's included)" });
    expect((await runCli(["admins", "revoke", "carol"], env)).stdout).toContain("carol: revoked");
    seen = await carol();
    for (let i = 0; i < 20 && seen === "ok"; i++) seen = await new Promise((r) => setTimeout(r, 100)).then(carol);
    expect(seen).toBe("the admin token of carol was revoked");
  });

  it("prints an account's history: who changed what, and when, without a secret", async () => {
    const env = { GATEWAY_DATA_DIR: gw.config.dataDir };
    const { userInfo, hostname } = await import("node:os");
    const a = JSON.parse((await runCli(["accounts", "create", "--json", "--name", "team-h", "--max", "50", "--balance", "3"], env)).stdout) as { key: string; secret: string };
    await runCli(["accounts", "set-plan", a.key, "--max", "60", "--zone", "Europe/Berlin"], env);
    await runCli(["accounts", "top-up", a.key, "1.5"], env);
    const json = JSON.parse((await runCli(["accounts", "history", a.key, "--json"], env)).stdout) as { zone: string; events: { at: string; kind: string; by: string; changes: { field: string; before: string; after: string }[] }[] };
    const me = `cli ${userInfo().username}@${hostname()}`;
    expect(json.zone).toBe("Europe/Berlin");
    expect(json.events.map((e) => [e.kind, e.by])).toEqual([["created", me], ["opening", me], ["plan", me], ["top-up", me]]);
    expect(json.events[2]!.changes).toEqual([{ field: "dailyMax", before: "50", after: "60" }, { field: "zone", before: "Asia/Shanghai", after: "Europe/Berlin" }]);
    expect(json.events[0]!.at).toMatch(/^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}$/);
    const text = await runCli(["accounts", "history", a.key], env);
    expect(text.stdout).toContain(`${a.key}: 4 changes recorded; times in Europe/Berlin`);
    expect(text.stdout).toMatch(new RegExp(`plan +by ${me.replace(/[.]/g, "\\.")}\n +dailyMax: 50 → 60; zone: Asia/Shanghai → Europe/Berlin`));
    expect(text.stdout).toMatch(/top-up +by .*\n +balance: 3 → 4\.5/);
    expect(text.stdout).not.toContain(a.secret);
    const missing = await runCli(["accounts", "history", "nosuchkey"], env);
    expect({ code: missing.code, stderr: missing.stderr.trim() }).toEqual({ code: 2, stderr: "no account has the key nosuchkey" });
  });
});

describe("ListAccounts, a page at a time (AIP-158)", () => {
  it("pages through the accounts a query and status match, in the order they were made, each once, whatever is made meanwhile", async () => {
    const c = admin(true);
    const made: string[] = [];
    for (let i = 0; i < 25; i++) made.push((await c.createAccount({ name: `Pager-${String(i).padStart(2, "0")}` }, ok)).account!.key);
    for (const key of made.filter((_, i) => i % 5 === 0)) await c.stopAccount({ key }, ok);
    // Pages of 10 over "pager", in any case: 10, 10, then the rest, with one made between the first and the second page.
    const pages: { keys: string[]; total: number; token: string }[] = [];
    let token = "";
    let late = "";
    do {
      const r = await c.listAccounts({ query: "PAGER", pageSize: 10, pageToken: token }, ok);
      pages.push({ keys: r.accounts.map((a) => a.key), total: r.totalSize, token: r.nextPageToken });
      token = r.nextPageToken;
      if (pages.length === 1) late = (await c.createAccount({ name: "pager-late" }, ok)).account!.key;
    } while (token !== "" && pages.length < 10);
    expect(pages.map((p) => [p.keys.length, p.total])).toEqual([[10, 25], [10, 26], [6, 26]]);
    // Each once, the one made meanwhile on the last page (in the order made; those made in the same millisecond by key).
    expect(pages.flatMap((p) => p.keys).sort()).toEqual([...made, late].sort());
    expect(pages.at(-1)!.keys).toContain(late);
    expect(pages.at(-1)!.token).toBe("");
    // Stopped ones only, two a page; and without a page size, every match at once, as before pages.
    const stopped: string[] = [];
    token = "";
    do {
      const r = await c.listAccounts({ query: "pager", status: AccountStatus.STOPPED, pageSize: 2, pageToken: token }, ok);
      expect(r.totalSize).toBe(5);
      stopped.push(...r.accounts.map((a) => a.key));
      token = r.nextPageToken;
    } while (token !== "");
    expect(stopped.sort()).toEqual(made.filter((_, i) => i % 5 === 0).sort());
    const all = await c.listAccounts({ query: "pager-" }, ok);
    expect([all.accounts.length, all.totalSize, all.nextPageToken]).toEqual([26, 26, ""]);
    expect((await c.listAccounts({}, ok)).accounts.length).toBeGreaterThan(26);
    // A key is found by part of it too.
    expect((await c.listAccounts({ query: late.slice(3, 12).toUpperCase() }, ok)).accounts.map((a) => a.key)).toEqual([late]);
  });

  it("refuses a token given for another query or status, one it never gave, and a negative page size, with invalid_argument", async () => {
    const c = admin();
    const first = await c.listAccounts({ query: "pager", pageSize: 3 }, ok);
    expect(first.nextPageToken).not.toBe("");
    const refused = async (req: Parameters<typeof c.listAccounts>[0]) => c.listAccounts(req, ok).then(() => undefined, (e: unknown) => [ConnectError.from(e).code, ConnectError.from(e).rawMessage]);
    expect(await refused({ query: "other", pageSize: 3, pageToken: first.nextPageToken })).toEqual([Code.InvalidArgument, "the page token was given for another query or status; ask the first page again"]);
    expect(await refused({ query: "pager", status: AccountStatus.ACTIVE, pageSize: 3, pageToken: first.nextPageToken })).toEqual([Code.InvalidArgument, "the page token was given for another query or status; ask the first page again"]);
    expect(await refused({ query: "pager", pageSize: 3, pageToken: "not-a-token" })).toEqual([Code.InvalidArgument, "the page token is not one this gateway gave"]);
    expect(await refused({ pageSize: -1 })).toEqual([Code.InvalidArgument, "the page size must be a whole number, 0 (every account) or more"]);
    expect(await refused({ status: 7 as AccountStatus })).toEqual([Code.InvalidArgument, "status 7 is not ACTIVE, STOPPED or unspecified"]);
    // The same token, asked as it was given, goes on where the page ended.
    expect((await c.listAccounts({ query: "pager", pageSize: 3, pageToken: first.nextPageToken }, ok)).accounts[0]!.key).not.toBe(first.accounts[2]!.key);
  });
});
