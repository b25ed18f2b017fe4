// A shared-mode gateway whose Redis fails: a loopback TCP proxy in front of the real server (this file's own database,
// 15) freezes it (connections open, nothing answered, until it wakes) and closes it (connections cut, new ones
// refused). Nothing that bills lives in Redis, so the gateway serves on without it: its own catalogue and the copies
// it holds answer, readiness stays green naming Redis as degraded, failed authentications are counted by the replica
// alone, and it shares its cache again by itself when Redis is back. Every 0000 is charged once, nothing else.
import type { ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { demoRecords } from "../src/catalogue/demo-dataset.ts";
import { openRedis } from "../src/stores/redis/redis-client.ts";
import { runCli } from "./support/cli.ts";
import { demo } from "./support/gateway-fixture.ts";
import { startServe, withoutSecrets } from "./support/gateway-process.ts";
import { freshDatabase } from "./support/postgres.ts";
import { tcpProxy, type TcpProxy } from "./support/tcp-proxy.ts";

const redisDb = 15;
let db: Awaited<ReturnType<typeof freshDatabase>>;
let proxy: TcpProxy;
let gateway: ChildProcess;
let base: string;
let output: () => string;
let env: Record<string, string>;

beforeAll(async () => {
  const redis = await openRedis(`redis://127.0.0.1:6379/${redisDb}`);
  await redis.flushdb();
  redis.disconnect();
  db = await freshDatabase("redis_outage");
  proxy = await tcpProxy(6379);
  env = {
    GATEWAY_DATABASE_URL: db.url,
    GATEWAY_REDIS_URL: `redis://127.0.0.1:${proxy.port}/${redisDb}`,
    GATEWAY_AUTH_SLOW_AFTER: "100",
    GATEWAY_AUTH_LOCK_AFTER: "4",
  };
  ({ child: gateway, base, output } = await startServe(env, { demo: true }));
}, 60_000);

afterAll(async () => {
  gateway?.kill("SIGKILL");
  await proxy?.close();
  await db?.drop();
  const redis = await openRedis(`redis://127.0.0.1:6379/${redisDb}`);
  await redis.flushdb();
  redis.disconnect();
});

interface Answer {
  readonly error_code: string;
  readonly reason: string;
  readonly cache: number;
}

const ids = demoRecords()
  .filter((r) => r.kind === "item_detail")
  .map((r) => (r.item as { num_iid: string }).num_iid)
  .filter((id) => id.startsWith("60") && id !== demo.retailNumIid);

describe("a shared-mode gateway when Redis fails", () => {
  it("serves on from its own catalogue and memory, frozen or gone, ready and degraded, and shares again when Redis is back", async () => {
    const a = JSON.parse((await runCli(["accounts", "create", "--json", "--name", randomBytes(3).toString("hex")], env)).stdout) as { key: string; secret: string };
    let served = 0;
    const call = async (numIid: string, secret = a.secret) => {
      const started = Date.now();
      const res = await fetch(`${base}/retail/item_get/?${new URLSearchParams({ key: a.key, secret, num_iid: numIid, is_promotion: "1" })}`);
      const answer = (await res.json()) as Answer;
      if (answer.error_code === "0000") served++;
      return { ...answer, ms: Date.now() - started };
    };
    const readyz = async () => {
      await new Promise((r) => setTimeout(r, 300)); // past the reuse of the last report (250 ms)
      const res = await fetch(`${base}/readyz`);
      return { status: res.status, body: (await res.json()) as { status: string; degraded?: string[]; checks: Record<string, { ok: boolean; reason?: string }> } };
    };
    const redisUp = async () => /^gateway_redis_up (\d)$/m.exec(await (await fetch(`${base}/metrics`)).text())?.[1];
    const grpcHealth = async () =>
      ((await (await fetch(`${base}/grpc.health.v1.Health/Check`, { method: "POST", headers: { "content-type": "application/json" }, body: "{}" })).json()) as { status: string }).status;
    const waitUp = async () => {
      const until = Date.now() + 20_000;
      while ((await redisUp()) !== "1" && Date.now() < until) await new Promise((r) => setTimeout(r, 100));
      expect(await redisUp()).toBe("1");
    };
    const storedInRedis = async (numIid: string) => {
      const redis = await openRedis(`redis://127.0.0.1:6379/${redisDb}`);
      try {
        return (await redis.keys(`gateway:*${numIid}*`)).length > 0;
      } finally {
        redis.disconnect();
      }
    };

    // Up: the item is read from the catalogue, then kept (from its second read) in Redis.
    for (let i = 0; i < 3; i++) expect((await call(demo.retailNumIid)).error_code).toBe("0000");
    expect(await storedInRedis(demo.retailNumIid)).toBe(true);
    expect(await redisUp()).toBe("1");
    expect((await readyz()).body).not.toHaveProperty("degraded");

    // Frozen: the first call that asks Redis waits out the command timeout (5 s) and is answered from the copy this
    // replica holds; the calls after it do not ask, and are answered at once, whatever they ask for.
    await proxy.set("frozen");
    await new Promise((r) => setTimeout(r, 1100)); // past the in-process tier's second: the next read asks Redis
    const first = await call(demo.retailNumIid);
    expect([first.error_code, first.cache]).toEqual(["0000", 1]);
    expect(first.ms).toBeGreaterThanOrEqual(4000);
    const after = [];
    for (const id of [demo.retailNumIid, ...ids.slice(0, 5)]) after.push(await call(id));
    expect(after.map((x) => x.error_code)).toEqual(after.map(() => "0000"));
    expect(after[0]!.cache).toBe(1);
    expect(Math.max(...after.map((x) => x.ms))).toBeLessThan(3000);
    expect(await redisUp()).toBe("0");
    const frozen = await readyz();
    expect([frozen.status, frozen.body.status, frozen.body.degraded]).toEqual([200, "ready", ["redis"]]);
    expect(frozen.body.checks.redis).toEqual({ ok: false, reason: "no answer within 5000 ms" });
    expect(await grpcHealth()).toBe("SERVING");

    // Awake: it is seen within its pings, and what the replica stores goes to Redis again.
    await proxy.set("open");
    await waitUp();
    expect((await readyz()).body).not.toHaveProperty("degraded");
    for (let i = 0; i < 2; i++) expect((await call(ids[6]!)).error_code).toBe("0000");
    await expect.poll(() => storedInRedis(ids[6]!)).toBe(true);

    // Gone: connections cut, new ones refused. Calls go on; failed authentications are counted here alone and lock
    // the address at GATEWAY_AUTH_LOCK_AFTER, as one process counts them.
    await proxy.set("closed");
    for (const id of [demo.retailNumIid, ids[6]!, ids[7]!]) expect((await call(id)).error_code).toBe("0000");
    expect(await redisUp()).toBe("0");
    const gone = await readyz();
    expect([gone.status, gone.body.degraded, gone.body.checks.redis?.ok]).toEqual([200, ["redis"], false]);
    const wrong = [];
    for (let i = 0; i < 5; i++) wrong.push((await call(demo.retailNumIid, "not-the-secret")).error_code);
    expect(wrong).toEqual(["4005", "4005", "4005", "4005", "4008"]);
    expect((await call(demo.retailNumIid)).error_code).toBe("4008");

    // Back: shared again, by itself.
    await proxy.set("open");
    await waitUp();
    expect((await readyz()).body).not.toHaveProperty("degraded");

    // Every 0000 charged once, nothing else charged.
    const usage = JSON.parse((await runCli(["usage", "--account", a.key, "--json"], env)).stdout) as { totals: { charge: string; calls: number }[] };
    expect(usage.totals.filter((t) => t.charge === "charged").reduce((n, t) => n + t.calls, 0)).toBe(served);
    expect(served).toBe(15);

    // The log says so once an outage, and once it is over.
    const lines = output()
      .split("\n")
      .filter((l) => l.startsWith("{"))
      .map((l) => JSON.parse(l) as { level: number; msg: string; store?: string; reason?: string });
    const told = lines.filter((l) => l.store === "redis");
    expect(told.map((l) => [l.level, l.msg.slice(0, 50)]), withoutSecrets(told.map((l) => JSON.stringify(l)).join("\n"))).toEqual([
      [40, "the shared cache (Redis) cannot be reached (no ans"],
      [30, "the shared cache (Redis) answers again: replicas s"],
      [40, "the shared cache (Redis) cannot be reached (not co"],
      [30, "the shared cache (Redis) answers again: replicas s"],
    ]);
  }, 90_000);

  it("starts while Redis is away, serving without it, and shares once it answers", async () => {
    const away = await tcpProxy(6379);
    await away.set("closed");
    const replica = await startServe({ ...env, GATEWAY_REDIS_URL: `redis://127.0.0.1:${away.port}/${redisDb}` });
    try {
      const ready = await fetch(`${replica.base}/readyz`);
      expect([ready.status, ((await ready.json()) as { degraded?: string[] }).degraded]).toEqual([200, ["redis"]]);
      const metric = async () => /^gateway_redis_up (\d)$/m.exec(await (await fetch(`${replica.base}/metrics`)).text())?.[1];
      expect(await metric()).toBe("0");
      const a = JSON.parse((await runCli(["accounts", "create", "--json", "--name", randomBytes(3).toString("hex")], env)).stdout) as { key: string; secret: string };
      const answer = (await (await fetch(`${replica.base}/retail/item_get/?${new URLSearchParams({ key: a.key, secret: a.secret, num_iid: ids[10]!, is_promotion: "1" })}`)).json()) as Answer;
      expect(answer.error_code).toBe("0000");
      await away.set("open");
      await expect.poll(metric, { timeout: 20_000, interval: 100 }).toBe("1");
      const told = replica
        .output()
        .split("\n")
        .filter((l) => l.includes('"store":"redis"'))
        .map((l) => JSON.parse(l) as { level: number; reason?: string });
      expect(told.map((l) => l.level)).toEqual([40, 30]);
      expect(told[0]!.reason).toMatch(/^not connected \(\w+: connect ECONNREFUSED 127\.0\.0\.1:\d+\)$/);
    } finally {
      replica.child.kill("SIGKILL");
      await away.close();
    }
  }, 60_000);
});
