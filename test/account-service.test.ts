// The AccountService: a team reads its own account with its own key, over Connect, gRPC-Web and gRPC, with
// every form of credential a catalogue call takes; refusals as a catalogue call's; nothing charged or recorded.
import { Code, ConnectError, createClient, type Transport } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport, createGrpcWebTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { deriveSigningKey, newNonce, signCall } from "../src/client/browser-signature.ts";
import { legacySign, legacySigningKey } from "../src/core/legacy-signature.ts";
import { AccountService, AccountStatus, BalanceChangeKind, OperationState } from "../src/gen/gateway/account/v1/account_pb.js";
import { Charge, StatusBlockSchema } from "../src/gen/gateway/catalogue/v1/status_pb.js";
import { HealthCheckResponse_ServingStatus, Health } from "../src/gen/grpc/health/v1/health_pb.js";
import { OwnReads } from "../src/core/own-reads.ts";
import { demo, legacyGet, startGateway, type GatewayFixture } from "./support/gateway-fixture.ts";

let gw: GatewayFixture;
beforeAll(async () => {
  gw = await startGateway({ config: { trustedProxies: "127.0.0.1", authLockAfter: 5, authSlowAfter: 100 } });
});
afterAll(() => gw.close());

const transports: Record<string, () => Transport> = {
  connect: () => createConnectTransport({ baseUrl: gw.base, httpVersion: "1.1" }),
  "grpc-web": () => createGrpcWebTransport({ baseUrl: gw.base, httpVersion: "1.1" }),
  grpc: () => createGrpcTransport({ baseUrl: gw.base }),
};
const service = (transport = "connect") => createClient(AccountService, transports[transport]!());
const plain = (a: { key: string; secret: string }, from?: string) => ({ headers: { "x-api-key": a.key, "x-api-secret": a.secret, ...(from ? { "x-forwarded-for": from } : {}) } });

/** A refusal as `Code four-digits`, read from the error's status block. */
async function refusal(p: Promise<unknown>): Promise<string> {
  const e = await p.then(
    () => undefined,
    (err: unknown) => ConnectError.from(err),
  );
  if (e === undefined) return "answered";
  const status = e.findDetails(StatusBlockSchema)[0];
  return `${Code[e.code]} ${status === undefined ? "-" : String(status.errorCode).padStart(4, "0")}`;
}

describe("the bound on an account's reads of itself", () => {
  it("admits 20 at once, then one every 50 ms, each account apart", () => {
    const reads = new OwnReads();
    const t = 1_800_000_000_000;
    for (let i = 0; i < 20; i++) reads.take("a", t);
    expect(() => reads.take("a", t)).toThrow(/the next read is admitted in 50 ms$/);
    expect(() => reads.take("a", t + 49)).toThrow(/admitted in 1 ms$/);
    reads.take("a", t + 50);
    expect(() => reads.take("a", t + 50)).toThrow();
    reads.take("b", t);
    // A second on, the whole burst again.
    for (let i = 0; i < 20; i++) reads.take("a", t + 1050);
  });
});

