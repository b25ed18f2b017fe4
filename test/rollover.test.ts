import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { demo, legacyGet, startGateway, type GatewayFixture } from "./support/gateway-fixture.ts";

/** A clock the test moves by hand. */
const clock = { at: Date.parse("2026-03-07T12:00:00Z"), now() { return this.at; } };

let gw: GatewayFixture;
beforeAll(async () => {
  gw = await startGateway({ clock });
});
afterAll(() => gw.close());

async function call(a: { key: string; secret: string }) {
  const { json } = await legacyGet(gw.base, "/retail/item_get/", { key: a.key, secret: a.secret, num_iid: demo.retailNumIid });
  return { code: json.error_code as string, apiInfo: json.api_info as string, serverTime: json.server_time as string };
}

describe("the daily maximum resets at midnight in the account's zone", () => {
  it("Asia/Shanghai: 23:59:59 is still the old day, 00:00:00 the new one", async () => {
    clock.at = Date.parse("2026-03-07T23:59:58+08:00");
    const a = await gw.newAccount({ dailyMax: 2, zone: "Asia/Shanghai", expires: "2030-01-01" });
    expect((await call(a)).code).toBe("0000");
    clock.at = Date.parse("2026-03-07T23:59:59.900+08:00");
    const second = await call(a);
    expect(second.code).toBe("0000");
    expect(second.serverTime).toBe("Beijing/2026-03-07 23:59:59");
    expect((await call(a)).code).toBe("4013");

    clock.at = Date.parse("2026-03-08T00:00:00+08:00");
    const fresh = await call(a);
    expect(fresh.code).toBe("0000");
    expect(fresh.apiInfo).toBe("today:1 max:2 all[3=1+2+0];expires:2030-01-01");

    clock.at = Date.parse("2026-03-10T09:00:00+08:00");
    expect((await call(a)).apiInfo).toBe("today:1 max:2 all[4=1+0+3];expires:2030-01-01");
  });

  it("America/New_York across the spring DST change (a 23-hour day)", async () => {
    const a = await gw.newAccount({ dailyMax: 1, zone: "America/New_York", expires: "2030-01-01" });
    // 2026-03-08: clocks go from 02:00 EST to 03:00 EDT; the day ends at 04:00 UTC on the 9th.
    clock.at = Date.parse("2026-03-08T00:30:00-05:00");
    expect((await call(a)).code).toBe("0000");
    clock.at = Date.parse("2026-03-08T23:59:59-04:00");
    expect((await call(a)).code).toBe("4013");
    clock.at = Date.parse("2026-03-09T00:00:00-04:00");
    expect((await call(a)).code).toBe("0000");
    expect(new Date(clock.at).toISOString()).toBe("2026-03-09T04:00:00.000Z");
  });

  it("America/New_York across the autumn DST change (a 25-hour day)", async () => {
    const a = await gw.newAccount({ dailyMax: 1, zone: "America/New_York", expires: "2030-01-01" });
    // 2026-11-01: clocks go from 02:00 EDT back to 01:00 EST; the day ends at 05:00 UTC on the 2nd.
    clock.at = Date.parse("2026-11-01T00:10:00-04:00");
    expect((await call(a)).code).toBe("0000");
    clock.at = Date.parse("2026-11-01T23:59:59-05:00");
    expect((await call(a)).code).toBe("4013");
    clock.at = Date.parse("2026-11-02T00:00:00-05:00");
    expect((await call(a)).code).toBe("0000");
  });

  it("keeps one account's day apart from another's", async () => {
    const east = await gw.newAccount({ dailyMax: 1, zone: "Asia/Shanghai", expires: "2030-01-01" });
    const west = await gw.newAccount({ dailyMax: 1, zone: "America/New_York", expires: "2030-01-01" });
    clock.at = Date.parse("2026-06-01T15:30:00Z"); // 23:30 in Shanghai, 11:30 in New York
    expect((await call(east)).code).toBe("0000");
    expect((await call(west)).code).toBe("0000");
    clock.at = Date.parse("2026-06-01T16:30:00Z"); // past midnight in Shanghai only
    expect((await call(east)).code).toBe("0000");
    expect((await call(west)).code).toBe("4013");
  });

  it("expires a key after its last day, in the account's zone", async () => {
    const a = await gw.newAccount({ zone: "Asia/Shanghai", expires: "2026-07-01" });
    clock.at = Date.parse("2026-07-01T23:59:59+08:00");
    expect((await call(a)).code).toBe("0000");
    clock.at = Date.parse("2026-07-02T00:00:00+08:00");
    const expired = await legacyGet(gw.base, "/retail/item_get/", { key: a.key, secret: a.secret, num_iid: demo.retailNumIid });
    expect(expired.json.error_code).toBe("4005");
    expect(expired.json.reason).toBe("the key expired on 2026-07-01");
  });
});
