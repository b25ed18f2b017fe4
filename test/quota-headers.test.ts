// Where a call leaves its account's limits, told to the caller's software: the RateLimit-Policy and RateLimit
// header fields (src/transports/quota-headers.ts), read back with an independent RFC 9651 parser
// (structured-headers), on every transport, on a clock the test moves. The shared meter's figures across replicas
// are in test/replicas.test.ts.
import { ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport, createGrpcWebTransport } from "@connectrpc/connect-node";
import * as grpc from "@grpc/grpc-js";
import { create, toBinary } from "@bufbuild/protobuf";
import { parseList } from "structured-headers";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { parseRate, rateStanding, rateTake, type CallRate } from "../src/core/call-rate.ts";
import { quotaStanding } from "../src/core/quota-standing.ts";
import type { Account } from "../src/core/accounts.ts";
import { operationById } from "../src/operations/index.ts";
import { CachedCatalogue } from "../src/core/cached-catalogue.ts";
import { Gateway } from "../src/core/gateway.ts";
import { ItemGetRequestSchema, RetailService } from "../src/gen/gateway/catalogue/v1/retail_pb.js";
import { StatusBlockSchema } from "../src/gen/gateway/catalogue/v1/status_pb.js";
import { AccountService } from "../src/gen/gateway/account/v1/account_pb.js";
import { demo, legacyGet, startGateway, type GatewayFixture } from "./support/gateway-fixture.ts";

/** A field's members by policy id, each with its parameters, as a client reading RFC 9651 lists sees them. */
function members(value: string | null | undefined): Record<string, Record<string, unknown>> {
  if (value === null || value === undefined) return {};
  const out: Record<string, Record<string, unknown>> = {};
  for (const [item, params] of parseList(value)) {
    expect(typeof item, "a policy id is an sf-string").toBe("string");
    out[item as string] = Object.fromEntries(params);
  }
  return out;
}

describe("the rate's standing after an admitted call", () => {
  it("is the calls its burst still admits at once, and when the burst is whole again", () => {
    const rate: CallRate = { calls: 2, seconds: 1, burst: 3 };
    const t0 = 1_800_000_000_000;
    let tat: bigint | undefined;
    const take = (now: number) => {
      const taken = rateTake(tat, now, rate);
      if (!("next" in taken)) return undefined;
      tat = taken.next;
      return rateStanding(taken.next, now, rate);
    };
    expect(take(t0)).toEqual({ left: 2, resetMs: 500 });
    expect(take(t0)).toEqual({ left: 1, resetMs: 1000 });
    expect(take(t0)).toEqual({ left: 0, resetMs: 1500 });
    expect(take(t0 + 499)).toBeUndefined();
    // What it said is what the rate does: one place 500 ms on, none left after it.
    expect(take(t0 + 500)).toEqual({ left: 0, resetMs: 1500 });
    // A quiet spell: the whole burst less this call.
    expect(take(t0 + 60_000)).toEqual({ left: 2, resetMs: 500 });
    // Checked against the rule itself, at random instants: `left` more calls fit now, and not one more.
    let now = t0 + 120_000;
    for (let i = 0; i < 2000; i++) {
      now += Math.floor(Math.random() * 400);
      const s = take(now);
      if (s === undefined) continue;
      const saved = tat;
      for (let k = 0; k < s.left; k++) expect(take(now), `call ${k + 1} of the ${s.left} said to fit`).toBeDefined();
      expect(take(now)).toBeUndefined();
      tat = saved;
    }
  });
});

