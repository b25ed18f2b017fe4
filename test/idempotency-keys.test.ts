// Idempotency keys (src/core/idempotency.ts): a call sent again with the same Idempotency-Key is charged once.
// The two meters decide keys alike (the embedded one in this process, the shared one on a real PostgreSQL, two
// replicas of it); the real app answers a replay on every transport, says so, and charges nothing for it. Copies of
// one call spread over three replica processes are in test/replicas.test.ts.
import { ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport, createGrpcWebTransport } from "@connectrpc/connect-node";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Account } from "../src/core/accounts.ts";
import { GatewayError } from "../src/core/gateway-error.ts";
import { idempotencyKey, idempotencyKeyOf, keptMs, type KeyClaim } from "../src/core/idempotency.ts";
import type { LedgerRow, Meter } from "../src/core/meter.ts";
import type { CatalogueSource } from "../src/core/catalogue-source.ts";
import { operationById } from "../src/operations/index.ts";
import { RetailService } from "../src/gen/gateway/catalogue/v1/retail_pb.js";
import { ErrorCode, StatusBlockSchema } from "../src/gen/gateway/catalogue/v1/status_pb.js";
import { SqliteMeter } from "../src/stores/embedded/meter.ts";
import { openDatabase } from "../src/stores/embedded/sqlite-database.ts";
import { PostgresMeter } from "../src/stores/postgres/meter.ts";
import { migrateSchema, openPostgres } from "../src/stores/postgres/postgres-database.ts";
import { buildApp } from "../src/transports/server/app.ts";
import { demo, startGateway, type GatewayFixture } from "./support/gateway-fixture.ts";
import { freshDatabase } from "./support/postgres.ts";

const itemGet = operationById.get("retail/item_get")!;

describe("the Idempotency-Key header", () => {
  it("is one key, bare or as a structured-field string, of 1 to 255 printable ASCII characters", () => {
    expect(idempotencyKeyOf(undefined)).toBeUndefined();
    expect(idempotencyKeyOf("8e03978e-40d5-43e8-bc93-6894a57f9324")).toBe("8e03978e-40d5-43e8-bc93-6894a57f9324");
    expect(idempotencyKeyOf(' "8e03978e-40d5" ')).toBe("8e03978e-40d5");
    expect(idempotencyKeyOf('"a, b \\"c\\" \\\\"')).toBe('a, b "c" \\');
    expect(idempotencyKeyOf("x".repeat(255))).toBe("x".repeat(255));
    // Two keys (a repeated header, joined), none, too long, not ASCII, a string left open: the caller meant one, so 4003.
    for (const bad of ["a, b", '"a", "b"', "", '""', "x".repeat(256), "clé", '"open', "a b", '"tab\there"']) {
      expect(() => idempotencyKeyOf(bad), JSON.stringify(bad)).toThrow(GatewayError);
      try {
        idempotencyKeyOf(bad);
      } catch (e) {
        expect((e as GatewayError).code).toBe(ErrorCode.PARAM_ERROR);
      }
    }
  });

  it("names its request: the operation, the arguments and the options", () => {
    const base = idempotencyKey("k", itemGet, { num_iid: "1" }, { useCache: true, lang: "cn" });
    expect(idempotencyKey("k", itemGet, { num_iid: "1" }, { useCache: true, lang: "cn" })).toEqual(base);
    for (const other of [
      idempotencyKey("k", itemGet, { num_iid: "2" }, { useCache: true, lang: "cn" }),
      idempotencyKey("k", itemGet, { num_iid: "1" }, { useCache: false, lang: "cn" }),
      idempotencyKey("k", itemGet, { num_iid: "1" }, { useCache: true, lang: "en" }),
      idempotencyKey("k", operationById.get("wholesale/item_get")!, { num_iid: "1" }, { useCache: true, lang: "cn" }),
    ]) {
      expect(other.key).toBe("k");
      expect(other.fingerprint).not.toBe(base.fingerprint);
    }
  });
});

