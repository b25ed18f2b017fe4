// Issue 13, property 6 at the port: one response cache shared by replicas through Redis.
import { randomBytes } from "node:crypto";
import type { Redis } from "ioredis";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { importRecords } from "../src/catalogue/catalogue-import.ts";
import { demoRecords } from "../src/catalogue/demo-dataset.ts";
import { CachedCatalogue, defaultCachePolicy } from "../src/core/cached-catalogue.ts";
import { LateAnswer, type CatalogueSource } from "../src/core/catalogue-source.ts";
import { GatewayError } from "../src/core/gateway-error.ts";
import { heldInPlace } from "../src/core/message-shape.ts";
import { retailItemGet } from "../src/operations/retail-item-get.ts";
import { wholesaleItemGet } from "../src/operations/wholesale-item-get.ts";
import { wholesaleItemSearchPeerbuy } from "../src/operations/wholesale-item-search-peerbuy.ts";
import { EmbeddedCatalogue } from "../src/stores/embedded/catalogue-store.ts";
import { openDatabase } from "../src/stores/embedded/sqlite-database.ts";
import { openRedis } from "../src/stores/redis/redis-client.ts";
import { RedisResponseCache } from "../src/stores/redis/response-cache.ts";
import { RedisAddressLockout } from "../src/stores/redis/address-lockout.ts";
import { RedisLink } from "../src/stores/redis/redis-link.ts";
import { RedisProviderWaits } from "../src/stores/redis/provider-waits.ts";
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

  it("a replica waiting out another's claim when Redis goes away does not buy the item: refused, 4000 naming Redis", async () => {
    const source = countingSource(0);
    const connection = await client();
    const r = new CachedCatalogue(new Map([["retail", source]]), new RedisResponseCache(connection, { prefix }), { ...defaultCachePolicy, claimMs: 400 });
    const other = { num_iid: (demoRecords().filter((l) => l.kind === "item_detail")[11]!.item as { num_iid: string }).num_iid, is_promotion: "" };
    const key = [retailItemGet.id, other.num_iid, other.is_promotion, "cn"].join("\u0000");
    await (await client()).set(`${prefix}claim:${key}`, "a-replica-buying-it", "PX", 400, "NX");
    const answer = refusal(() => r.answer(retailItemGet, other, "cn", true, signal));
    await new Promise((x) => setTimeout(x, 100));
    connection.disconnect();
    const refused = (await answer) as GatewayError;
    expect([refused.code, refused.message]).toEqual([4000, expect.stringContaining("the shared cache (Redis) cannot be reached")]);
    expect(source.calls).toBe(0);
  });

  it("an item whose purchase answers after its caller's time is bought once: the other replicas wait for its entry", async () => {
    // A paid source that answers the first purchase late (as UpstreamSource does past its attempt's time): the caller
    // is told 4017 and the answer comes 300 ms later.
    let calls = 0;
    const late: CatalogueSource = {
      label: "late",
      async fetch(op, args) {
        calls++;
        const landing = new Promise<Awaited<ReturnType<CatalogueSource["fetch"]>>>((r) => setTimeout(() => r(catalogue.fetch(op, args)), 300));
        throw new LateAnswer("the upstream provider did not answer within 100 ms", landing, 100);
      },
    };
    const [a, b] = await Promise.all([replica(late), replica(late)]);
    const other = { num_iid: (demoRecords().filter((l) => l.kind === "item_detail")[13]!.item as { num_iid: string }).num_iid, is_promotion: "" };
    expect(((await refusal(() => a.answer(retailItemGet, other, "cn", true, signal))) as GatewayError).code).toBe(4017);
    // Replica b finds a's claim still held while the answer is awaited, and waits for the entry rather than buy it.
    const answer = await b.answer(retailItemGet, other, "cn", true, signal);
    expect(answer.answer.found).toBe(true);
    expect(calls).toBe(1);
    // And on replica a, the call sent again is a hit.
    expect((await a.answer(retailItemGet, other, "cn", true, signal)).fromCache).toBe(true);
    expect(calls).toBe(1);
  });

  it("an entry lost in Redis is a miss, bought again", async () => {
    const source = countingSource(0);
    const r = await replica(source);
    const other = { num_iid: (demoRecords().filter((l) => l.kind === "item_detail")[7]!.item as { num_iid: string }).num_iid, is_promotion: "" };
    await r.answer(retailItemGet, other, "cn", true, signal);
    const keys = await clients[0]!.keys(`${prefix}*`);
    await clients[0]!.del(...keys);
    await new Promise((x) => setTimeout(x, 1100)); // past the in-process tier
    expect((await r.answer(retailItemGet, other, "cn", true, signal)).fromCache).toBe(false);
    expect(source.calls).toBe(2);
  });

  it("without Redis, a replica answers from its own copies and the gateway's catalogue, at once; only a paid item it does not hold is refused, 4000 naming Redis, unbought", async () => {
    const paid = countingSource(0);
    const reads = { n: 0 };
    const local: CatalogueSource = { label: "embedded", local: true, fetch: async (op, args) => (reads.n++, catalogue.fetch(op, args)) };
    const connection = await client();
    const cache = new RedisResponseCache(connection, { prefix: `${prefix}alone:` });
    const r = new CachedCatalogue(new Map([["retail", paid], ["wholesale", local]]), cache, defaultCachePolicy);
    const ids = demoRecords().filter((l) => l.kind === "item_detail").map((l) => (l.item as { num_iid: string }).num_iid);
    const [held, notHeld] = [{ num_iid: ids[8]!, is_promotion: "" }, { num_iid: ids[9]!, is_promotion: "" }];
    const bought = await r.answer(retailItemGet, held, "cn", true, signal);
    expect(paid.calls).toBe(1);

    connection.disconnect(); // Redis is gone for this replica, for good
    await new Promise((x) => setTimeout(x, 1100)); // past the in-process tier's second
    // Its own copy, fresh, is served: the first read that fails tells the replica Redis is down.
    const again = await r.answer(retailItemGet, held, "cn", true, signal);
    expect([again.fromCache, again.answer]).toEqual([true, bought.answer]);
    // From then on Redis is not asked: a read is answered at once, from this replica's memory.
    expect(cache.get(`${retailItemGet.id}\u0000${held.num_iid}\u0000\u0000cn`)).not.toBeInstanceOf(Promise);
    expect(cache.get(`${retailItemGet.id}\u0000${notHeld.num_iid}\u0000\u0000cn`)).toBeUndefined();
    // A paid item it does not hold is not bought: without a claim two replicas could both buy it.
    const refused = (await refusal(() => r.answer(retailItemGet, notHeld, "cn", true, signal))) as GatewayError;
    expect([refused.code, refused.message]).toEqual([4000, expect.stringContaining("the shared cache (Redis) cannot be reached")]);
    expect(paid.calls).toBe(1);
    // The gateway's own catalogue answers (no purchase to share), and what it stores is kept here.
    const wholesale = { num_iid: demo.wholesaleNumIid, is_promotion: "1" };
    const read = [];
    for (let i = 0; i < 3; i++) read.push(await r.answer(wholesaleItemGet, wholesale, "cn", true, signal));
    expect(read.map((a) => [a.answer.found, a.fromCache])).toEqual([[true, false], [true, false], [true, true]]);
    expect(reads.n).toBe(2); // kept from its second read (doorkeeper.ts), as with Redis
    // An operator's purge cannot reach the other replicas' entries: refused, saying so.
    expect(((await refusal(() => cache.purge(retailItemGet.id))) as GatewayError).message).toContain("purge again once it answers");
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
    // An address it has not seen, or saw over a second ago, is asked about: Redis is gone, so a's own count
    // decides (the next test): nothing counted, not locked.
    for (const [ip, at] of [["192.0.2.3", now + 700], ["192.0.2.2", now + 1100]] as const) expect(await refusal(() => a.check(ip, at))).toBeUndefined();
    a.close();
    b.close();
  });

  it("without Redis, a replica keeps the locks it knew and counts failures alone, locking an address at the limit", async () => {
    const options = { slowAfterFailures: 1, lockAfterFailures: 3, lockSeconds: 60 };
    const connection = await client();
    const l = new RedisAddressLockout(connection, options, prefix);
    const now = Date.now();
    for (let i = 0; i < 3; i++) await l.failed("192.0.2.40", now + i); // locked in Redis, and known here
    connection.disconnect();
    const code = async (ip: string, at: number) => ((await refusal(() => l.check(ip, at))) as GatewayError | undefined)?.code;
    expect(await code("192.0.2.40", now + 10)).toBe(4008);
    // Counted here: held back from the first failure past `slowAfterFailures`, locked at the third.
    expect(await code("192.0.2.41", now + 10)).toBeUndefined();
    const holds = [];
    for (let i = 0; i < 3; i++) holds.push(await l.failed("192.0.2.41", now + 20 + i));
    expect(holds).toEqual([100, 200, 0]);
    expect(await code("192.0.2.41", now + 30)).toBe(4008);
    // Another address is not touched, and is answered at once: Redis is not asked.
    expect(l.check("192.0.2.42", now + 30)).toBeUndefined();
    l.close();
  });
});

