import http from "node:http";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { MemoryAddressLockout } from "../src/core/address-lockout.ts";
import { demo, startGateway, type GatewayFixture } from "./support/gateway-fixture.ts";

let gw: GatewayFixture;
beforeAll(async () => {
  gw = await startGateway({ config: { authSlowAfter: 3, authLockAfter: 6, authLockSeconds: 60 } });
});
afterAll(() => gw.close());

/** A legacy call from a chosen loopback address. */
function call(from: string, secret: string): Promise<{ code: string; reason: string; ms: number }> {
  const q = new URLSearchParams({ key: gw.account.key, secret, num_iid: demo.retailNumIid });
  const started = performance.now();
  return new Promise((resolve, reject) => {
    http
      .get(`${gw.base}/retail/item_get/?${q}`, { localAddress: from, agent: false }, (res) => {
        let body = "";
        res.on("data", (d: Buffer) => (body += d.toString()));
        res.on("end", () => {
          const json = JSON.parse(body) as { error_code: string; reason: string };
          resolve({ code: json.error_code, reason: json.reason, ms: performance.now() - started });
        });
      })
      .on("error", reject);
  });
}

describe("repeated authentication failures from one address", () => {
  it("are slowed, then refused with 4008 for a while, without touching other addresses", async () => {
    const attacker = "127.0.0.1";
    const results = [];
    for (let i = 0; i < 6; i++) results.push(await call(attacker, `guess-${i}`));
    expect(results.map((r) => r.code)).toEqual(["4005", "4005", "4005", "4005", "4005", "4005"]);
    // From the third failure on, answers are held back (100 ms, then 200 ms, …).
    expect(results[2]!.ms).toBeGreaterThanOrEqual(90);
    expect(results[3]!.ms).toBeGreaterThanOrEqual(190);

    const locked = await call(attacker, gw.account.secret);
    expect(locked.code).toBe("4008");
    expect(locked.reason).toMatch(/^too many failed authentications from this address; try again in \d+ s$/);
    // A refused address is refused before any account lookup, even with the right secret, and quickly.
    expect(locked.ms).toBeLessThan(1000);

    const bystander = "127.0.0.2";
    expect((await call(bystander, gw.account.secret)).code).toBe("0000");
    expect((await call(bystander, "wrong")).code).toBe("4005");
  });
});

describe("a lock, after the clock steps back", () => {
  it("holds the address a whole lock at most, not the step besides", async () => {
    const lockout = new MemoryAddressLockout({ slowAfterFailures: 1, lockAfterFailures: 3, lockSeconds: 60 });
    const t0 = 1_800_000_000_000;
    for (let i = 0; i < 3; i++) await lockout.failed("192.0.2.7", t0);
    expect(() => lockout.check("192.0.2.7", t0 + 1000)).toThrow("too many failed authentications from this address; try again in 59 s");
    // An hour back: still locked, for the lock's 60 s from now, and free once they have passed.
    const back = t0 - 3_600_000;
    expect(() => lockout.check("192.0.2.7", back)).toThrow("too many failed authentications from this address; try again in 60 s");
    expect(() => lockout.check("192.0.2.7", back + 59_999)).toThrow("try again in 1 s");
    expect(() => lockout.check("192.0.2.7", back + 60_000)).not.toThrow();
    expect(() => lockout.check("192.0.2.8", back)).not.toThrow();
  });
});

describe("the addresses a lockout holds", () => {
  const t0 = 1_800_000_000_000;
  const lockedMessage = /too many failed authentications from this address/;

  it("are forgotten as other addresses fail, once their failures have left the window; a lock is kept until it ends", async () => {
    const lockout = new MemoryAddressLockout({ slowAfterFailures: 1, lockAfterFailures: 3, failureWindowSeconds: 60, lockSeconds: 300 });
    for (let i = 0; i < 3; i++) await lockout.failed("192.0.2.1", t0);
    for (let i = 0; i < 1000; i++) await lockout.failed(`198.51.100.${i % 250}:${i}`, t0);
    // A window later, as many new addresses fail: the old ones are gone, the locked one stays.
    for (let i = 0; i < 1000; i++) await lockout.failed(`203.0.113.${i % 250}:${i}`, t0 + 61_000);
    expect(lockout.addresses).toBe(1001);
    expect(() => lockout.check("192.0.2.1", t0 + 61_000)).toThrow(lockedMessage);
    // Past the lock: it goes too.
    for (let i = 0; i < 2000; i++) await lockout.failed(`2001:db8::${i.toString(16)}`, t0 + 301_000);
    expect(lockout.addresses).toBe(2000);
    expect(() => lockout.check("192.0.2.1", t0 + 301_000)).not.toThrow();
  });

  it("past 100,000 within one window, are the locked ones and the latest: each failure costs the same, and no lock is forgotten early", async () => {
    // Before, each new address past 100,000 looked at every one held to forget none (all within the window):
    // 6,000 failures a second became 340, for every caller of the gateway.
    const lockout = new MemoryAddressLockout({ slowAfterFailures: 1, lockAfterFailures: 3, failureWindowSeconds: 60, lockSeconds: 300 });
    for (let i = 0; i < 3; i++) await lockout.failed("192.0.2.1", t0);
    for (let i = 0; i < 150_000; i++) await lockout.failed(`2001:db8::${i.toString(16)}`, t0 + 1000);
    expect(lockout.addresses).toBeLessThanOrEqual(100_001);
    expect(() => lockout.check("192.0.2.1", t0 + 2000)).toThrow(lockedMessage);
    // The latest failures are still counted: a third from the last address locks it.
    const last = `2001:db8::${(149_999).toString(16)}`;
    await lockout.failed(last, t0 + 2000);
    await lockout.failed(last, t0 + 2000);
    expect(() => lockout.check(last, t0 + 2000)).toThrow(lockedMessage);
  });
});
