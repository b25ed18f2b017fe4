// An account's rate limit (src/core/call-rate.ts): the rule, and the embedded meter behind the real app on every
// transport, on a clock the test moves. The shared meter's is in test/postgres-meter.test.ts.
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport, createGrpcWebTransport } from "@connectrpc/connect-node";
import * as grpc from "@grpc/grpc-js";
import { create, toBinary } from "@bufbuild/protobuf";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { formatRate, parseRate, rateBounds, rateSkewNs, rateTake, CallRateError, type CallRate } from "../src/core/call-rate.ts";
import { parseMoney } from "../src/core/money.ts";
import { ItemGetRequestSchema, RetailService } from "../src/gen/gateway/catalogue/v1/retail_pb.js";
import { StatusBlockSchema } from "../src/gen/gateway/catalogue/v1/status_pb.js";
import { RetryInfoSchema } from "../src/gen/google/rpc/error_details_pb.js";
import { dayOf, nextDayStarts } from "../src/core/clock.ts";
import { demo, legacyGet, startGateway, type GatewayFixture } from "./support/gateway-fixture.ts";

/** One account's calls under `rate`, each at the ms given: undefined when admitted, else the wait it is told (ms). */
function taker(rate: CallRate): (nowMs: number) => number | undefined {
  let tat: bigint | undefined;
  return (nowMs) => {
    const taken = rateTake(tat, nowMs, rate);
    if ("next" in taken) tat = taken.next;
    return "waitMs" in taken ? taken.waitMs : undefined;
  };
}

describe("a rate", () => {
  it("is read as calls per second, minute or hour, with a burst that defaults to its calls, and written back the same", () => {
    expect(parseRate("10/s")).toEqual({ calls: 10, seconds: 1, burst: 10 });
    expect(parseRate("600/min", 50)).toEqual({ calls: 600, seconds: 60, burst: 50 });
    expect(parseRate("5000/h")).toEqual({ calls: 5000, seconds: 3600, burst: 5000 });
    expect(parseRate("none")).toBeUndefined();
    expect(formatRate(parseRate("600/min", 50))).toBe("600/min, burst 50");
    expect(formatRate(parseRate("10/s"))).toBe("10/s");
    expect(formatRate(undefined)).toBe("none");
    for (const [text, burst] of [["10", undefined], ["0/s", undefined], ["1.5/s", undefined], ["10/day", undefined], ["10/s", 0], ["10/s", 2.5], ["none", 3], ["1000000001/s", undefined]] as const) {
      expect(() => parseRate(text, burst), `${text} ${burst}`).toThrow(CallRateError);
    }
  });

  it("lets a burst through at once and then one call an interval, to the millisecond, also where the interval is not whole", () => {
    // A long burst at a high rate too: summed in floating-point milliseconds near 1.8e12, the last rate admitted 49,829
    // calls of its burst of 50,000 (the sum drifted 5.7 ms, 171 intervals).
    for (const rate of [{ calls: 10, seconds: 1, burst: 4 }, { calls: 3, seconds: 1, burst: 7 }, { calls: 7, seconds: 60, burst: 1 }, { calls: 30_000, seconds: 1, burst: 50_000 }] satisfies CallRate[]) {
      const t0 = 1_800_000_000_000;
      const take = taker(rate);
      let admitted = 0;
      for (let i = 0; i < rate.burst + 100; i++) if (take(t0) === undefined) admitted++;
      expect(admitted, formatRate(rate)).toBe(rate.burst);
      if (rate.calls === 30_000) {
        // 30 calls a millisecond: one millisecond on, exactly 30 more.
        let more = 0;
        for (let i = 0; i < 100; i++) if (take(t0 + 1) === undefined) more++;
        expect(more).toBe(30);
        continue;
      }
      // The next call fits one interval after the first; it is told how long to wait, and waiting that long is enough.
      const wait = take(t0 + 1)!;
      expect(wait).toBeCloseTo(Number(rateBounds(rate).interval) / 1e6 - 1, 5);
      expect(take(t0 + Math.floor(wait))).toBeGreaterThan(0);
      expect(take(t0 + 1 + Math.ceil(wait))).toBeUndefined();
    }
  });

  it("reads a time kept by a clock that read later (stepped back since, or another replica's) as the burst spent up to now: a call at once, then the rate", () => {
    const rate: CallRate = { calls: 2, seconds: 1, burst: 3 };
    const t0 = 1_800_000_000_000;
    const take = taker(rate);
    for (let i = 0; i < 3; i++) expect(take(t0)).toBeUndefined();
    expect(take(t0)).toBe(500);
    // The clock steps back an hour: the account is not refused for the hour. One call now, and the next an interval on.
    const back = t0 - 3_600_000;
    expect(take(back)).toBeUndefined();
    expect(take(back)).toBe(500);
    expect(take(back + 499)).toBe(1);
    expect(take(back + 500)).toBeUndefined();
    // And the rate holds from there: over the next 10 s of this clock, one call an interval, no more.
    let admitted = 0;
    for (let ms = back + 501; ms <= back + 10_500; ms++) if (take(ms) === undefined) admitted++;
    expect(admitted).toBe(20);
    // A time this clock could have left (the burst spent, at most one interval on) is the rule itself, to the ns;
    // one a little further was left by a call that read its clock later and was admitted first: taken as it is (before,
    // a nanosecond further was read as a step back, and let one call more through). Past rateSkewNs, a step back.
    const spent = BigInt(t0) * 1_000_000n + 1_500_000_000n;
    expect(rateTake(spent, t0, rate)).toEqual({ waitMs: 500 });
    expect(rateTake(spent + 1_000_000n, t0, rate)).toEqual({ waitMs: 501 });
    expect(rateTake(spent + rateSkewNs, t0, rate)).toEqual({ waitMs: 5500 });
    expect(rateTake(spent + rateSkewNs + 1n, t0, rate)).toEqual({ next: BigInt(t0) * 1_000_000n + 1_500_000_000n });
  });
});