describe("a provider's waits (its Retry-After) shared in Redis", () => {
  it("reach every other replica as told, a shorter one than kept does not, and a replica that starts during a wait holds to what is left", async () => {
    const links = (await Promise.all([client(), client(), client()])).map((c) => new RedisLink(c));
    const [a, b, c] = links.map((l) => new RedisProviderWaits(l, prefix)) as [RedisProviderWaits, RedisProviderWaits, RedisProviderWaits];
    const heard: string[] = [];
    for (const [name, waits] of [["a", a], ["b", b], ["c", c]] as const) {
      waits.listen("retail", (ms) => heard.push(`${name} retail ${ms}`));
      waits.listen("wholesale", (ms) => heard.push(`${name} wholesale ${ms}`));
    }
    // Each replica subscribed: a wait told before would have been missed otherwise (it is read from its key then).
    await vi.waitFor(async () => expect(Number(((await links[0]!.redis.pubsub("NUMSUB", `${prefix}provider-wait`)) as [string, number])[1])).toBe(3));
    a.tell("retail", 3000);
    await vi.waitFor(() => expect(heard.sort()).toEqual(["b retail 3000", "c retail 3000"]), { timeout: 2000, interval: 5 });
    // A shorter wait than the one kept changes nothing, anywhere.
    b.tell("retail", 1000);
    const kept = await links[0]!.redis.pttl(`${prefix}provider-wait:retail`);
    expect(kept).toBeGreaterThan(1000);
    // A replica that starts now holds to what is left of the wait; the other catalogue is not held.
    const late = new RedisProviderWaits(new RedisLink(await client()), prefix);
    const left: number[] = [];
    late.listen("retail", (ms) => left.push(ms));
    late.listen("wholesale", (ms) => left.push(-ms));
    // (Read as it listens, and again once its subscription is made: each a hold to what is left.)
    await vi.waitFor(() => expect(left.length).toBeGreaterThan(0));
    await new Promise((r) => setTimeout(r, 100));
    expect(left.every((ms) => ms > 1000 && ms <= 3000)).toBe(true);
    expect(heard.sort()).toEqual(["b retail 3000", "c retail 3000"]);
    for (const w of [a, b, c, late]) w.close();
  });

  it("without Redis, a wait told is this replica's own, and telling it throws nothing", async () => {
    const connection = await client();
    const link = new RedisLink(connection);
    const waits = new RedisProviderWaits(link, prefix);
    connection.disconnect();
    await refusal(() => link.run((r) => r.ping()));
    expect(link.up).toBe(false);
    expect(() => waits.tell("wholesale", 5000)).not.toThrow();
    expect(await (await client()).exists(`${prefix}provider-wait:wholesale`)).toBe(0);
    waits.close();
    link.close();
  });
});