/** The two meters, each as two "replicas" over one store (the embedded one is one process: the same meter twice). */
interface Stores {
  readonly name: string;
  readonly replicas: readonly [Meter, Meter];
}

let pgDb: Awaited<ReturnType<typeof freshDatabase>>;
const pools: pg.Pool[] = [];
const pgMeters: PostgresMeter[] = [];
let dir: string;
let stores: Stores[];

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), "gateway-keys-"));
  const sqlite = new SqliteMeter(openDatabase(join(dir, "gateway.db")));
  pgDb = await freshDatabase("keys");
  const replica = (holder: string, leaseMs = 15_000) => {
    const pool = openPostgres(pgDb.url, { max: 4 });
    pools.push(pool);
    const meter = new PostgresMeter(pool, { holder, leaseMs });
    pgMeters.push(meter);
    return meter;
  };
  const admin = openPostgres(pgDb.url, { max: 1 });
  pools.push(admin);
  await migrateSchema(admin);
  stores = [
    { name: "embedded", replicas: [sqlite, sqlite] },
    { name: "PostgreSQL", replicas: [replica("r1"), replica("r2")] },
  ];
});
afterAll(async () => {
  for (const m of pgMeters) m.close();
  await Promise.all(pools.map((p) => p.end()));
  await pgDb?.drop();
  rmSync(dir, { recursive: true, force: true });
});

const account = { key: "acct-keys" };
let ids = 0;
function row(charge: LedgerRow["charge"], at = Date.now()): LedgerRow {
  return {
    requestId: `req-${String(++ids).padStart(8, "0")}`, at, day: "2026-11-26", account: account.key, operation: "retail/item_get",
    code: charge === "charged" ? ErrorCode.SUCCESS : ErrorCode.TARGET_SERVER_ERROR, charge, price: 0n, cacheHit: false, upstreamRequests: 0, latencyMicros: 1, transport: "legacy",
  };
}
const kinds = (claims: readonly KeyClaim[]) => claims.map((c) => c.kind);

describe.each(["embedded", "PostgreSQL"])("the %s meter's keys", (name) => {
  const of = () => stores.find((s) => s.name === name)!.replicas;
  const key = (k: string, numIid = "1") => idempotencyKey(`${name}-${k}`, itemGet, { num_iid: numIid }, { useCache: true, lang: "cn" });

  it("take a key once: a copy while it runs is in flight, another request is refused, and a charged call's key answers as it from then on", async () => {
    const [a, b] = of();
    const now = Date.now();
    const first = await a.claim(account.key, key("one"), now);
    expect(first.kind).toBe("taken");
    expect(kinds([await b.claim(account.key, key("one"), now), await a.claim(account.key, key("one", "2"), now)])).toEqual(["in_flight", "other_request"]);
    const charged = row("charged", now);
    await a.record(charged, undefined, first as Extract<KeyClaim, { kind: "taken" }>);
    expect(await b.claim(account.key, key("one"), now + 1000)).toEqual({ kind: "replay", requestId: charged.requestId });
    expect(await a.claim(account.key, key("one"), now + keptMs - 1)).toEqual({ kind: "replay", requestId: charged.requestId });
    expect((await b.claim(account.key, key("one", "2"), now + 1000)).kind).toBe("other_request");
    // Another account's key of the same name is its own.
    expect((await b.claim("another-account", key("one"), now)).kind).toBe("taken");
    // Kept a day: after it, the key is new again.
    expect((await b.claim(account.key, key("one", "3"), now + keptMs + 1)).kind).toBe("taken");
  });

  it("give a key back when its call is not charged, so a retry runs for real", async () => {
    const [a, b] = of();
    const now = Date.now();
    const first = await a.claim(account.key, key("two"), now);
    await a.record(row("uncharged", now), undefined, first as Extract<KeyClaim, { kind: "taken" }>);
    const again = await b.claim(account.key, key("two"), now);
    expect(again.kind).toBe("taken");
    await b.record(row("ignored", now), undefined, again as Extract<KeyClaim, { kind: "taken" }>);
    expect((await a.claim(account.key, key("two", "9"), now)).kind).toBe("taken");
  });

  it("let exactly one of many simultaneous copies take a key, whichever replica each reaches", async () => {
    const [a, b] = of();
    const now = Date.now();
    const claims = await Promise.all(Array.from({ length: 40 }, (_, i) => (i % 2 === 0 ? a : b).claim(account.key, key("three"), now)));
    expect(kinds(claims).filter((k) => k === "taken")).toHaveLength(1);
    expect(new Set(kinds(claims).filter((k) => k !== "taken"))).toEqual(new Set(["in_flight"]));
  });
});

