// Issue 13, property 6 at the port: one response cache shared by replicas through Redis.
import { randomBytes } from "node:crypto";
import type { Redis } from "ioredis";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { importRecords } from "../src/catalogue/catalogue-import.ts";
import { demoRecords } from "../src/catalogue/demo-dataset.ts";
import { CachedCatalogue, defaultCachePolicy } from "../src/core/cached-catalogue.ts";
import type { CatalogueSource } from "../src/core/catalogue-source.ts";
import { GatewayError } from "../src/core/gateway-error.ts";
import { heldInPlace } from "../src/core/message-shape.ts";
import { retailItemGet } from "../src/operations/retail-item-get.ts";
import { wholesaleItemSearchPeerbuy } from "../src/operations/wholesale-item-search-peerbuy.ts";
import { EmbeddedCatalogue } from "../src/stores/embedded/catalogue-store.ts";
import { openDatabase } from "../src/stores/embedded/sqlite-database.ts";
import { openRedis } from "../src/stores/redis/redis-client.ts";
import { RedisResponseCache } from "../src/stores/redis/response-cache.ts";
import { RedisAddressLockout } from "../src/stores/redis/address-lockout.ts";
import { demo } from "./support/gateway-fixture.ts";

const redisUrl = process.env.GATEWAY_TEST_REDIS_URL ?? "redis://127.0.0.1:6379";
// This file's own keys, so files (and repeated runs) never meet in the one Redis.
const prefix = `gw-test-${randomBytes(4).toString("hex")}:`;
const clients: Redis[] = [];
let catalogue: EmbeddedCatalogue;

beforeAll(async () => {
  catalogue = new EmbeddedCatalogue(openDatabase(":memory:"));
  await importRecords(catalogue, demoRecords(), { storedAt: 1_700_000_000 });
});
afterAll(async () => {
  if (clients[0]) {
    const keys = await clients[0].keys(`${prefix}*`);
    if (keys.length > 0) await clients[0].del(...keys);
  }
  for (const c of clients) c.disconnect();
});

/** What a port call failed with, whether it threw at once or rejected (ports may answer at once: MaybeAsync), or undefined. */
async function refusal(call: () => unknown): Promise<unknown> {
  try {
    await call();
    return undefined;
  } catch (e) {
    return e;
  }
}

async function client(): Promise<Redis> {
  const c = await openRedis(redisUrl);
  clients.push(c);
  return c;
}

/** The demo catalogue as a paid source that takes its time and counts what it sells; each sale is stored anew. */
function countingSource(delayMs: number): CatalogueSource & { calls: number } {
  let stamp = 1_700_000_000;
  const source = {
    label: "counted",
    calls: 0,
    async fetch(op: Parameters<CatalogueSource["fetch"]>[0], args: Parameters<CatalogueSource["fetch"]>[1]) {
      source.calls++;
      await new Promise((r) => setTimeout(r, delayMs));
      const answer = await catalogue.fetch(op, args);
      return answer.found ? { ...answer, storedAt: ++stamp, token: `${answer.token.slice(0, 24)}${String(stamp).slice(-8)}` } : answer;
    },
  };
  return source;
}

async function replica(source: CatalogueSource, claimMs = 3000): Promise<CachedCatalogue> {
  const cache = new RedisResponseCache(await client(), { prefix });
  return new CachedCatalogue(new Map([["retail", source], ["wholesale", source]]), cache, { ...defaultCachePolicy, claimMs });
}

const item = { num_iid: demo.retailNumIid, is_promotion: "1" };
const signal = new AbortController().signal;