describe("where a call leaves its account's limits, as the core counts it", () => {
  const account = { key: "k", dailyMax: 10, rate: { calls: 2, seconds: 1, burst: 3 } } as unknown as Account;
  const at = 1_800_000_000_000;
  const passed = { refusedBy: undefined, usage: { today: 4, yesterday: 0, before: 0 }, dayEndsInMs: 5000 };

  it("takes the daily count the maximum admitted at, gives this call's place back when it was not charged, and reads api_info's only where the call reached no limit", () => {
    const admission = { account: "k", day: "2027-01-20", price: 0n, dayCount: 7, rate: { tat: BigInt(at) * 1_000_000n + 500_000_000n, at } };
    expect(quotaStanding(account, { ...passed, admission, charged: true })).toEqual({
      daily: { max: 10, left: 3, resetMs: 5000 },
      rate: { calls: 2, seconds: 1, left: 2, resetMs: 500 },
    });
    expect(quotaStanding(account, { ...passed, admission, charged: false }).daily.left).toBe(4);
    // Refused before any limit (a parameter, say): api_info's count, and nothing of the rate.
    expect(quotaStanding(account, { ...passed, admission: undefined, charged: false })).toEqual({
      daily: { max: 10, left: 6, resetMs: 5000 },
      rate: { calls: 2, seconds: 1, left: undefined, resetMs: undefined },
    });
    // Refused by the daily maximum: none left, whatever api_info has read.
    expect(quotaStanding(account, { ...passed, admission: undefined, charged: false, refusedBy: { limit: "daily_max", retryAfterMs: 5000 } }).daily.left).toBe(0);
    // Refused by the rate: none left until its next place, the burst whole a tolerance (two intervals) after.
    expect(quotaStanding(account, { ...passed, admission: undefined, charged: false, refusedBy: { limit: "rate", retryAfterMs: 200 } }).rate).toEqual({ calls: 2, seconds: 1, left: 0, resetMs: 1200 });
    // Never below none.
    expect(quotaStanding(account, { ...passed, admission: { ...admission, dayCount: 12 }, charged: true }).daily.left).toBe(0);
  });
});

