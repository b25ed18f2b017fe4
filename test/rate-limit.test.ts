// An account's rate limit (src/core/call-rate.ts): the rule, and the embedded meter behind the real app on every
// transport, on a clock the test moves. The shared meter's is in test/postgres-meter.test.ts.
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { formatRate, parseRate, rateBounds, rateTake, CallRateError, type CallRate } from "../src/core/call-rate.ts";
import { parseMoney } from "../src/core/money.ts";
import { RetailService } from "../src/gen/gateway/catalogue/v1/retail_pb.js";
import { StatusBlockSchema } from "../src/gen/gateway/catalogue/v1/status_pb.js";
import { demo, legacyGet, startGateway, type GatewayFixture } from "./support/gateway-fixture.ts";

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
      let tat: bigint | undefined;
      const take = (now: number) => {
        const taken = rateTake(tat, now, rate);
        if ("next" in taken) tat = taken.next;
        return "waitMs" in taken ? taken.waitMs : undefined;
      };
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
});