describe("the response cache shared through Redis", () => {
  it("the same item asked at once on three replicas is bought once, and every caller gets it", async () => {
    const source = countingSource(150);
    const replicas = await Promise.all([replica(source), replica(source), replica(source)]);
    const answers = await Promise.all(Array.from({ length: 30 }, (_, i) => replicas[i % 3]!.answer(retailItemGet, item, "cn", true, signal)));
    expect(source.calls).toBe(1);
    const tokens = new Set(answers.map((a) => (a.answer.found ? a.answer.token : "none")));
    expect(tokens.size).toBe(1);
    expect(answers.every((a) => a.answer.found && (a.answer.value as { numIid: string }).numIid === demo.retailNumIid)).toBe(true);
    // Later calls on any replica are hits, decoded from what the first one stored.
    const later = await replicas[2]!.answer(retailItemGet, item, "cn", true, signal);
    expect(later.fromCache).toBe(true);
    expect(later.answer).toEqual(answers[0]!.answer);
    // Decoded into a message in fast mode, as a store's read makes it, and counted so (message-shape.ts).
    expect(later.answer.found && heldInPlace(later.answer.value as object)).toBe(true);
  });

  it("the gateway's own catalogue asked at once on three replicas answers at once on each: no claim, no wait", async () => {
    // A local source's first answer is not kept (doorkeeper.ts): a replica waiting on another's claim would wait it out.
    const reads = { n: 0 };
    const local: CatalogueSource = { label: "embedded", local: true, fetch: async (op, args) => (reads.n++, catalogue.fetch(op, args)) };
    const replicas = await Promise.all([replica(local, 3000), replica(local, 3000), replica(local, 3000)]);
    const started = Date.now();
    const fresh = { num_iid: demoRecords().map((r) => (r.item as { num_iid?: string }).num_iid).find((id) => id !== undefined && id !== demo.retailNumIid)!, is_promotion: "1" };
    const answers = await Promise.all(replicas.map((r) => r.answer(retailItemGet, fresh, "cn", true, signal)));
    expect(Date.now() - started).toBeLessThan(1500);
    expect(answers.every((a) => a.answer.found)).toBe(true);
    expect(reads.n).toBe(3);
  });

  it("keeps lists and 2000s too, and a cache=no refresh on one replica is what the others serve within a second", async () => {
    const source = countingSource(0);
    const [a, b] = await Promise.all([replica(source), replica(source)]);
    const peers = { num_iid: demo.wholesaleNumIid, sid: demo.wholesaleSid };
    const first = await a.answer(wholesaleItemSearchPeerbuy, peers, "cn", true, signal);
    expect((await b.answer(wholesaleItemSearchPeerbuy, peers, "cn", true, signal)).answer).toEqual(first.answer);
    const missing = await a.answer(retailItemGet, { num_iid: "1", is_promotion: "" }, "cn", true, signal);
    expect(missing.answer.found).toBe(false);
    expect((await b.answer(retailItemGet, { num_iid: "1", is_promotion: "" }, "cn", true, signal)).fromCache).toBe(true);

    const refreshed = await a.answer(wholesaleItemSearchPeerbuy, peers, "cn", false, signal);
    expect(refreshed.answer.found && first.answer.found && refreshed.answer.token !== first.answer.token).toBe(true);
    await new Promise((r) => setTimeout(r, 1100));
    expect((await b.answer(wholesaleItemSearchPeerbuy, peers, "cn", true, signal)).answer).toEqual(refreshed.answer);
    expect(source.calls).toBe(3);
  });

  it("a replica that dies holding a claim costs the others a wait of the claim's length, never an answer", async () => {
    const source = countingSource(0);
    const r = await replica(source, 400);
    const c = await client();
    const other = { num_iid: (demoRecords().filter((l) => l.kind === "item_detail")[5]!.item as { num_iid: string }).num_iid, is_promotion: "" };
    const key = [retailItemGet.id, other.num_iid, other.is_promotion, "cn"].join("\u0000");
    await c.set(`${prefix}claim:${key}`, "dead-replica", "PX", 400, "NX");
    const started = Date.now();
    const answer = await r.answer(retailItemGet, other, "cn", true, signal);
    expect(answer.answer.found).toBe(true);
    expect(Date.now() - started).toBeGreaterThanOrEqual(300);
    expect(source.calls).toBe(1);
  });

  it("an entry lost in Redis is a miss, bought again; a Redis that cannot be reached is a 4000 naming it", async () => {
    const source = countingSource(0);
    const r = await replica(source);
    const other = { num_iid: (demoRecords().filter((l) => l.kind === "item_detail")[7]!.item as { num_iid: string }).num_iid, is_promotion: "" };
    await r.answer(retailItemGet, other, "cn", true, signal);
    const keys = await clients[0]!.keys(`${prefix}*`);
    await clients[0]!.del(...keys);
    await new Promise((x) => setTimeout(x, 1100)); // past the in-process tier
    expect((await r.answer(retailItemGet, other, "cn", true, signal)).fromCache).toBe(false);
    expect(source.calls).toBe(2);

    const gone = await client();
    gone.disconnect();
    const cache = new RedisResponseCache(gone, { prefix });
    const e = await refusal(() => cache.get("retail/item_get\u00001\u0000\u0000cn"));
    expect(e).toBeInstanceOf(GatewayError);
    expect((e as GatewayError).code).toBe(4000);
    expect((e as GatewayError).message).toContain("shared cache (Redis)");
  });
});

