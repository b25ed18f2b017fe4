import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { demoRecords } from "../src/catalogue/demo-dataset.ts";
import { legacySign, legacySigningKey } from "../src/core/legacy-signature.ts";
import { RetailService } from "../src/gen/gateway/catalogue/v1/retail_pb.js";
import { AdminService } from "../src/gen/gateway/admin/v1/admin_pb.js";
import { StatusBlockSchema } from "../src/gen/gateway/catalogue/v1/status_pb.js";
import { retailItemGet } from "../src/operations/retail-item-get.ts";
import { LateAnswer } from "../src/core/catalogue-source.ts";
import { noTelemetry } from "../src/core/telemetry.ts";
import { longestUpstreamHoldMs, retryAfterMs, UpstreamSource } from "../src/sources/upstream/upstream-source.ts";
import { FakeUpstream, type Behaviour } from "./support/fake-upstream.ts";
import { adminToken, demo, legacyGet, startGateway, type GatewayFixture } from "./support/gateway-fixture.ts";

const upstreamKey = "UPKEY-9f3a1c";
const upstreamSecret = "UPSECRET-7d2e41b0c9a84f55aa";
const retailIds = demoRecords().filter((r) => r.kind === "item_detail" && r.obtainable).map((r) => (r.item as { num_iid: string }).num_iid);
let nextId = 0;
/** A retail item no earlier test has asked for, so the cache has not seen it. */
const freshItem = () => retailIds[++nextId]!;

let upstream: FakeUpstream;
let gw: GatewayFixture;
const logLines: string[] = [];
const bodies: string[] = [];
const clock = { at: Date.now(), now() { return this.at; } };

/** A gateway whose sources are the fake upstream (each with a fresh circuit breaker). */
function gatewayOnUpstream() {
  return startGateway({
    clock,
    logLines,
    config: {
      upstreamUrl: upstream.url,
      upstreamKey,
      upstreamSecret,
      upstreamTimeoutMs: 400,
      upstreamDeadlineMs: 1500,
      cacheTtlSeconds: "item_get=60,item_search_peerbuy=60",
      cacheNotFoundTtlSeconds: 10,
      cacheStaleIfErrorSeconds: 300,
    },
  });
}

beforeAll(async () => {
  upstream = await new FakeUpstream().start();
  gw = await gatewayOnUpstream();
});
afterAll(async () => {
  await gw.close();
  await upstream.stop();
});

async function get(numIid: string, extra: Record<string, string> = {}) {
  const r = await legacyGet(gw.base, "/retail/item_get/", { key: gw.account.key, secret: gw.account.secret, num_iid: numIid, ...extra });
  bodies.push(r.body);
  return r.json;
}

/** The gateway's `gateway_upstream_sent_total`, over every operation. */
async function sentMetric(): Promise<number> {
  const text = await (await fetch(`${gw.base}/metrics`)).text();
  return [...text.matchAll(/^gateway_upstream_sent_total\{[^}]*\} (\d+)$/gm)].reduce((n, m) => n + Number(m[1]), 0);
}

function scripted(b: Behaviour) {
  upstream.script = () => b;
}