describe("GetMyAccount", () => {
  it("tells a team its plan, its day's calls as api_info counts them, what it may still call today, and its balance, on every transport", async () => {
    const a = await gw.newAccount({ name: "team-self", dailyMax: 10, balance: 1_000_000n, prices: new Map([["retail/item_get", 50_000n]]), rate: { calls: 600, seconds: 60, burst: 600 } });
    let apiInfo = "";
    for (let i = 0; i < 3; i++) apiInfo = String((await legacyGet(gw.base, "/retail/item_get/", { key: a.key, secret: a.secret, num_iid: demo.retailNumIid })).json.api_info);
    for (const transport of Object.keys(transports)) {
      const me = await service(transport).getMyAccount({}, plain(a));
      expect(
        [me.key, me.name, me.status, me.today, me.dailyMax, me.remainingToday, me.yesterday, me.before, me.concurrency, me.rate, me.balance, me.prices, me.clientIp],
        transport,
      ).toEqual([a.key, "team-self", AccountStatus.ACTIVE, 3n, 10n, 7n, 0n, 0n, 20, "600/min", "0.85", { "retail/item_get": "0.05" }, "127.0.0.1"]);
      expect(me.operations).toEqual({ "retail/item_get": OperationState.ENABLED, "wholesale/item_get": OperationState.ENABLED, "wholesale/item_search_peerbuy": OperationState.ENABLED });
      expect(me.requestId).toMatch(/^gw-/);
    }
    // The same counts as the status block's api_info.
    expect(apiInfo).toMatch(/^today:3 max:10 all\[3=3\+0\+0\];expires:\d{4}-\d{2}-\d{2}$/);
  });

  it("takes the key in Authorization and an HMAC signature of its own path, and refuses a legacy sign, a signature of another path and a replayed nonce", async () => {
    const a = gw.account;
    const me = await service().getMyAccount({}, { headers: { authorization: `Bearer ${a.key}`, "x-api-secret": a.secret } });
    // Not billed by balance: no balance at all, not a zero one.
    expect([me.key, me.balance]).toEqual([a.key, undefined]);
    const signingKey = await deriveSigningKey(a.secret);
    const signed = async (path: string, params: Record<string, string> = {}, nonce = newNonce()) => {
      const timestamp = Math.floor(Date.now() / 1000);
      const signature = await signCall(signingKey, { method: "RPC", path, params, timestamp, nonce });
      // From an address of its own: the refusals below count against it, not the other tests' loopback.
      return { headers: { authorization: `GATEWAY-HMAC-SHA256 key=${a.key}, timestamp=${timestamp}, nonce=${nonce}, signature=${signature}`, "x-forwarded-for": "192.0.2.50" } };
    };
    const path = "/gateway.account.v1.AccountService/GetMyAccount";
    const nonce = newNonce();
    expect((await service("grpc").getMyAccount({}, await signed(path, {}, nonce))).key).toBe(a.key);
    expect(await refusal(service("grpc").getMyAccount({}, await signed(path, {}, nonce)))).toBe("Unauthenticated 4005");
    expect(await refusal(service().getMyAccount({}, await signed("/gateway.catalogue.v1.RetailService/ItemGet")))).toBe("Unauthenticated 4005");
    // QueryMyUsage's signature covers what it asks: the same signature with another range is refused.
    const usagePath = "/gateway.account.v1.AccountService/QueryMyUsage";
    expect((await service().queryMyUsage({ from: "2026-01-01" }, await signed(usagePath, { from: "2026-01-01" }))).calls).toBe(0n);
    expect(await refusal(service().queryMyUsage({ from: "2020-01-01" }, await signed(usagePath, { from: "2026-01-01" })))).toBe("Unauthenticated 4005");
    const dateline = "2026-11-26 12:00:00";
    const sign = legacySign({ key: a.key, dateline, api_name: "item_get" }, legacySigningKey(a.secret));
    const legacy = await service().getMyAccount({}, { headers: { "x-api-key": a.key, "x-api-dateline": dateline, "x-api-sign": sign, "x-forwarded-for": "192.0.2.50" } }).catch((e: unknown) => ConnectError.from(e));
    expect((legacy as ConnectError).rawMessage).toBe("4005 a legacy sign signs a catalogue call; send the secret or an HMAC signature of this method");
  });

  it("lets a stopped or expired account read its own state, and refuses a key from elsewhere, a wrong secret and no key, locking the address out as a call's failures do", async () => {
    const stopped = await gw.newAccount({ name: "stopped" });
    await gw.runtime.admin.setStatus(stopped.key, "stopped");
    await new Promise((r) => setTimeout(r, 150));
    expect((await service().getMyAccount({}, plain(stopped))).status).toBe(AccountStatus.STOPPED);
    const expiring = await gw.newAccount({ name: "expiring", expires: "2026-01-01" });
    expect((await service().getMyAccount({}, plain(expiring))).status).toBe(AccountStatus.EXPIRED);

    const held = await gw.newAccount({ name: "held", allowedFrom: ["203.0.113.0/24"] });
    expect((await service().getMyAccount({}, plain(held, "203.0.113.9"))).allowedFrom).toEqual(["203.0.113.0/24"]);
    expect(await refusal(service("grpc").getMyAccount({}, plain(held, "198.51.100.20")))).toBe("Unauthenticated 4005");
    expect(await refusal(service().getMyAccount({}, { headers: { "x-forwarded-for": "198.51.100.21" } }))).toBe("Unauthenticated 4014");
    expect(await refusal(service().getMyAccount({}, plain({ key: "nosuchkey0000000", secret: "x" }, "198.51.100.21")))).toBe("Unauthenticated 4004");
    // Five failures from one address lock it out: then 4008, with when to come back, for calls and reads alike.
    for (let i = 0; i < 5; i++) expect(await refusal(service("grpc-web").getMyAccount({}, plain({ key: held.key, secret: "wrong" }, "198.51.100.22")))).toBe("Unauthenticated 4005");
    const locked = await service().getMyAccount({}, plain(gw.account, "198.51.100.22")).catch((e: unknown) => ConnectError.from(e));
    expect([Code[(locked as ConnectError).code], (locked as ConnectError).metadata.get("retry-after")]).toEqual(["ResourceExhausted", expect.stringMatching(/^\d+$/)]);
    const call = await fetch(`${gw.base}/retail/item_get/?key=${gw.account.key}&secret=${gw.account.secret}&num_iid=${demo.retailNumIid}`, { headers: { "x-forwarded-for": "198.51.100.22" } });
    expect(((await call.json()) as { error_code: string }).error_code).toBe("4008");
  });
});