describe("an operator's purge of the shared cache", () => {
  it("drops an item's answers for every replica, of one operation or all, and nothing of another item, operation or gateway", async () => {
    const source = countingSource(0);
    // Keys of this test's own, apart from what the tests before stored under the file's prefix.
    const own = `${prefix}purge:`;
    const sharing = async (keyPrefix: string) => new CachedCatalogue(new Map([["retail", source], ["wholesale", source]]), new RedisResponseCache(await client(), { prefix: keyPrefix }), defaultCachePolicy);
    const [a, b] = await Promise.all([sharing(own), sharing(own)]);
    const other = demoRecords().map((r) => (r.item as { num_iid?: string }).num_iid).find((id) => id !== undefined && id !== demo.retailNumIid && /^6/.test(id))!;
    const variants = [item, { num_iid: demo.retailNumIid, is_promotion: "" }, { num_iid: other, is_promotion: "1" }];
    for (const v of variants) await a.answer(retailItemGet, v, "cn", true, signal);
    const peers = { num_iid: demo.wholesaleNumIid, sid: demo.wholesaleSid };
    await a.answer(wholesaleItemSearchPeerbuy, peers, "cn", true, signal);
    // A gateway whose key prefix holds MATCH's special characters: escaped, its keys match only its own purges.
    const odd = await sharing(`${own}odd*[x]?\\:`);
    await odd.answer(retailItemGet, item, "cn", true, signal);
    const calls = source.calls;

    // The item's two variants, from Redis; b's purge reaches a's next read (a's own copies last up to a second).
    expect(await b.purge([retailItemGet], demo.retailNumIid)).toBe(2);
    await new Promise((r) => setTimeout(r, 1100));
    expect((await a.answer(retailItemGet, item, "cn", true, signal)).fromCache).toBe(false);
    expect(source.calls).toBe(calls + 1);
    for (const [op, args] of [[retailItemGet, variants[2]!], [wholesaleItemSearchPeerbuy, peers]] as const) expect((await a.answer(op, args, "cn", true, signal)).fromCache).toBe(true);
    expect((await odd.answer(retailItemGet, item, "cn", true, signal)).fromCache).toBe(true);
    // The purging replica's own copy goes at once.
    await b.answer(retailItemGet, variants[2]!, "cn", true, signal);
    expect(await b.purge([retailItemGet, wholesaleItemSearchPeerbuy], other)).toBe(1);
    expect((await b.answer(retailItemGet, variants[2]!, "cn", true, signal)).fromCache).toBe(false);
    // An operation's every item; the odd gateway's keys stay until it purges them itself.
    expect(await a.purge([wholesaleItemSearchPeerbuy], undefined)).toBe(1);
    expect(await odd.purge([retailItemGet], undefined)).toBe(1);
    // What is left: the two retail answers bought again since; the odd gateway's are gone.
    expect(await (await client()).keys(`${own}*`)).toHaveLength(2);
  });
});