describe("the embedded meter's rate limit, behind the app", () => {
  let gw: GatewayFixture;
  let now = 1_800_000_000_000;
  beforeAll(async () => {
    gw = await startGateway({ clock: { now: () => now } });
  });
  afterAll(() => gw.close());

  const legacy = async (a: { key: string; secret: string }) => {
    const r = await legacyGet(gw.base, "/retail/item_get/", { key: a.key, secret: a.secret, num_iid: demo.retailNumIid });
    return { code: String(r.json.error_code), reason: String(r.json.reason ?? "") };
  };
  const rpc = (a: { key: string; secret: string }, grpc: boolean) =>
    createClient(RetailService, grpc ? createGrpcTransport({ baseUrl: gw.base }) : createConnectTransport({ baseUrl: gw.base, httpVersion: "1.1" }))
      .itemGet({ numIid: demo.retailNumIid }, { headers: { "x-api-key": a.key, "x-api-secret": a.secret } })
      .then(
        () => ({ code: "0000", reason: "" }),
        (e: unknown) => {
          const status = ConnectError.from(e).findDetails(StatusBlockSchema)[0]!;
          expect(ConnectError.from(e).code).toBe(Code.ResourceExhausted);
          return { code: String(status.errorCode).padStart(4, "0"), reason: status.reason };
        },
      );

  it("admits exactly its burst of simultaneous calls over legacy, Connect and gRPC, answers the rest 4008 saying when to come back, and one more call an interval", async () => {
    const a = await gw.newAccount({ rate: parseRate("2/s", 3) });
    const answers = await Promise.all(Array.from({ length: 12 }, (_, i) => (i % 3 === 0 ? legacy(a) : rpc(a, i % 3 === 2))));
    expect(answers.filter((x) => x.code === "0000")).toHaveLength(3);
    expect(answers.filter((x) => x.code === "4008").map((x) => x.reason)).toEqual(Array(9).fill("this account's rate limit of 2/s, burst 3 is reached; the next call is admitted in 500 ms"));
    const ledger = (await gw.runtime.meter.query({ account: a.key, rows: 50 })).rows;
    expect(ledger.filter((r) => r.code === 4008).every((r) => r.charge === "ignored")).toBe(true);
    // The refused calls took nothing: 499 ms on, none fits yet; at 500 ms one does, and only one.
    now += 499;
    expect(await legacy(a)).toEqual({ code: "4008", reason: "this account's rate limit of 2/s, burst 3 is reached; the next call is admitted in 1 ms" });
    now += 1;
    expect((await legacy(a)).code).toBe("0000");
    expect((await rpc(a, true)).code).toBe("4008");
    // After a quiet spell the whole burst again, never more.
    now += 60_000;
    expect((await Promise.all(Array.from({ length: 5 }, () => legacy(a)))).map((x) => x.code).sort()).toEqual(["0000", "0000", "0000", "4008", "4008"]);
  });

  it("takes no place under the rate for a call another limit refuses", async () => {
    const price = parseMoney("0.1");
    const a = await gw.newAccount({ rate: parseRate("1/min", 2), balance: price, prices: new Map([["retail/item_get", price]]) });
    expect((await legacy(a)).code).toBe("0000");
    expect((await legacy(a)).code).toBe("4016"); // the balance, not the rate: the burst's second place is still free
    await gw.runtime.admin.topUp(a.key, price * 2n);
    expect((await legacy(a)).code).toBe("0000");
    expect((await legacy(a)).code).toBe("4008");
  });

  it("is set, changed and removed with the plan, recorded in the account's history, and applies to the next call", async () => {
    const a = await gw.newAccount();
    expect((await Promise.all(Array.from({ length: 5 }, () => legacy(a)))).every((x) => x.code === "0000")).toBe(true);
    await gw.runtime.admin.setPlan(a.key, { rate: parseRate("1/h") });
    expect((await legacy(a)).code).toBe("0000");
    expect((await legacy(a)).reason).toBe("this account's rate limit of 1/h is reached; the next call is admitted in 3600000 ms");
    await gw.runtime.admin.setPlan(a.key, { rate: null });
    expect((await legacy(a)).code).toBe("0000");
    const plans = (await gw.runtime.admin.history(a.key)).filter((e) => e.kind === "plan").map((e) => e.changes);
    expect(plans).toEqual([[{ field: "rate", before: "", after: "1/h" }], [{ field: "rate", before: "1/h", after: "" }]]);
    // A plan change that names no rate leaves it as it is.
    await gw.runtime.admin.setPlan(a.key, { rate: parseRate("5/s") });
    await gw.runtime.admin.setPlan(a.key, { dailyMax: 99 });
    expect((await gw.runtime.admin.get(a.key)).rate).toEqual({ calls: 5, seconds: 1, burst: 5 });
    await expect(gw.runtime.admin.setPlan(a.key, { rate: { calls: 0, seconds: 1, burst: 1 } })).rejects.toThrow("a rate's calls must be a whole number from 1 to 1000000000");
  });

  it("serves an account at its rate, not refused for an hour, after the clock steps back an hour, on every transport", async () => {
    const a = await gw.newAccount({ rate: parseRate("2/s", 3) });
    expect((await Promise.all([legacy(a), rpc(a, false), rpc(a, true)])).map((x) => x.code)).toEqual(["0000", "0000", "0000"]);
    expect((await legacy(a)).code).toBe("4008");
    now -= 3_600_000;
    try {
      // One call at once (the burst counts as spent up to now), the next an interval on, on whichever transport.
      expect((await rpc(a, true)).code).toBe("0000");
      const refused = { code: "4008", reason: "this account's rate limit of 2/s, burst 3 is reached; the next call is admitted in 500 ms" };
      expect(await Promise.all([legacy(a), rpc(a, false), rpc(a, true)])).toEqual([refused, refused, refused]);
      now += 500;
      expect((await legacy(a)).code).toBe("0000");
      expect((await rpc(a, false)).code).toBe("4008");
      // A quiet spell on the new clock: the whole burst again, never more.
      now += 60_000;
      expect((await Promise.all(Array.from({ length: 5 }, () => legacy(a)))).map((x) => x.code).sort()).toEqual(["0000", "0000", "0000", "4008", "4008"]);
    } finally {
      now += 3_600_000;
    }
  });
});