describe("RateLimit and RateLimit-Policy on every answer to an identified account", () => {
  let gw: GatewayFixture;
  // 20:00 in Shanghai, the accounts' zone: their day ends in four hours.
  let now = Date.UTC(2027, 0, 20, 12, 0, 0);
  const dayLeft = 4 * 3600;
  beforeAll(async () => {
    gw = await startGateway({ clock: { now: () => now }, app: { corsOrigins: ["https://shop.example"] } });
  });
  afterAll(() => gw.close());

  type Told = { code: string; policy: string | null; current: string | null; retryAfter: string | null; apiInfo: string };
  const legacy = async (a: { key: string; secret: string }, numIid: string = demo.retailNumIid): Promise<Told> => {
    const r = await legacyGet(gw.base, "/retail/item_get/", { key: a.key, secret: a.secret, num_iid: numIid });
    return { code: String(r.json.error_code), policy: r.headers.get("ratelimit-policy"), current: r.headers.get("ratelimit"), retryAfter: r.headers.get("retry-after"), apiInfo: String(r.json.api_info) };
  };
  const rpc = (a: { key: string; secret: string }, protocol: "connect" | "grpc" | "grpc-web"): Promise<Told> => {
    const transport =
      protocol === "grpc" ? createGrpcTransport({ baseUrl: gw.base }) : protocol === "grpc-web" ? createGrpcWebTransport({ baseUrl: gw.base, httpVersion: "1.1" }) : createConnectTransport({ baseUrl: gw.base, httpVersion: "1.1" });
    let header: Headers | undefined;
    return createClient(RetailService, transport)
      .itemGet({ numIid: demo.retailNumIid }, { headers: { "x-api-key": a.key, "x-api-secret": a.secret }, onHeader: (h) => (header = h) })
      .then(
        (r): Told => ({ code: "0000", policy: header!.get("ratelimit-policy"), current: header!.get("ratelimit"), retryAfter: header!.get("retry-after"), apiInfo: r.status!.apiInfo }),
        (e: unknown): Told => {
          // An error's metadata: Connect's HTTP headers, gRPC's trailers (Trailers-Only), gRPC-Web's trailers in the body.
          const error = ConnectError.from(e);
          const status = error.findDetails(StatusBlockSchema)[0]!;
          const m = error.metadata;
          return { code: String(status.errorCode).padStart(4, "0"), policy: m.get("ratelimit-policy"), current: m.get("ratelimit"), retryAfter: m.get("retry-after"), apiInfo: status.apiInfo };
        },
      );
  };

  it("count down the daily maximum and the rate exactly, call by call, over legacy, Connect, gRPC-Web and gRPC", async () => {
    const a = await gw.newAccount({ dailyMax: 4, rate: parseRate("2/s", 2) });
    const policy = { daily: { q: 4, w: 86400 }, rate: { q: 2, w: 1 } };

    const first = await legacy(a);
    expect(first.code).toBe("0000");
    expect(members(first.policy)).toEqual(policy);
    expect(members(first.current)).toEqual({ daily: { r: 3, t: dayLeft }, rate: { r: 1, t: 1 } });
    expect(first.apiInfo).toMatch(/^today:1 max:4 /);

    const second = await rpc(a, "connect");
    expect([second.code, members(second.policy), members(second.current)]).toEqual(["0000", policy, { daily: { r: 2, t: dayLeft }, rate: { r: 0, t: 1 } }]);

    // The same instant: the rate refuses, and says so with nothing left; the day's count is api_info's (two calls).
    const refused = await rpc(a, "grpc");
    expect([refused.code, members(refused.policy), members(refused.current)]).toEqual(["4008", policy, { daily: { r: 2, t: dayLeft }, rate: { r: 0, t: 1 } }]);

    now += 500;
    const third = await rpc(a, "grpc-web");
    expect([third.code, members(third.current)]).toEqual(["0000", { daily: { r: 1, t: dayLeft }, rate: { r: 0, t: 1 } }]);

    now += 60_000;
    const fourth = await rpc(a, "grpc");
    expect([fourth.code, members(fourth.current)]).toEqual(["0000", { daily: { r: 0, t: dayLeft - 60 }, rate: { r: 1, t: 1 } }]);
    expect(fourth.apiInfo).toMatch(/^today:4 max:4 /);

    // The maximum: none left, until the account's midnight, which Retry-After says too.
    now += 1000;
    const over = await legacy(a);
    expect([over.code, members(over.current)]).toEqual(["4013", { daily: { r: 0, t: dayLeft - 61 } }]);
    expect(over.retryAfter).toBe(String(dayLeft - 61));
    const overRpc = await rpc(a, "connect");
    expect([overRpc.code, members(overRpc.current), overRpc.retryAfter]).toEqual(["4013", { daily: { r: 0, t: dayLeft - 61 } }, String(dayLeft - 61)]);
  });

  it("name only the daily maximum for a plan with no rate, and say nothing to a caller whose account is not known", async () => {
    const a = await gw.newAccount({ dailyMax: 100 });
    const ok = await legacy(a);
    expect([members(ok.policy), members(ok.current)]).toEqual([{ daily: { q: 100, w: 86400 } }, { daily: { r: 99, t: dayLeft - 61 } }]);
    // A parameter refused before any limit: the policy, and the day's count as api_info has it.
    const bad = await legacy(a, "not-a-number");
    expect([bad.code, members(bad.policy), members(bad.current)]).toEqual(["4003", { daily: { q: 100, w: 86400 } }, { daily: { r: 99, t: dayLeft - 61 } }]);
    for (const who of [{ key: a.key, secret: "wrong" }, { key: "no-such-key", secret: "x" }]) {
      for (const told of [await legacy(who), await rpc(who, "connect"), await rpc(who, "grpc")]) {
        expect([told.code, told.policy, told.current]).toEqual([who.key === a.key ? "4005" : "4004", null, null]);
      }
    }
  });

  it("are gRPC response metadata a grpc-js client reads, and headers a page of an allowed origin may read", async () => {
    const a = await gw.newAccount({ dailyMax: 50 });
    const client = new grpc.Client(`127.0.0.1:${gw.port}`, grpc.credentials.createInsecure());
    const metadata = new grpc.Metadata();
    metadata.set("x-api-key", a.key);
    metadata.set("x-api-secret", a.secret);
    const head = await new Promise<grpc.Metadata>((resolve, reject) => {
      const call = client.makeUnaryRequest(
        "/gateway.catalogue.v1.RetailService/ItemGet",
        (m: Uint8Array) => Buffer.from(m),
        (b: Buffer) => b,
        toBinary(ItemGetRequestSchema, create(ItemGetRequestSchema, { numIid: demo.retailNumIid })),
        metadata,
        (e) => e && reject(e),
      );
      call.on("metadata", resolve);
    });
    client.close();
    expect(members(head.get("ratelimit")[0] as string)).toEqual({ daily: { r: 49, t: dayLeft - 61 } });
    expect(members(head.get("ratelimit-policy")[0] as string)).toEqual({ daily: { q: 50, w: 86400 } });

    // CORS: the browser hands a page only the headers the answer exposes.
    const res = await fetch(`${gw.base}/gateway.catalogue.v1.RetailService/ItemGet`, {
      method: "POST",
      headers: { origin: "https://shop.example", "content-type": "application/json", "x-api-key": a.key, "x-api-secret": a.secret },
      body: JSON.stringify({ numIid: demo.retailNumIid }),
    });
    expect(res.status).toBe(200);
    const exposed = (res.headers.get("access-control-expose-headers") ?? "").split(/,\s*/).map((h) => h.toLowerCase());
    expect(exposed).toEqual(expect.arrayContaining(["ratelimit", "ratelimit-policy", "retry-after"]));
    expect(members(res.headers.get("ratelimit"))).toEqual({ daily: { r: 48, t: dayLeft - 61 } });
  });

  it("give the daily place back to a call that was admitted and then not charged (its source failed)", async () => {
    const a = await gw.newAccount({ dailyMax: 5 });
    expect(members((await legacy(a)).current)).toEqual({ daily: { r: 4, t: dayLeft - 61 } });
    const sources = new Map([["retail", { label: "failing", fetch: () => Promise.reject(new Error("boom")) }]]);
    const { accounts, meter, switches } = gw.runtime;
    const failing = new Gateway({ accounts, meter, switches, catalogue: new CachedCatalogue(sources, undefined) }, { clock: { now: () => now } });
    const out = await failing.call(operationById.get("retail/item_get")!, { args: { num_iid: demo.retailNumIid }, credentials: a, transport: "legacy", clientIp: "127.0.0.1" });
    expect(out.status.errorCode).toBe(4000);
    expect(out.quota?.daily).toEqual({ max: 5, left: 4, resetMs: dayLeft * 1000 - 61_500 });
    expect(members((await legacy(a)).current)).toEqual({ daily: { r: 3, t: dayLeft - 61 } });
  });

  it("say what GetMyAccount says of the rate between calls: what it admits at once now, and when it is whole again", async () => {
    const a = await gw.newAccount({ dailyMax: 100, rate: parseRate("2/s", 3) });
    const me = () => createClient(AccountService, createConnectTransport({ baseUrl: gw.base, httpVersion: "1.1" })).getMyAccount({}, { headers: { "x-api-key": a.key, "x-api-secret": a.secret } });
    const standing = async () => {
      const m = await me();
      return [m.rateRemaining, m.rateResetMs];
    };
    expect(await standing()).toEqual([3, 0n]);
    await legacy(a);
    const second = await legacy(a);
    // As the last call's RateLimit said ("rate";r=1;t=1), to the millisecond.
    expect(members(second.current).rate).toEqual({ r: 1, t: 1 });
    expect(await standing()).toEqual([1, 1000n]);
    now += 500;
    expect(await standing()).toEqual([2, 500n]);
    now += 10_000;
    expect(await standing()).toEqual([3, 0n]);
    // No rate: neither field.
    const unrated = await gw.newAccount({ dailyMax: 100 });
    const m = await createClient(AccountService, createConnectTransport({ baseUrl: gw.base, httpVersion: "1.1" })).getMyAccount({}, { headers: { "x-api-key": unrated.key, "x-api-secret": unrated.secret } });
    expect([m.rateRemaining, m.rateResetMs]).toEqual([undefined, undefined]);
  });
});