describe("failed authentications counted in Redis", () => {
  it("replicas count one address's failures together, lock it everywhere, and let it go when the lock ends", async () => {
    const options = { slowAfterFailures: 2, lockAfterFailures: 6, lockSeconds: 1 };
    const [a, b, c] = (await Promise.all([client(), client(), client()])).map((x) => new RedisAddressLockout(x, options, prefix)) as [RedisAddressLockout, RedisAddressLockout, RedisAddressLockout];
    const now = Date.now();
    const holds = await Promise.all(Array.from({ length: 5 }, (_, i) => [a, b, c][i % 3]!.failed("198.51.100.7", now + i)));
    // Counted together: the 1st to 5th failure from the address, whichever replica saw each, held back 0, 100, … 400 ms.
    expect(holds.sort((x, y) => x - y)).toEqual([0, 100, 200, 300, 400]);
    await a.check("198.51.100.7", now); // five failures: slowed, not locked
    await b.failed("198.51.100.7", now + 10); // the sixth, on another replica
    const refused = async (l: RedisAddressLockout) => ((await refusal(() => l.check("198.51.100.7", now + 11))) as GatewayError | undefined)?.code;
    // At once on the replica that locked it and on one that asks Redis about the address…
    expect(await refused(b)).toBe(4008);
    expect(await refused(c)).toBe(4008);
    // …and, on one that found it not locked a moment ago, as soon as the lock's message arrives:
    // its check times stay within a second of that finding, so only the message can refuse them.
    await vi.waitFor(async () => expect(await refused(a)).toBe(4008), { timeout: 500, interval: 5 });
    await c.check("203.0.113.50", now); // another address is not touched
    await new Promise((r) => setTimeout(r, 1100));
    await a.check("198.51.100.7", Date.now());
    for (const l of [a, b, c]) l.close();
  });

  it("remembers at most its bound of locked addresses, and asks Redis about the rest", async () => {
    const l = new RedisAddressLockout(await client(), { slowAfterFailures: 5, lockAfterFailures: 1, lockSeconds: 60, rememberedAddresses: 2 }, prefix);
    const now = Date.now();
    const ips = ["192.0.2.11", "192.0.2.12", "192.0.2.13"];
    for (const ip of ips) await l.failed(ip, now); // each locked at its first failure
    expect((l as unknown as { locked: Map<string, number> }).locked.size).toBe(2);
    for (const ip of ips) expect(((await refusal(() => l.check(ip, now + 1))) as GatewayError).code).toBe(4008);
    l.close();
  });

  it("a replica asks Redis about an address once a second, and hears of a lock made elsewhere at once", async () => {
    const options = { slowAfterFailures: 2, lockAfterFailures: 3, lockSeconds: 60 };
    const [near, far] = await Promise.all([client(), client()]);
    const a = new RedisAddressLockout(near, options, prefix);
    const b = new RedisAddressLockout(far, options, prefix);
    await vi.waitFor(() => expect(a.isListening && b.isListening).toBe(true));
    const now = Date.now();
    await a.check("192.0.2.1", now);
    await a.check("192.0.2.2", now);
    // From here a cannot reach Redis itself; only its subscription is left.
    near.disconnect();
    await a.check("192.0.2.1", now + 500); // found not locked half a second ago: not asked again
    for (let i = 0; i < 3; i++) await b.failed("192.0.2.1", now + 600 + i); // locked by b
    await vi.waitFor(async () => expect(((await refusal(() => a.check("192.0.2.1", now + 700))) as GatewayError).code).toBe(4008));
    await a.check("192.0.2.2", now + 700);
    // An address it has not seen, or saw over a second ago, is asked about: Redis is gone, so 4000.
    for (const [ip, at] of [["192.0.2.3", now + 700], ["192.0.2.2", now + 1100]] as const) {
      const e = await refusal(() => a.check(ip, at));
      expect((e as GatewayError).code).toBe(4000);
    }
    a.close();
    b.close();
  });
});