describe("QueryMyUsage", () => {
  it("totals the team's own calls only, by day, operation, code and address, and answers nothing another team made", async () => {
    const a = await gw.newAccount({ name: "usage-a", prices: new Map([["retail/item_get", 10_000n]]) });
    const b = await gw.newAccount({ name: "usage-b" });
    for (const [who, from] of [[a, "10.0.0.1"], [a, "10.0.0.1"], [a, "10.0.0.2"], [b, "10.0.0.3"]] as const) {
      await fetch(`${gw.base}/retail/item_get/?key=${who.key}&secret=${who.secret}&num_iid=${demo.retailNumIid}`, { headers: { "x-forwarded-for": from } });
    }
    await fetch(`${gw.base}/retail/item_get/?key=${a.key}&secret=${a.secret}&num_iid=abc`, { headers: { "x-forwarded-for": "10.0.0.1" } });
    const mine = await service("grpc").queryMyUsage({}, plain(a));
    expect(mine.totals.map((t) => `${t.operation} ${t.errorCode} ${Charge[t.charge]} ${t.calls} ${t.amount} ${t.clientIp || "-"}`)).toEqual([
      "retail/item_get 0 CHARGED 3 0.03 -",
      "retail/item_get 4003 IGNORED 1 0 -",
    ]);
    expect([mine.calls, mine.chargedCalls, mine.amount]).toEqual([4n, 3n, "0.03"]);
    const byAddress = await service().queryMyUsage({ byAddress: true, operation: "retail/item_get" }, plain(a));
    expect(byAddress.totals.map((t) => `${t.errorCode} ${t.calls} ${t.clientIp}`)).toEqual(["0 2 10.0.0.1", "0 1 10.0.0.2", "4003 1 10.0.0.1"]);
    expect((await service().queryMyUsage({ operation: "wholesale/item_get" }, plain(a))).calls).toBe(0n);
    expect((await service().queryMyUsage({ to: "2000-01-01" }, plain(a))).totals).toEqual([]);
    const theirs = await service().queryMyUsage({}, plain(b));
    expect([theirs.calls, theirs.totals.map((t) => t.clientIp)]).toEqual([1n, [""]]);
    expect(await refusal(service().queryMyUsage({ from: "yesterday" }, plain(a)))).toBe("InvalidArgument 4003");
    expect(await refusal(service("grpc").queryMyUsage({ operation: "item_get" }, plain(a)))).toBe("InvalidArgument 4003");
  });

  it("writes nothing to the ledger and charges nothing: the reads are not calls", async () => {
    const a = await gw.newAccount({ name: "reader", dailyMax: 1, balance: 100_000n, prices: new Map([["retail/item_get", 100_000n]]) });
    const before = (await gw.runtime.meter.query({ account: a.key })).totals;
    for (let i = 0; i < 5; i++) await service().getMyAccount({}, plain(a));
    await service().queryMyUsage({}, plain(a));
    await service().listMyCalls({}, plain(a));
    await service().getMyBalanceStatement({}, plain(a));
    expect((await gw.runtime.meter.query({ account: a.key })).totals).toEqual(before);
    const me = await service().getMyAccount({}, plain(a));
    expect([me.today, me.remainingToday, me.balance]).toEqual([0n, 1n, "0.1"]);
    // Its one call of the day is still there to make.
    expect((await legacyGet(gw.base, "/retail/item_get/", { key: a.key, secret: a.secret, num_iid: demo.retailNumIid })).json.error_code).toBe("0000");
    expect((await service().getMyAccount({}, plain(a))).balance).toBe("0");
  });

  it("accounts for the team's balance as the operator's statement does: each top-up, with what calls took between", async () => {
    const a = await gw.newAccount({ name: "statement-team", balance: 1_000_000n, prices: new Map([["retail/item_get", 50_000n]]) });
    const item = () => legacyGet(gw.base, "/retail/item_get/", { key: a.key, secret: a.secret, num_iid: demo.retailNumIid });
    for (let i = 0; i < 3; i++) await item();
    await gw.runtime.admin.topUp(a.key, 500_000n, "pi_statement_1");
    for (let i = 0; i < 2; i++) await item();
    for (const transport of Object.keys(transports)) {
      const mine = await service(transport).getMyBalanceStatement({}, plain(a));
      expect(
        [mine.balance, mine.takenSinceLast, mine.changes.map((c) => [BalanceChangeKind[c.kind], c.amount, c.balance, c.takenBefore, c.reference])],
        transport,
      ).toEqual(["1.25", "0.1", [["OPENING", "1", "1", "0", ""], ["TOP_UP", "0.5", "1.35", "0.15", "pi_statement_1"]]]);
      // The operator's statement, figure for figure.
      const theirs = await gw.runtime.admin.balanceStatement(a.key);
      expect(mine.changes.map((c) => [Number(c.atMs), c.takenBefore])).toEqual(theirs.entries.map((e) => [e.at, (Number(e.takenBefore) / 1e6).toString()]));
    }
    // An account not billed by balance has no balance and nothing to account for.
    const unbilled = await service().getMyBalanceStatement({}, plain(gw.account));
    expect([unbilled.balance, unbilled.changes, unbilled.takenSinceLast]).toEqual([undefined, [], "0"]);
  });

  it("bounds how often one account reads itself (20 a second, 20 at once), with when to come back, and no other account with it", async () => {
    const a = await gw.newAccount({ name: "reads-a-lot" });
    const b = await gw.newAccount({ name: "reads-little" });
    // At once: however slowly a busy machine lets them arrive, well over the burst come within the second.
    const answers = await Promise.all(Array.from({ length: 60 }, () => service().getMyAccount({}, plain(a)).then(() => "answered", (e: unknown) => ConnectError.from(e))));
    const refused = answers.filter((x): x is ConnectError => x !== "answered");
    expect(60 - refused.length).toBeGreaterThanOrEqual(20);
    expect(refused.length).toBeGreaterThan(0);
    expect(refused[0]!.rawMessage).toMatch(/^4008 an account may read its own state at most 20\/s; the next read is admitted in \d+ ms$/);
    expect([Code[refused[0]!.code], refused[0]!.metadata.get("retry-after")]).toEqual(["ResourceExhausted", "1"]);
    expect((await service().getMyAccount({}, plain(b))).key).toBe(b.key);
    // Its calls are not the reads': the catalogue answers it.
    expect((await legacyGet(gw.base, "/retail/item_get/", { key: a.key, secret: a.secret, num_iid: demo.retailNumIid })).json.error_code).toBe("0000");
  });

  it("is a service gRPC health names, as the others are", async () => {
    const health = createClient(Health, transports.grpc!());
    expect((await health.check({ service: "gateway.account.v1.AccountService" })).status).toBe(HealthCheckResponse_ServingStatus.SERVING);
  });
});