describe("keys kept past a day", () => {
  it("are deleted from either store", async () => {
    let clock = Date.now();
    const db = openDatabase(":memory:");
    const embedded = new SqliteMeter(db, { now: () => clock });
    const pool = openPostgres(pgDb.url, { max: 2 });
    pools.push(pool);
    const shared = new PostgresMeter(pool, { holder: "pruning", leaseMs: 300, now: () => clock });
    pgMeters.push(shared);
    const kept = async () => [
      Number((db.prepare("SELECT count(*) AS n FROM idempotency_keys WHERE account = 'pruned'").get() as { n: number }).n),
      Number((await pool.query<{ n: string }>("SELECT count(*) AS n FROM idempotency_keys WHERE account = 'pruned'")).rows[0]!.n),
    ];
    for (const meter of [embedded, shared]) {
      const claim = await meter.claim("pruned", idempotencyKey("old", itemGet, { num_iid: "1" }, { useCache: true, lang: "cn" }), clock);
      await meter.record({ ...row("charged", clock), account: "pruned" }, undefined, claim as Extract<KeyClaim, { kind: "taken" }>);
    }
    expect(await kept()).toEqual([1, 1]);
    // A day and a minute later: the embedded store's next commit deletes it, the shared store's next renewal round.
    clock += keptMs + 61_000;
    await embedded.record({ ...row("uncharged", clock), account: "pruned" }, undefined);
    await new Promise((r) => setTimeout(r, 400));
    expect(await kept()).toEqual([0, 0]);
    shared.close();
    db.close();
  });
});

describe("the PostgreSQL meter's held keys", () => {
  it("lapse when their replica stops renewing them (it died), and are renewed while it runs", async () => {
    const pool = openPostgres(pgDb.url, { max: 2 });
    pools.push(pool);
    const dying = new PostgresMeter(pool, { holder: "dying", leaseMs: 300 });
    const living = new PostgresMeter(pool, { holder: "living", leaseMs: 300 });
    pgMeters.push(dying, living);
    const other = stores.find((s) => s.name === "PostgreSQL")!.replicas[0];
    const k = idempotencyKey("held", itemGet, { num_iid: "1" }, { useCache: true, lang: "cn" });
    const k2 = idempotencyKey("renewed", itemGet, { num_iid: "1" }, { useCache: true, lang: "cn" });
    expect((await dying.claim(account.key, k, Date.now())).kind).toBe("taken");
    expect((await living.claim(account.key, k2, Date.now())).kind).toBe("taken");
    dying.close();
    await new Promise((r) => setTimeout(r, 700));
    // The dead replica's hold is gone; the living one's, renewed every 100 ms, still holds.
    expect((await other.claim(account.key, k, Date.now())).kind).toBe("taken");
    expect((await other.claim(account.key, k2, Date.now())).kind).toBe("in_flight");
    living.close();
  });
});