describe("when a refused caller may come back", () => {
  // Its own gateway: the last test locks the loopback address out. Two failed authentications lock it.
  let gw: GatewayFixture;
  let now = Date.UTC(2027, 0, 20, 12, 0, 0);
  beforeAll(async () => {
    gw = await startGateway({ clock: { now: () => now }, config: { authLockAfter: 2 } });
  });
  afterAll(() => gw.close());

  /** A call's answer as its caller's software reads when to come back: the header, the trailer and the RetryInfo detail. */
  type Told = { code: string; retryAfter: string | null; pushback: string | null; retryInfoMs: number | null };
  const legacy = async (a: { key: string; secret: string }): Promise<Told> => {
    const r = await legacyGet(gw.base, "/retail/item_get/", { key: a.key, secret: a.secret, num_iid: demo.retailNumIid });
    return { code: String(r.json.error_code), retryAfter: r.headers.get("retry-after"), pushback: r.headers.get("grpc-retry-pushback-ms"), retryInfoMs: null };
  };
  const rpc = (a: { key: string; secret: string }, protocol: "connect" | "grpc" | "grpc-web"): Promise<Told> => {
    const transport = protocol === "grpc" ? createGrpcTransport({ baseUrl: gw.base }) : protocol === "grpc-web" ? createGrpcWebTransport({ baseUrl: gw.base, httpVersion: "1.1" }) : createConnectTransport({ baseUrl: gw.base, httpVersion: "1.1" });
    return createClient(RetailService, transport)
      .itemGet({ numIid: demo.retailNumIid }, { headers: { "x-api-key": a.key, "x-api-secret": a.secret } })
      .then(
        (): Told => ({ code: "0000", retryAfter: null, pushback: null, retryInfoMs: null }),
        (e: unknown): Told => {
          const error = ConnectError.from(e);
          expect(error.code).toBe(Code.ResourceExhausted);
          const delay = error.findDetails(RetryInfoSchema)[0]?.retryDelay;
          return {
            code: String(error.findDetails(StatusBlockSchema)[0]!.errorCode).padStart(4, "0"),
            retryAfter: error.metadata.get("retry-after"),
            pushback: error.metadata.get("grpc-retry-pushback-ms"),
            retryInfoMs: delay === undefined ? null : Number(delay.seconds) * 1000 + delay.nanos / 1e6,
          };
        },
      );
  };
  const everyProtocol = async (a: { key: string; secret: string }) => ({
    legacy: await legacy(a),
    connect: await rpc(a, "connect"),
    grpc: await rpc(a, "grpc"),
    grpcWeb: await rpc(a, "grpc-web"),
  });
  const limited = async () => {
    const metric = (await gw.runtime.metrics.registry.getSingleMetric("gateway_calls_limited_total")!.get()) as { values: { labels: Record<string, string>; value: number }[] };
    return Object.fromEntries(metric.values.map((v) => [`${v.labels.operation} ${v.labels.limit}`, v.value]));
  };

  it("the rate: its wait, as Retry-After in whole seconds rounded up (legacy, Connect), grpc-retry-pushback-ms (gRPC, gRPC-Web) and RetryInfo to the ms", async () => {
    const a = await gw.newAccount({ rate: parseRate("2/s", 1) });
    expect(await legacy(a)).toEqual({ code: "0000", retryAfter: null, pushback: null, retryInfoMs: null });
    now += 100;
    expect(await everyProtocol(a)).toEqual({
      legacy: { code: "4008", retryAfter: "1", pushback: null, retryInfoMs: null },
      connect: { code: "4008", retryAfter: "1", pushback: null, retryInfoMs: 400 },
      grpc: { code: "4008", retryAfter: null, pushback: "400", retryInfoMs: 400 },
      grpcWeb: { code: "4008", retryAfter: null, pushback: "400", retryInfoMs: 400 },
    });
    // Waiting what it was told is enough.
    now += 400;
    expect((await rpc(a, "grpc")).code).toBe("0000");
    // An hour's wait: 3,600 s, not a minute rounded.
    const b = await gw.newAccount({ rate: parseRate("1/h") });
    expect((await legacy(b)).code).toBe("0000");
    now += 1;
    expect(await legacy(b)).toMatchObject({ code: "4008", retryAfter: "3600" });
    expect(await rpc(b, "connect")).toMatchObject({ retryAfter: "3600", retryInfoMs: 3_599_999 });
    expect((await limited())["retail/item_get rate"]).toBe(6);
  });

  it("the daily maximum: the account's midnight in its own zone", async () => {
    // 23:59:30 in Shanghai (UTC+8): 30 s to the account's next day.
    now = Date.UTC(2027, 0, 20, 15, 59, 30);
    const a = await gw.newAccount({ dailyMax: 1 });
    expect((await legacy(a)).code).toBe("0000");
    expect(await everyProtocol(a)).toEqual({
      legacy: { code: "4013", retryAfter: "30", pushback: null, retryInfoMs: null },
      connect: { code: "4013", retryAfter: "30", pushback: null, retryInfoMs: 30_000 },
      grpc: { code: "4013", retryAfter: null, pushback: "30000", retryInfoMs: 30_000 },
      grpcWeb: { code: "4013", retryAfter: null, pushback: "30000", retryInfoMs: 30_000 },
    });
    // Another zone, and a day whose midnight daylight saving skips (Santiago, 2026-09-06: 00:00 is 01:00).
    const ny = await gw.newAccount({ dailyMax: 1, zone: "America/New_York" });
    expect((await legacy(ny)).code).toBe("0000");
    expect((await rpc(ny, "grpc")).pushback).toBe(String(Date.UTC(2027, 0, 21, 5) - now));
    expect(nextDayStarts("2026-09-05", "America/Santiago")).toBe(Date.UTC(2026, 8, 6, 4));
    expect(nextDayStarts("2026-04-04", "America/Santiago")).toBe(Date.UTC(2026, 3, 5, 4)); // 23:00-24:00 of the 4th comes twice
    now += 30_000;
    expect((await legacy(a)).code).toBe("0000");
    expect((await limited())["retail/item_get daily_max"]).toBe(5);
  });

  it("the balance: no wait is known, and gRPC callers are told not to retry (pushback -1); nor for a full concurrency", async () => {
    const price = parseMoney("0.1");
    const a = await gw.newAccount({ balance: price, prices: new Map([["retail/item_get", price]]) });
    expect((await legacy(a)).code).toBe("0000");
    expect(await everyProtocol(a)).toEqual({
      legacy: { code: "4016", retryAfter: null, pushback: null, retryInfoMs: null },
      connect: { code: "4016", retryAfter: null, pushback: null, retryInfoMs: null },
      grpc: { code: "4016", retryAfter: null, pushback: "-1", retryInfoMs: null },
      grpcWeb: { code: "4016", retryAfter: null, pushback: "-1", retryInfoMs: null },
    });
    // A full concurrency: its one place held (admitted, not yet recorded); it frees when that call ends, which no one can say.
    const b = await gw.newAccount({ concurrency: 1 });
    await gw.runtime.meter.admit((await gw.runtime.accounts.find(b.key))!, "retail/item_get", dayOf(now, "Asia/Shanghai"));
    expect(await everyProtocol(b)).toEqual({
      legacy: { code: "4008", retryAfter: null, pushback: null, retryInfoMs: null },
      connect: { code: "4008", retryAfter: null, pushback: null, retryInfoMs: null },
      grpc: { code: "4008", retryAfter: null, pushback: null, retryInfoMs: null },
      grpcWeb: { code: "4008", retryAfter: null, pushback: null, retryInfoMs: null },
    });
    expect(await limited()).toMatchObject({ "retail/item_get balance": 4, "retail/item_get concurrency": 4 });
  });

  it("an address locked out for failed authentications: the lock's time left", async () => {
    const a = await gw.newAccount();
    for (let i = 0; i < 2; i++) expect((await legacy({ key: a.key, secret: "wrong" })).code).toBe("4005");
    now += 10_000;
    expect(await everyProtocol(a)).toEqual({
      legacy: { code: "4008", retryAfter: "290", pushback: null, retryInfoMs: null },
      connect: { code: "4008", retryAfter: "290", pushback: null, retryInfoMs: 290_000 },
      grpc: { code: "4008", retryAfter: null, pushback: "290000", retryInfoMs: 290_000 },
      grpcWeb: { code: "4008", retryAfter: null, pushback: "290000", retryInfoMs: 290_000 },
    });
    expect((await limited())["retail/item_get address_locked"]).toBe(4);
    now += 290_000;
    expect((await legacy(a)).code).toBe("0000");
  });
});