describe("the upstream source", () => {
  it("serves both operations from the provider, with the gateway's own credentials and the provider's catalogue names", async () => {
    scripted({ kind: "normal" });
    const before = upstream.requests.length;
    const id = freshItem();
    const item = await get(id, { is_promotion: "1" });
    expect(item.error_code).toBe("0000");
    expect(item._ddf).toBeUndefined();
    expect((item.item as { num_iid: string }).num_iid).toBe(id);
    const peers = await legacyGet(gw.base, "/wholesale/item_search_peerbuy/", { key: gw.account.key, secret: gw.account.secret, num_iid: demo.wholesaleNumIid, sid: demo.wholesaleSid });
    expect(peers.json.error_code).toBe("0000");
    expect(peers.json._ddf).toBe("upstream");
    const [a, b] = upstream.requests.slice(before);
    expect(a!.path).toBe("/taobao/item_get/");
    expect(Object.fromEntries(a!.query)).toEqual({ num_iid: id, is_promotion: "1", result_type: "json", lang: "cn", key: upstreamKey, secret: upstreamSecret });
    expect(b!.path).toBe("/1688/item_search_peerbuy/");
    expect(b!.query.get("sid")).toBe(demo.wholesaleSid);
  });

  it("serves the wholesale item detail from the provider's wholesale catalogue, cached, and its sid opens the peer-viewed lookup", async () => {
    scripted({ kind: "normal" });
    const before = upstream.requests.length;
    const auth = { key: gw.account.key, secret: gw.account.secret };
    const detail = await legacyGet(gw.base, "/wholesale/item_get/", { ...auth, num_iid: demo.wholesaleNumIid });
    expect(detail.json.error_code).toBe("0000");
    expect(detail.json.api_type).toBe("wholesale");
    const sid = (detail.json.item as { seller_info: { sid: string } }).seller_info.sid;
    expect(sid).toBe(demo.wholesaleSid);
    const again = await legacyGet(gw.base, "/wholesale/item_get/", { ...auth, num_iid: demo.wholesaleNumIid });
    expect(again.json.cache).toBe(1);
    const peers = await legacyGet(gw.base, "/wholesale/item_search_peerbuy/", { ...auth, num_iid: demo.wholesaleNumIid, sid });
    expect(peers.json.error_code).toBe("0000");
    const asked = upstream.requests.slice(before).map((q) => q.path);
    expect(asked[0]).toBe("/1688/item_get/");
    expect(asked.filter((p) => p === "/1688/item_get/")).toHaveLength(1);
    // The retail catalogue has no such item: each catalogue's item_get is its own.
    const retail = await legacyGet(gw.base, "/retail/item_get/", { ...auth, num_iid: demo.wholesaleNumIid });
    expect(retail.json.error_code).toBe("2000");
    expect(upstream.requests.at(-1)!.path).toBe("/taobao/item_get/");
  });

  it.each([
    ["a slow answer", { kind: "normal", delayMs: 2000 }, "4017"],
    ["HTTP 500", { kind: "status", status: 500 }, "4002"],
    ["HTTP 503 (retried)", { kind: "status", status: 503 }, "4002"],
    ["HTTP 429 (retried)", { kind: "status", status: 429, body: '{"message":"Too Many Requests"}' }, "4002"],
    ["a body that is not JSON", { kind: "garbage" }, "4002"],
    ["0000 without its item", { kind: "zero-without-item" }, "4002"],
    ["its own 4005", { kind: "code", code: "4005", reason: `bad key ${upstreamKey}` }, "4002"],
    ["its own 4013", { kind: "code", code: "4013" }, "4002"],
    ["its own 4008 (retried)", { kind: "code", code: "4008" }, "4002"],
    ["its own 5000", { kind: "code", code: "5000" }, "4002"],
    ["a reset connection", { kind: "reset" }, "4001"],
  ] as [string, Behaviour, string][])("maps %s to %s, uncharged", async (_name, behaviour, code) => {
    scripted(behaviour);
    const a = await gw.newAccount();
    const before = upstream.requests.length;
    const metered = await sentMetric();
    const r = await legacyGet(gw.base, "/retail/item_get/", { key: a.key, secret: a.secret, num_iid: freshItem() });
    bodies.push(r.body);
    expect(r.json.error_code).toBe(code);
    expect(r.json.api_info).toMatch(/^today:0 /);
    const [row] = (await gw.runtime.meter.query({ account: a.key, rows: 5 })).rows;
    expect(row?.charge).toBe("uncharged");
    expect(row?.price).toBe(0n);
    // What the provider may bill for it: every request it received for the call, retries included.
    expect(row?.upstreamRequests).toBe(upstream.requests.length - before);
    expect(row?.upstreamRequests).toBeGreaterThan(0);
    // And the metric an operator graphs counts the same.
    expect((await sentMetric()) - metered).toBe(row?.upstreamRequests);
    scripted({ kind: "normal" });
  });

  it("tries again a provider holding the gateway's calls back (its 4008, 4009), not one refusing its account, and counts each by its code", async () => {
    const refused: string[] = [];
    const outcomes: string[] = [];
    const telemetry = { ...noTelemetry, upstreamRefused: (_op: string, code: string) => void refused.push(code), upstreamRequest: (_op: string, outcome: string) => void outcomes.push(outcome) };
    const source = new UpstreamSource({ url: upstream.url, catalogue: "taobao", key: upstreamKey, secret: upstreamSecret, breakerMinimumRps: 1e9, telemetry });
    const ask = (sent: { count: number }) => source.fetch(retailItemGet, { num_iid: demo.retailNumIid, is_promotion: "" }, undefined, undefined, sent).then((a) => a.found, (e: Error & { code?: number }) => `${e.code} ${e.message}`);
    // Held back once for each reason, then answered: the call gets its item, having sent three requests.
    let n = 0;
    upstream.script = () => (++n === 1 ? { kind: "code", code: "4008" } : n === 2 ? { kind: "code", code: "4009" } : { kind: "normal" });
    const held = { count: 0 };
    expect(await ask(held)).toBe(true);
    expect([held.count, refused, outcomes]).toEqual([3, ["4008", "4009"], ["ok"]]);
    // Its balance spent: refused at once, not tried again.
    scripted({ kind: "code", code: "4016" });
    const spent = { count: 0 };
    expect(await ask(spent)).toBe("4002 the upstream provider refused the gateway's call (its code 4016); the operator must check the upstream account");
    expect([spent.count, refused.at(-1), outcomes.at(-1)]).toEqual([1, "4016", "refused"]);
    // Held back past the retries: 4002, saying so.
    scripted({ kind: "code", code: "4008" });
    expect(await ask({ count: 0 })).toBe("4002 the upstream provider is holding the gateway's calls back (its code 4008: its limit on the gateway's calls); ask again shortly");
    await source.close();
    scripted({ kind: "normal" });
    // A gateway exports the same counts.
    const a = await gw.newAccount();
    scripted({ kind: "code", code: "4016" });
    await legacyGet(gw.base, "/retail/item_get/", { key: a.key, secret: a.secret, num_iid: freshItem() });
    scripted({ kind: "normal" });
    const text = await (await fetch(`${gw.base}/metrics`)).text();
    expect(text).toMatch(/^gateway_upstream_refused_total\{operation="retail\/item_get",code="4016"\} [1-9]\d*$/m);
    expect(text).toMatch(/^gateway_upstream_requests_total\{operation="retail\/item_get",outcome="refused"\} [1-9]\d*$/m);
  });

  it("tries again an HTTP 429 (a proxy in front of the provider limiting the gateway), which the provider did not act on", async () => {
    const source = new UpstreamSource({ url: upstream.url, catalogue: "taobao", key: upstreamKey, secret: upstreamSecret, breakerMinimumRps: 1e9 });
    let n = 0;
    upstream.script = () => (++n === 1 ? { kind: "status", status: 429, body: '{"message":"Too Many Requests"}' } : { kind: "normal" });
    const sent = { count: 0 };
    expect((await source.fetch(retailItemGet, { num_iid: demo.retailNumIid, is_promotion: "" }, undefined, undefined, sent)).found).toBe(true);
    expect(sent.count).toBe(2);
    await source.close();
    scripted({ kind: "normal" });
  });

  it("reads a provider's Retry-After as seconds or an HTTP date, held to five minutes", () => {
    const now = Date.parse("2026-11-28T12:00:00Z");
    expect(retryAfterMs("120", now)).toBe(120_000);
    expect(retryAfterMs(" 3 ", now)).toBe(3000);
    expect(retryAfterMs("Sat, 28 Nov 2026 12:00:30 GMT", now)).toBe(30_000);
    expect(retryAfterMs(["7", "9"], now)).toBe(7000);
    expect(retryAfterMs("86400", now)).toBe(longestUpstreamHoldMs);
    // No wait asked for: none, zero, a date past, or something that is neither.
    for (const none of [undefined, "", "0", "Sat, 28 Nov 2026 11:59:00 GMT", "soon", "-5", "1.5"]) expect(retryAfterMs(none, now)).toBeUndefined();
  });

  it("sends nothing to a provider that asked the gateway to wait (Retry-After) until the wait is over, and tells callers when to come back", async () => {
    const g = await gatewayOnUpstream();
    try {
      const a = await g.newAccount();
      const legacy = (numIid: string) => legacyGet(g.base, "/retail/item_get/", { key: a.key, secret: a.secret, num_iid: numIid });
      // An item stored before, and expired: it may stand in while the provider cannot be asked (stale-if-error).
      const storedId = freshItem();
      expect((await legacy(storedId)).json.error_code).toBe("0000");
      clock.at += 120_000;
      scripted({ kind: "status", status: 429, body: '{"message":"Too Many Requests"}', headers: { "retry-after": "2" } });
      const before = upstream.requests.length;
      const limited = await legacy(freshItem());
      expect([limited.json.error_code, limited.json.reason, limited.headers.get("retry-after")]).toEqual([
        "4002",
        "the upstream answered HTTP 429, and asked the gateway to wait 2 s before calling it again (Retry-After); ask again then",
        "2",
      ]);
      // Not tried again within the call: the provider said when.
      expect(upstream.requests.length - before).toBe(1);
      // Until the wait is over nothing is sent, on any path, and each caller is told when to come back.
      scripted({ kind: "normal" });
      const held = await legacy(freshItem());
      expect([held.json.error_code, held.json.reason]).toEqual(["4002", "the upstream provider asked the gateway to wait before calling it again (Retry-After); nothing was sent; ask again in 2 s"]);
      expect(Number(held.headers.get("retry-after"))).toBeGreaterThanOrEqual(1);
      const rpc = await createClient(RetailService, createConnectTransport({ baseUrl: g.base, httpVersion: "1.1" }))
        .itemGet({ numIid: freshItem() }, { headers: { "x-api-key": a.key, "x-api-secret": a.secret } })
        .then(
          () => undefined,
          (e: unknown) => ConnectError.from(e),
        );
      expect(rpc?.code).toBe(Code.Unavailable);
      expect(rpc?.findDetails(StatusBlockSchema)[0]?.errorCode).toBe(4002);
      expect(Number(rpc?.metadata.get("retry-after"))).toBeGreaterThanOrEqual(1);
      const grpc = await createClient(RetailService, createGrpcTransport({ baseUrl: g.base }))
        .itemGet({ numIid: freshItem() }, { headers: { "x-api-key": a.key, "x-api-secret": a.secret } })
        .then(
          () => undefined,
          (e: unknown) => ConnectError.from(e),
        );
      expect([grpc?.code, grpc?.findDetails(StatusBlockSchema)[0]?.errorCode]).toEqual([Code.Unavailable, 4002]);
      expect(Number(grpc?.metadata.get("grpc-retry-pushback-ms"))).toBeGreaterThan(0);
      const stale = await legacy(storedId);
      expect([stale.json.error_code, stale.json.cache]).toEqual(["0000", 1]);
      expect(upstream.requests.length - before).toBe(1);
      const text = await (await fetch(`${g.base}/metrics`)).text();
      expect(text).toMatch(/^gateway_calls_limited_total\{operation="retail\/item_get",limit="upstream"\} 4$/m);
      expect(text).toMatch(/^gateway_upstream_requests_total\{operation="retail\/item_get",outcome="held"\} 4$/m);
      // Once the wait is over, the provider is asked again.
      await new Promise((r) => setTimeout(r, 2100));
      expect((await legacy(freshItem())).json.error_code).toBe("0000");
      expect(upstream.requests.length - before).toBe(2);
    } finally {
      scripted({ kind: "normal" });
      await g.close();
    }
  });

  it("keeps a provider's wait through a restart, even a kill: the gateway started again during it sends nothing until it is over", async () => {
    // Before, the wait lived only in the process told: a gateway started again (a deploy, a crash and its
    // supervisor) sent the provider its next miss at once, inside the wait it had asked for.
    const { mkdtempSync, rmSync } = await import("node:fs");
    const { tmpdir } = await import("node:os");
    const { join } = await import("node:path");
    const { startServe, withoutSecrets } = await import("./support/gateway-process.ts");
    const dataDir = mkdtempSync(join(tmpdir(), "gateway-wait-restart-"));
    const env = { GATEWAY_DATA_DIR: dataDir, GATEWAY_ADMIN_TOKEN: adminToken, GATEWAY_SOURCES: "retail=upstream,wholesale=embedded", GATEWAY_UPSTREAM_URL: upstream.url, GATEWAY_UPSTREAM_KEY: upstreamKey, GATEWAY_UPSTREAM_SECRET: upstreamSecret };
    let s = await startServe(env);
    try {
      const created = await fetch(`${s.base}/gateway.admin.v1.AdminService/CreateAccount`, { method: "POST", headers: { "content-type": "application/json", authorization: `Bearer ${adminToken}` }, body: JSON.stringify({ name: "waits", dailyMax: 100 }) });
      const { account, secret } = (await created.json()) as { account: { key: string }; secret: string };
      const legacy = (base: string) => legacyGet(base, "/retail/item_get/", { key: account.key, secret, num_iid: freshItem() });
      scripted({ kind: "status", status: 429, body: '{"message":"Too Many Requests"}', headers: { "retry-after": "60" } });
      const before = upstream.requests.length;
      const limited = await legacy(s.base);
      const toldAt = Date.now();
      expect([limited.json.error_code, limited.headers.get("retry-after")], withoutSecrets(s.output())).toEqual(["4002", "60"]);
      s.child.kill("SIGKILL");
      await new Promise((r) => s.child.once("exit", r));
      scripted({ kind: "normal" });
      s = await startServe(env);
      const held = await legacy(s.base);
      const left = 60 - Math.floor((Date.now() - toldAt) / 1000);
      expect([held.json.error_code, held.json.reason], withoutSecrets(s.output())).toEqual(["4002", expect.stringMatching(/^the upstream provider asked the gateway to wait before calling it again \(Retry-After\); nothing was sent; ask again in \d+ s$/)]);
      const askAgain = Number(/ask again in (\d+) s$/.exec(String(held.json.reason))![1]);
      expect(askAgain).toBeGreaterThanOrEqual(left - 1);
      expect(askAgain).toBeLessThanOrEqual(60);
      expect(Number(held.headers.get("retry-after"))).toBe(askAgain);
      const rpc = await createClient(RetailService, createConnectTransport({ baseUrl: s.base, httpVersion: "1.1" }))
        .itemGet({ numIid: freshItem() }, { headers: { "x-api-key": account.key, "x-api-secret": secret } })
        .then(
          () => undefined,
          (e: unknown) => ConnectError.from(e),
        );
      expect([rpc?.code, rpc?.findDetails(StatusBlockSchema)[0]?.errorCode]).toEqual([Code.Unavailable, 4002]);
      expect(upstream.requests.length - before).toBe(1);
    } finally {
      scripted({ kind: "normal" });
      s.child.kill("SIGKILL");
      rmSync(dataDir, { recursive: true, force: true });
    }
  });

  it("keeps each catalogue's wait as its end on the store's clock: what is left is held on start, a longer wait stands, one that is over is gone", async () => {
    const { mkdtempSync, rmSync } = await import("node:fs");
    const { tmpdir } = await import("node:os");
    const { join } = await import("node:path");
    const { DatabaseSync } = await import("node:sqlite");
    const { openDatabase } = await import("../src/stores/embedded/sqlite-database.ts");
    const { SqliteProviderWaits } = await import("../src/stores/embedded/provider-waits.ts");
    const dir = mkdtempSync(join(tmpdir(), "gateway-waits-"));
    const db = openDatabase(join(dir, "gateway.db"));
    const at = { now: 1_000_000 };
    const waits = new SqliteProviderWaits(db, () => at.now);
    const heard = (catalogue: string, store = waits) => {
      const held: number[] = [];
      store.listen(catalogue, (ms) => held.push(ms));
      return held;
    };
    try {
      expect(heard("retail")).toEqual([]);
      waits.tell("retail", 2000.4);
      at.now += 500;
      expect([heard("retail"), heard("wholesale")]).toEqual([[1501], []]);
      // A shorter wait told later does not cut the longer one short.
      waits.tell("retail", 100);
      expect(heard("retail")).toEqual([1501]);
      // No wait asked for is none.
      waits.tell("wholesale", 0);
      waits.tell("wholesale", Number.NaN);
      expect(heard("wholesale")).toEqual([]);
      at.now += 1501;
      expect(heard("retail")).toEqual([]);
      // One told after the last is over is held from then.
      waits.tell("retail", 3000);
      at.now += 1000;
      expect(heard("retail")).toEqual([2000]);
      // A store that cannot be written (here a read-only connection; a full disk alike) loses only the wait's survival.
      const readOnly = new DatabaseSync(join(dir, "gateway.db"), { readOnly: true });
      try {
        const reader = new SqliteProviderWaits(readOnly, () => at.now);
        expect(() => reader.tell("wholesale", 5000)).not.toThrow();
        expect([heard("retail", reader), heard("wholesale", reader)]).toEqual([[2000], []]);
      } finally {
        readOnly.close();
      }
    } finally {
      db.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it("does not try again the provider's own hold (4008) that says when to come back, and holds every call of the source to it", async () => {
    const outcomes: string[] = [];
    const telemetry = { ...noTelemetry, upstreamRequest: (_op: string, outcome: string) => void outcomes.push(outcome) };
    const source = new UpstreamSource({ url: upstream.url, catalogue: "taobao", key: upstreamKey, secret: upstreamSecret, breakerMinimumRps: 1e9, telemetry });
    const ask = (sent: { count: number }) => source.fetch(retailItemGet, { num_iid: demo.retailNumIid, is_promotion: "" }, undefined, undefined, sent).then((a) => a.found, (e: Error & { code?: number; retryAfterMs?: number }) => `${e.code} ${e.retryAfterMs} ${e.message}`);
    try {
      scripted({ kind: "code", code: "4008", headers: { "retry-after": "1" } });
      const first = { count: 0 };
      expect(await ask(first)).toBe(
        "4002 1000 the upstream provider is holding the gateway's calls back (its code 4008: its limit on the gateway's calls), and asked the gateway to wait 1 s before calling it again (Retry-After); ask again then",
      );
      expect(first.count).toBe(1);
      scripted({ kind: "normal" });
      const second = { count: 0 };
      expect(await ask(second)).toMatch(/^4002 \d+ the upstream provider asked the gateway to wait before calling it again \(Retry-After\); nothing was sent; ask again in 1 s$/);
      expect([second.count, outcomes]).toEqual([0, ["refused", "held"]]);
      await new Promise((r) => setTimeout(r, 1100));
      expect(await ask({ count: 0 })).toBe(true);
    } finally {
      scripted({ kind: "normal" });
      await source.close();
    }
  });

  it("answers the provider's 2000 as a charged 2000", async () => {
    const a = await gw.newAccount();
    const r = await legacyGet(gw.base, "/retail/item_get/", { key: a.key, secret: a.secret, num_iid: "999999999999" });
    expect(r.json.error_code).toBe("2000");
    expect(r.json.api_info).toMatch(/^today:1 /);
  });

  it("maps a refused connection to 4001, on the RPC path too", async () => {
    const closed = new FakeUpstream();
    await closed.start();
    const url = closed.url;
    await closed.stop();
    const source = new UpstreamSource({ url, catalogue: "taobao", key: upstreamKey, secret: upstreamSecret, attemptTimeoutMs: 300, deadlineMs: 1000 });
    const sent = { count: 0 };
    const err = await source.fetch(retailItemGet, { num_iid: "1", is_promotion: "" }, undefined, undefined, sent).then(() => undefined, (e: Error & { code?: number }) => e);
    expect(err?.code).toBe(4001);
    // Refused, and retried as a refusal is: no request reached the provider, so none is counted.
    expect(sent.count).toBe(0);
    await source.close();
    scripted({ kind: "reset" });
    const rpc = await createClient(RetailService, createConnectTransport({ baseUrl: gw.base, httpVersion: "1.1" }))
      .itemGet({ numIid: freshItem() }, { headers: { "x-api-key": gw.account.key, "x-api-secret": gw.account.secret } })
      .then(() => undefined, ConnectError.from);
    expect(rpc?.code).toBe(Code.Unavailable);
    expect(rpc?.findDetails(StatusBlockSchema)[0]?.errorCode).toBe(4001);
    scripted({ kind: "normal" });
  });
});

describe("signed upstream calls", () => {
  it("sends dateline and sign instead of the secret, signed as the wire notes say", async () => {
    const source = new UpstreamSource({ url: upstream.url, catalogue: "taobao", key: upstreamKey, secret: upstreamSecret, signing: "md5", now: () => Date.parse("2026-11-22T01:02:03Z") });
    scripted({ kind: "normal" });
    const before = upstream.requests.length;
    const answer = await source.fetch(retailItemGet, { num_iid: demo.retailNumIid, is_promotion: "1" });
    expect(answer.found).toBe(true);
    const q = Object.fromEntries(upstream.requests[before]!.query);
    expect(q.secret).toBeUndefined();
    expect(q.dateline).toBe("2026-11-22 09:02:03");
    const { sign, ...rest } = q;
    expect(sign).toBe(legacySign({ ...rest, api_name: "item_get" }, legacySigningKey(upstreamSecret)));
    expect(sign).toMatch(/^[0-9a-f]{32}$/);
    await source.close();
  });
});

describe("resilience", () => {
  it("keeps retries within the budget (about 20% extra calls)", async () => {
    scripted({ kind: "status", status: 503 });
    const source = new UpstreamSource({ url: upstream.url, catalogue: "taobao", key: upstreamKey, secret: upstreamSecret, breakerThreshold: 0.99, breakerMinimumRps: 1e9 });
    const before = upstream.requests.length;
    for (let i = 0; i < 50; i++) await source.fetch(retailItemGet, { num_iid: "1", is_promotion: "" }).catch(() => undefined);
    const made = upstream.requests.length - before;
    expect(made).toBeGreaterThan(50);
    expect(made).toBeLessThanOrEqual(50 * 1.2 + 2);
    await source.close();
    scripted({ kind: "normal" });
  });

  it("opens the breaker on a failing provider, answers 4002 fast, and closes after a good probe", async () => {
    scripted({ kind: "status", status: 500 });
    const source = new UpstreamSource({
      url: upstream.url, catalogue: "taobao", key: upstreamKey, secret: upstreamSecret,
      breakerThreshold: 0.5, breakerWindowMs: 1000, breakerMinimumRps: 1, breakerHalfOpenAfterMs: 300,
    });
    for (let i = 0; i < 10; i++) await source.fetch(retailItemGet, { num_iid: "1", is_promotion: "" }).catch(() => undefined);
    const before = upstream.requests.length;
    const started = performance.now();
    const open = await source.fetch(retailItemGet, { num_iid: "1", is_promotion: "" }).then(() => undefined, (e: Error & { code?: number }) => e);
    expect(open?.code).toBe(4002);
    expect(open?.message).toContain("held back");
    expect(upstream.requests.length).toBe(before);
    // Far below the 3 s an attempt may take: the breaker answered without trying.
    expect(performance.now() - started).toBeLessThan(1000);
    scripted({ kind: "normal" });
    await new Promise((r) => setTimeout(r, 350));
    expect((await source.fetch(retailItemGet, { num_iid: demo.retailNumIid, is_promotion: "" })).found).toBe(true);
    expect((await source.fetch(retailItemGet, { num_iid: demo.retailNumIid, is_promotion: "" })).found).toBe(true);
    await source.close();
  });
});

describe("the response cache", () => {
  // The fault tests above have (rightly) opened the first gateway's breaker.
  beforeAll(async () => {
    await gw.close();
    gw = await gatewayOnUpstream();
  });

  it("makes one upstream call for 100 simultaneous misses, and meters each caller", async () => {
    scripted({ kind: "normal", delayMs: 100 });
    const a = await gw.newAccount({ concurrency: 200 });
    const id = freshItem();
    const before = upstream.requests.length;
    const codes = await Promise.all(Array.from({ length: 100 }, () => legacyGet(gw.base, "/retail/item_get/", { key: a.key, secret: a.secret, num_iid: id }).then((r) => r.json.error_code)));
    expect(codes).toEqual(Array(100).fill("0000"));
    expect(upstream.requests.length - before).toBe(1);
    const report = await gw.runtime.meter.query({ account: a.key, rows: 200 });
    const charged = report.totals.filter((t) => t.charge === "charged").reduce((n, t) => n + t.calls, 0);
    expect(charged).toBe(100);
    // The one purchase is on the row of the call that made it; the 99 that shared it bought nothing.
    expect(report.rows.map((r) => r.upstreamRequests).sort()).toEqual([...Array(99).fill(0), 1]);
    expect(report.totals.reduce((n, t) => n + t.upstreamRequests, 0)).toBe(1);
    scripted({ kind: "normal" });
  });

  it("serves hits with cache 1 and the entry's secache; cache=no asks again and refreshes the entry", async () => {
    const id = freshItem();
    const first = await get(id);
    const before = upstream.requests.length;
    const hit = await get(id);
    expect(upstream.requests.length).toBe(before);
    expect([first.cache, hit.cache]).toEqual([0, 1]);
    expect(hit.secache).toBe(first.secache);
    expect(hit.secache_time).toBe(first.secache_time);
    expect(hit.item).toEqual(first.item);
    const hitLedger = (await gw.runtime.meter.query({ rows: 1000 })).rows.find((r) => r.requestId === hit.request_id);
    expect(hitLedger).toMatchObject({ cacheHit: true, charge: "charged" });

    clock.at += 5000;
    const refreshed = await get(id, { cache: "no" });
    expect(upstream.requests.length).toBe(before + 1);
    expect(refreshed.cache).toBe(0);
    expect(refreshed.secache_time).toBe((first.secache_time as number) + 5);
    const after = await get(id);
    expect(after.cache).toBe(1);
    expect(after.secache).toBe(refreshed.secache);

    // The operator reads what each call bought, and the sums, through the AdminService: to hold the provider's bill to.
    const admin = createClient(AdminService, createConnectTransport({ baseUrl: gw.base, httpVersion: "1.1" }));
    const headers = { authorization: `Bearer ${adminToken}` };
    const calls = (await admin.listCalls({ account: gw.account.key, pageSize: 1000 }, { headers })).calls;
    const bought = new Map(calls.map((c) => [c.requestId, c.upstreamRequests]));
    expect([first, hit, refreshed, after].map((x) => bought.get(x.request_id as string))).toEqual([1, 0, 1, 0]);
    const usage = await admin.queryUsage({ account: gw.account.key }, { headers });
    const sent = calls.reduce((n, c) => n + c.upstreamRequests, 0);
    expect(Number(usage.upstreamRequests)).toBe(sent);
    expect(usage.totals.reduce((n, t) => n + Number(t.upstreamRequests), 0)).toBe(sent);
  });

  it("caches 2000 for a shorter time, and never caches a fault", async () => {
    const before = upstream.requests.length;
    expect((await get("888888888888")).error_code).toBe("2000");
    const again = await get("888888888888");
    expect(again.error_code).toBe("2000");
    expect(again.cache).toBe(1);
    expect(upstream.requests.length).toBe(before + 1);
    clock.at += 11_000;
    await get("888888888888");
    expect(upstream.requests.length).toBe(before + 2);

    scripted({ kind: "status", status: 500 });
    const id = freshItem();
    expect((await get(id)).error_code).toBe("4002");
    scripted({ kind: "normal" });
    expect((await get(id)).error_code).toBe("0000");
  });

  it("serves an expired answer instead of a fault while it is young enough (stale-if-error), charged", async () => {
    const id = freshItem();
    const stored = await get(id);
    clock.at += 120_000; // past the 60 s freshness
    scripted({ kind: "status", status: 500 });
    const a = await gw.newAccount();
    const stale = await legacyGet(gw.base, "/retail/item_get/", { key: a.key, secret: a.secret, num_iid: id });
    expect(stale.json.error_code).toBe("0000");
    expect(stale.json.cache).toBe(1);
    expect(stale.json.secache).toBe(stored.secache);
    expect(stale.json.api_info).toMatch(/^today:1 /);
    clock.at += 400_000; // past the 300 s stale bound too
    expect((await get(id)).error_code).toBe("4002");
    scripted({ kind: "normal" });
  });
});

describe("an answer that comes after its caller's time", () => {
  /** The gateway's `gateway_upstream_late_total` by outcome. */
  async function lateMetric(): Promise<Record<string, number>> {
    const text = await (await fetch(`${gw.base}/metrics`)).text();
    const counts: Record<string, number> = {};
    for (const m of text.matchAll(/^gateway_upstream_late_total\{[^}]*outcome="(\w+)"[^}]*\} (\d+)$/gm)) counts[m[1]!] = (counts[m[1]!] ?? 0) + Number(m[2]);
    return counts;
  }

  /** An account's ledger rows, oldest first (the ledger lists the newest first): code, charge, requests sent to the provider. */
  async function ledgerOf(account: string): Promise<unknown[][]> {
    const rows = (await gw.runtime.meter.query({ account, rows: 5 })).rows;
    return [...rows].reverse().map((r) => [r.code, r.charge, r.upstreamRequests]);
  }

  it("is kept: the call sent again waits for it instead of buying the item again, and then it is a hit", async () => {
    // Past the caller's 400 ms, within the call's 1500 ms deadline.
    scripted({ kind: "normal", delayMs: 700 });
    const a = await gw.newAccount();
    const id = freshItem();
    const before = upstream.requests.length;
    const late = await lateMetric();
    const call = () => legacyGet(gw.base, "/retail/item_get/", { key: a.key, secret: a.secret, num_iid: id });
    const first = await call();
    bodies.push(first.body);
    expect(first.json.error_code).toBe("4017");
    expect(first.json.reason).toContain("its answer is still awaited and will be kept: ask again");
    const again = await call();
    expect(again.json.error_code).toBe("0000");
    expect(again.json.cache).toBe(0);
    const hit = await call();
    expect(hit.json).toMatchObject({ error_code: "0000", cache: 1, secache: again.json.secache });
    expect(upstream.requests.length - before).toBe(1);
    // The one purchase is on the row of the call told 4017, uncharged; the call that got its answer is charged and bought nothing.
    expect(await ledgerOf(a.key)).toEqual([
      [4017, "uncharged", 1],
      [0, "charged", 0],
      [0, "charged", 0],
    ]);
    expect((await lateMetric()).landed).toBe((late.landed ?? 0) + 1);
    scripted({ kind: "normal" });
  });

  it("is waited for at most one attempt's time, and an item whose answer never comes is bought again after the deadline", async () => {
    scripted({ kind: "hang" });
    const a = await gw.newAccount();
    const id = freshItem();
    const before = upstream.requests.length;
    const late = await lateMetric();
    const call = () => legacyGet(gw.base, "/retail/item_get/", { key: a.key, secret: a.secret, num_iid: id });
    expect((await call()).json.error_code).toBe("4017");
    const started = performance.now();
    const waiting = await call();
    expect(waiting.json.error_code).toBe("4017");
    expect(waiting.json.reason).toContain("has not answered this item's request within 400 ms");
    expect(performance.now() - started).toBeGreaterThanOrEqual(390);
    expect(upstream.requests.length - before).toBe(1);
    // Past the 1500 ms deadline the request is cut and counted failed; the next call buys again.
    await expect.poll(async () => (await lateMetric()).failed ?? 0, { timeout: 5000, interval: 100 }).toBe((late.failed ?? 0) + 1);
    scripted({ kind: "normal" });
    expect((await call()).json.error_code).toBe("0000");
    expect(upstream.requests.length - before).toBe(2);
    expect(await ledgerOf(a.key)).toEqual([
      [4017, "uncharged", 1],
      [4017, "uncharged", 0],
      [0, "charged", 1],
    ]);
  });

  it("cuts a request still queued for a connection when its caller's time is up, and counts it not: it never reached the provider", async () => {
    scripted({ kind: "hang" });
    // One connection: the first request holds it while its answer is awaited, and the second queues behind it.
    const source = new UpstreamSource({ url: upstream.url, catalogue: "taobao", key: upstreamKey, secret: upstreamSecret, attemptTimeoutMs: 200, deadlineMs: 60_000, connections: 1 });
    const before = upstream.requests.length;
    const [sentA, sentB] = [{ count: 0 }, { count: 0 }];
    const ask = (id: string, sent: { count: number }) => source.fetch(retailItemGet, { num_iid: id, is_promotion: "" }, undefined, undefined, sent).then(() => undefined, (e: Error & { code?: number }) => e);
    const first = await ask(retailIds.at(-4)!, sentA);
    expect(first).toBeInstanceOf(LateAnswer);
    expect(sentA.count).toBe(1);
    const second = await ask(retailIds.at(-5)!, sentB);
    expect(second).not.toBeInstanceOf(LateAnswer);
    expect([second?.code, second?.message]).toEqual([4017, "no connection to the upstream provider was free or could be opened within 200 ms; nothing was sent"]);
    expect(sentB.count).toBe(0);
    await source.close();
    await new Promise((r) => setTimeout(r, 200));
    expect(upstream.requests.length - before).toBe(1);
    scripted({ kind: "normal" });
  });

  it("holds at most half the provider connections: past that a timed-out request is cut at once", async () => {
    scripted({ kind: "hang" });
    const events: string[] = [];
    const telemetry = { ...noTelemetry, upstreamLate: (_op: string, outcome: string) => void events.push(outcome) };
    const source = new UpstreamSource({ url: upstream.url, catalogue: "taobao", key: upstreamKey, secret: upstreamSecret, attemptTimeoutMs: 200, deadlineMs: 60_000, connections: 4, telemetry });
    const closed = upstream.closedConnections;
    const outcomes = await Promise.all(
      retailIds.slice(-3).map((id) =>
        source.fetch(retailItemGet, { num_iid: id, is_promotion: "" }).then(
          () => "answered",
          (e: Error & { code?: number }) => `${e.code} ${e instanceof LateAnswer ? "late" : "cut"}`,
        ),
      ),
    );
    expect(outcomes.sort()).toEqual(["4017 cut", "4017 late", "4017 late"]);
    expect(events).toEqual(["abandoned"]);
    // The cut request's connection is closed at once; the two awaited stay open until the source closes.
    await expect.poll(() => upstream.closedConnections - closed, { timeout: 2000 }).toBe(1);
    await source.close();
    await expect.poll(() => upstream.closedConnections - closed, { timeout: 2000 }).toBe(3);
    await expect.poll(() => events.sort(), { timeout: 2000 }).toEqual(["abandoned", "failed", "failed"]);
    scripted({ kind: "normal" });
  });
});

describe("the gateway's provider credentials", () => {
  it("appear in no response and no log line", () => {
    expect(bodies.length).toBeGreaterThan(10);
    expect(logLines.length).toBeGreaterThan(10);
    for (const text of [...bodies, ...logLines]) {
      expect(text).not.toContain(upstreamKey);
      expect(text).not.toContain(upstreamSecret);
    }
  });
});

describe("configured as the README says", () => {
  it("a gateway started with GATEWAY_UPSTREAM_* serves from the provider, over as many connections as it is given", async () => {
    const { spawn } = await import("node:child_process");
    const { mkdtempSync, rmSync } = await import("node:fs");
    const { tmpdir } = await import("node:os");
    const { join } = await import("node:path");
    const { root } = await import("./support/cli.ts");
    scripted({ kind: "normal" });
    const dir = mkdtempSync(join(tmpdir(), "gateway-upstream-"));
    const child = spawn(process.execPath, [join(root, "bin", "gateway.js"), "serve", "--demo"], {
      cwd: root,
      env: { ...process.env, GATEWAY_DATA_DIR: dir, GATEWAY_PORT: "0", GATEWAY_UPSTREAM_URL: upstream.url, GATEWAY_UPSTREAM_KEY: upstreamKey, GATEWAY_UPSTREAM_SECRET: upstreamSecret, GATEWAY_UPSTREAM_TIMEOUT_MS: "1000", GATEWAY_UPSTREAM_CONNECTIONS: "1" },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let out = "";
    child.stdout.on("data", (d: Buffer) => (out += d.toString()));
    child.stderr.on("data", (d: Buffer) => (out += d.toString()));
    try {
      const until = Date.now() + 20_000;
      while (!/Demo account\s+key: \S+\s+secret: \S+/.test(out) && Date.now() < until) await new Promise((r) => setTimeout(r, 50));
      const base = /listening on (http:\/\/\S+)/.exec(out)![1]!;
      const [, key, secret] = /Demo account\s+key: (\S+)\s+secret: (\S+)/.exec(out)!;
      const before = upstream.requests.length;
      const r = await legacyGet(base, "/wholesale/item_search_peerbuy/", { key: key!, secret: secret!, num_iid: demo.wholesaleNumIid, sid: demo.wholesaleSid });
      expect(r.json.error_code).toBe("0000");
      expect(r.json._ddf).toBe("upstream");
      expect(upstream.requests.slice(before).map((q) => [q.path, q.query.get("key")])).toEqual([["/1688/item_search_peerbuy/", upstreamKey]]);
      // One connection: with the provider silent, one of two calls holds it, and the other is never sent.
      scripted({ kind: "hang" });
      const reasons = await Promise.all([freshItem(), freshItem()].map(async (id) => (await legacyGet(base, "/retail/item_get/", { key: key!, secret: secret!, num_iid: id })).json.reason as string));
      expect(reasons.map((x) => x.replace(/within \d+ ms/, "within … ms")).sort()).toEqual([
        "no connection to the upstream provider was free or could be opened within … ms; nothing was sent",
        "the upstream provider did not answer within … ms; its answer is still awaited and will be kept: ask again",
      ]);
      expect(upstream.requests.length - before).toBe(2);
      scripted({ kind: "normal" });
      expect(out).not.toContain(upstreamSecret);
    } finally {
      child.kill("SIGTERM");
      await new Promise((r) => child.once("exit", r));
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