describe("a call sent again with its Idempotency-Key, through the real app", () => {
  let gw: GatewayFixture;
  beforeAll(async () => {
    gw = await startGateway({ app: { corsOrigins: ["https://shop.example"] } });
  });
  afterAll(() => gw.close());

  type Told = { code: string; requestId: string; apiInfo: string; replayed: string | null; original: string | null; current: string | null };
  const legacy = async (a: { key: string; secret: string }, key: string | undefined, numIid = demo.retailNumIid, method: "GET" | "POST" = "GET"): Promise<Told> => {
    const q = new URLSearchParams({ key: a.key, secret: a.secret, num_iid: numIid });
    const headers: Record<string, string> = key === undefined ? {} : { "idempotency-key": key };
    const res =
      method === "GET"
        ? await fetch(`${gw.base}/retail/item_get/?${q}`, { headers })
        : await fetch(`${gw.base}/retail/item_get/`, { method: "POST", headers: { ...headers, "content-type": "application/x-www-form-urlencoded" }, body: q.toString() });
    const j = (await res.json()) as Record<string, string>;
    const h = res.headers;
    return { code: j.error_code!, requestId: j.request_id!, apiInfo: j.api_info!, replayed: h.get("idempotent-replayed"), original: h.get("original-request-id"), current: h.get("ratelimit") };
  };
  const rpc = async (a: { key: string; secret: string }, key: string | undefined, protocol: "connect" | "grpc" | "grpc-web", numIid = demo.retailNumIid): Promise<Told> => {
    const transport =
      protocol === "grpc" ? createGrpcTransport({ baseUrl: gw.base }) : protocol === "grpc-web" ? createGrpcWebTransport({ baseUrl: gw.base, httpVersion: "1.1" }) : createConnectTransport({ baseUrl: gw.base, httpVersion: "1.1" });
    const headers: Record<string, string> = { "x-api-key": a.key, "x-api-secret": a.secret, ...(key === undefined ? {} : { "idempotency-key": key }) };
    let head: Headers | undefined;
    try {
      const r = await createClient(RetailService, transport).itemGet({ numIid }, { headers, onHeader: (h) => (head = h) });
      return { code: "0000", requestId: r.status!.requestId, apiInfo: r.status!.apiInfo, replayed: head!.get("idempotent-replayed"), original: head!.get("original-request-id"), current: head!.get("ratelimit") };
    } catch (e) {
      const error = ConnectError.from(e);
      const status = error.findDetails(StatusBlockSchema)[0]!;
      const m = error.metadata;
      return { code: String(status.errorCode).padStart(4, "0"), requestId: status.requestId, apiInfo: status.apiInfo, replayed: m.get("idempotent-replayed"), original: m.get("original-request-id"), current: m.get("ratelimit") };
    }
  };
  const today = (t: Told) => Number(/today:(\d+)/.exec(t.apiInfo)![1]);

  it("is charged once on every transport: the copies are answered again, say so, and take nothing from the day or the balance", async () => {
    const a = await gw.newAccount({ dailyMax: 100, balance: 1_000_000n, prices: new Map([["retail/item_get", 250_000n]]) });
    const first = await legacy(a, "order-1");
    expect([first.code, today(first), first.replayed, first.original]).toEqual(["0000", 1, null, null]);
    const copies = [
      await legacy(a, "order-1"),
      await legacy(a, '"order-1"', demo.retailNumIid, "POST"),
      await rpc(a, "order-1", "connect"),
      await rpc(a, "order-1", "grpc"),
      await rpc(a, "order-1", "grpc-web"),
    ];
    for (const c of copies) {
      expect([c.code, c.replayed, c.original, today(c)]).toEqual(["0000", "true", first.requestId, 1]);
      expect(c.requestId).not.toBe(first.requestId);
      // The day's count is where the charged call left it (its `t` moves with the clock).
      expect(c.current?.replace(/;t=\d+/, "")).toBe('"daily";r=99');
    }
    // Another key is another call.
    const second = await rpc(a, "order-2", "grpc");
    expect([second.code, second.replayed, today(second)]).toEqual(["0000", null, 2]);

    // The ledger has every call, each copy uncharged with the code it was answered; the balance paid twice.
    const report = await gw.runtime.meter.query({ account: a.key, rows: 20 });
    const rows = report.rows.map((r) => [r.requestId, r.code, r.charge, r.price]);
    expect(rows.filter(([, , charge]) => charge === "charged")).toEqual(
      expect.arrayContaining([[first.requestId, 0, "charged", 250_000n], [second.requestId, 0, "charged", 250_000n]]),
    );
    expect(rows.filter(([, , charge]) => charge === "charged")).toHaveLength(2);
    expect(rows.filter(([, , charge]) => charge === "uncharged")).toEqual(copies.map((c) => [c.requestId, 0, "uncharged", 0n]).reverse());
    expect(await gw.runtime.meter.balance(a.key)).toBe(500_000n);
    // The operator's metrics count what became of the keys.
    const metric = (await gw.runtime.metrics.registry.getSingleMetric("gateway_idempotency_keys_total")!.get()) as { values: { labels: Record<string, string>; value: number }[] };
    expect(metric.values.map((v) => `${v.labels.operation} ${v.labels.outcome} ${v.value}`).sort()).toEqual(["retail/item_get replayed 5", "retail/item_get taken 2"]);
  });

  it("refuses the same key with another request (4003), a key that is not one (4003), and charges neither", async () => {
    const a = await gw.newAccount({ dailyMax: 100 });
    expect((await legacy(a, "k-1")).code).toBe("0000");
    const other = await legacy(a, "k-1", "1234567");
    expect([other.code, other.replayed]).toEqual(["4003", null]);
    const otherRpc = await rpc(a, "k-1", "connect", "1234567");
    expect(otherRpc.code).toBe("4003");
    for (const bad of ["", "x".repeat(256), "a, b"]) expect((await legacy(a, bad)).code, JSON.stringify(bad)).toBe("4003");
    const res = await fetch(`${gw.base}/retail/item_get/?${new URLSearchParams({ key: a.key, secret: a.secret, num_iid: demo.retailNumIid })}`, {
      headers: [["idempotency-key", "one"], ["idempotency-key", "two"]],
    });
    expect(((await res.json()) as { error_code: string }).error_code).toBe("4003");
    expect(today(await legacy(a, undefined))).toBe(2);
  });

  it("refuses a copy while the call that took its key runs (4008), and answers it again once that call is charged", async () => {
    const a = await gw.newAccount({ dailyMax: 100 });
    let release!: () => void;
    const gate = new Promise<void>((r) => (release = r));
    let entered!: () => void;
    const inside = new Promise<void>((r) => (entered = r));
    const real: CatalogueSource = gw.runtime.catalogue;
    const slow: CatalogueSource = { label: "slow", fetch: async (op, args, signal) => (entered(), await gate, real.fetch(op, args, signal)) };
    const app = await buildApp({ gateway: gw.gatewayWith(new Map([["retail", slow]])), logLevel: false });
    await app.listen({ host: "127.0.0.1", port: 0 });
    const base = `http://127.0.0.1:${(app.server.address() as { port: number }).port}`;
    try {
      const get = (key: string) =>
        fetch(`${base}/retail/item_get/?${new URLSearchParams({ key: a.key, secret: a.secret, num_iid: demo.retailNumIid })}`, { headers: { "idempotency-key": key } }).then(
          async (r): Promise<Record<string, string | null>> => ({ ...((await r.json()) as Record<string, string>), replayed: r.headers.get("idempotent-replayed") }),
        );
      const running = get("slow-1");
      await inside;
      const copy = await get("slow-1");
      expect([copy.error_code, copy.reason]).toEqual(["4008", "a call with this Idempotency-Key is still in flight; retry once it is answered"]);
      release();
      const done = await running;
      expect(done.error_code).toBe("0000");
      const again = await get("slow-1");
      expect([again.error_code, again.replayed, again.api_info!.split(" ")[0]]).toEqual(["0000", "true", "today:1"]);
    } finally {
      await app.close();
    }
  });

  it("runs a retry for real when the call that took its key was not charged (its source failed)", async () => {
    const a = await gw.newAccount({ dailyMax: 100 });
    let failing = true;
    const real: CatalogueSource = gw.runtime.catalogue;
    const flaky: CatalogueSource = {
      label: "flaky",
      fetch: async (op, args, signal) => {
        if (failing) throw new GatewayError(ErrorCode.TARGET_SERVER_ERROR, "the provider answered 502");
        return real.fetch(op, args, signal);
      },
    };
    const core = gw.gatewayWith(new Map([["retail", flaky]]));
    const call = () => core.call(itemGet, { args: { num_iid: demo.retailNumIid }, credentials: a, transport: "legacy", clientIp: "127.0.0.1", idempotencyKey: "retry-me" });
    const failed = await call();
    expect([failed.status.errorCode, failed.kind === "error" ? failed.replayOf : "?"]).toEqual([ErrorCode.TARGET_SERVER_ERROR, undefined]);
    failing = false;
    const retried = await call();
    expect([retried.status.errorCode, retried.replayOf, retried.status.apiInfo.split(" ")[0]]).toEqual([ErrorCode.SUCCESS, undefined, "today:1"]);
    const replayed = await call();
    expect([replayed.status.errorCode, replayed.replayOf, replayed.status.apiInfo.split(" ")[0]]).toEqual([ErrorCode.SUCCESS, retried.status.requestId, "today:1"]);
  });

  it("lets a page of an allowed origin send the key and read that its answer is a replay", async () => {
    const a = await gw.newAccount({ dailyMax: 100 });
    const preflight = await fetch(`${gw.base}/gateway.catalogue.v1.RetailService/ItemGet`, {
      method: "OPTIONS",
      headers: { origin: "https://shop.example", "access-control-request-method": "POST", "access-control-request-headers": "content-type,x-api-key,x-api-secret,idempotency-key" },
    });
    expect(preflight.status).toBe(204);
    expect(preflight.headers.get("access-control-allow-headers")!.toLowerCase().split(/,\s*/)).toContain("idempotency-key");
    const post = () =>
      fetch(`${gw.base}/gateway.catalogue.v1.RetailService/ItemGet`, {
        method: "POST",
        headers: { origin: "https://shop.example", "content-type": "application/json", "x-api-key": a.key, "x-api-secret": a.secret, "idempotency-key": "page-1" },
        body: JSON.stringify({ numIid: demo.retailNumIid }),
      });
    await (await post()).text();
    const again = await post();
    expect(again.headers.get("idempotent-replayed")).toBe("true");
    expect(again.headers.get("access-control-expose-headers")!.toLowerCase().split(/,\s*/)).toEqual(expect.arrayContaining(["idempotent-replayed", "original-request-id"]));
  });
});

describe("a charged call's key, through a restart of the embedded store", () => {
  it("is still answered again, not charged, by the next process", async () => {
    const dataDir = mkdtempSync(join(tmpdir(), "gateway-keys-restart-"));
    try {
      let gw = await startGateway({ dataDir });
      const a = await gw.newAccount({ dailyMax: 100 });
      const get = () =>
        fetch(`${gw.base}/retail/item_get/?${new URLSearchParams({ key: a.key, secret: a.secret, num_iid: demo.retailNumIid })}`, { headers: { "idempotency-key": "kept" } }).then(
          async (r): Promise<Record<string, string | null>> => ({ ...((await r.json()) as Record<string, string>), original: r.headers.get("original-request-id") }),
        );
      const first = await get();
      expect(first.error_code).toBe("0000");
      await gw.close();
      gw = await startGateway({ dataDir });
      const again = await get();
      expect([again.error_code, again.original, again.api_info!.split(" ")[0]]).toEqual(["0000", first.request_id, "today:1"]);
      await gw.close();
    } finally {
      rmSync(dataDir, { recursive: true, force: true });
    }
  });
});