describe("a gRPC client's own retry policy, told when to come back (grpc-js, real time)", () => {
  let gw: GatewayFixture;
  beforeAll(async () => {
    gw = await startGateway();
  });
  afterAll(() => gw.close());

  /** ItemGet by grpc-js with a policy retrying RESOURCE_EXHAUSTED up to 5 times, after 1 ms at first: what the caller ends with. */
  function withRetries(a: { key: string; secret: string }): Promise<string> {
    const serviceConfig = {
      methodConfig: [{ name: [{ service: RetailService.typeName }], retryPolicy: { maxAttempts: 5, initialBackoff: "0.001s", maxBackoff: "0.001s", backoffMultiplier: 1, retryableStatusCodes: ["RESOURCE_EXHAUSTED"] } }],
    };
    const client = new grpc.Client(`127.0.0.1:${gw.port}`, grpc.credentials.createInsecure(), { "grpc.service_config": JSON.stringify(serviceConfig) });
    const metadata = new grpc.Metadata();
    metadata.set("x-api-key", a.key);
    metadata.set("x-api-secret", a.secret);
    return new Promise((resolve) => {
      client.makeUnaryRequest(
        `/${RetailService.typeName}/ItemGet`,
        (req: { numIid: string }) => Buffer.from(toBinary(ItemGetRequestSchema, create(ItemGetRequestSchema, req))),
        (b: Buffer) => b,
        { numIid: demo.retailNumIid },
        metadata,
        { deadline: Date.now() + 20_000 },
        (err) => {
          client.close();
          resolve(err ? `${grpc.status[err.code]} ${err.details.slice(0, 4)}` : "OK");
        },
      );
    });
  }
  const codes = async (a: { key: string }) => (await gw.runtime.meter.query({ account: a.key, rows: 50 })).rows.map((r) => String(r.code).padStart(4, "0")).reverse();

  it("waits the rate's pushback once, rather than spending its attempts at once, and does not retry a balance at all", async () => {
    // 4/s: the next place 250 ms after a call. Without the pushback the policy's 1 ms backoff would spend all
    // five attempts within those 250 ms.
    const a = await gw.newAccount({ rate: parseRate("4/s", 1) });
    expect((await legacyGet(gw.base, "/retail/item_get/", { key: a.key, secret: a.secret, num_iid: demo.retailNumIid })).json.error_code).toBe("0000");
    expect(await withRetries(a)).toBe("OK");
    expect(await codes(a)).toEqual(["0000", "4008", "0000"]);
    // A balance that does not cover the price: one attempt, not five.
    const price = parseMoney("0.1");
    const b = await gw.newAccount({ balance: 0n, prices: new Map([["retail/item_get", price]]) });
    expect(await withRetries(b)).toBe("RESOURCE_EXHAUSTED 4016");
    expect(await codes(b)).toEqual(["4016"]);
  });
});
