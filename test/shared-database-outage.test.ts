// Issue 13, property 7 with a real process: a shared-mode gateway whose PostgreSQL goes away (a
// loopback TCP proxy in front of the real server, closed and reopened by the test) answers 4000,
// uncharged, naming PostgreSQL, and serves again by itself when it comes back; its log says so once a
// window, not once a call (src/transports/server/repeated-lines.ts), and every call keeps its access line.
import type { ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { openRedis } from "../src/stores/redis/redis-client.ts";
import { runCli } from "./support/cli.ts";
import { startServe } from "./support/gateway-process.ts";
import { demo } from "./support/gateway-fixture.ts";
import { freshDatabase } from "./support/postgres.ts";
import { tcpProxy, type TcpProxy } from "./support/tcp-proxy.ts";

let db: Awaited<ReturnType<typeof freshDatabase>>;
let gateway: ChildProcess;
let base: string;
let output: () => string;
let proxy: TcpProxy;
let env: Record<string, string>;

beforeAll(async () => {
  db = await freshDatabase("outage");
  proxy = await tcpProxy(5432);
  const url = new URL(db.url);
  url.port = String(proxy.port);
  env = { GATEWAY_DATABASE_URL: url.href, GATEWAY_REDIS_URL: "redis://127.0.0.1:6379/7" };
  ({ child: gateway, base, output } = await startServe(env, { demo: true }));
}, 60_000);

afterAll(async () => {
  gateway?.kill("SIGKILL");
  await proxy?.close();
  await db?.drop();
  // Redis database 7 is this file's own: empty it again.
  const redis = await openRedis("redis://127.0.0.1:6379/7");
  await redis.flushdb();
  redis.disconnect();
});

describe("a shared-mode gateway when PostgreSQL goes away", () => {
  it("answers 4000, uncharged, naming PostgreSQL, and serves again by itself when it returns", async () => {
    const created = await runCli(["accounts", "create", "--json", "--name", randomBytes(3).toString("hex")], env);
    const a = JSON.parse(created.stdout) as { key: string; secret: string };
    // Every answer naming PostgreSQL, by request id: each is one error line the gateway would write.
    const unreachable = new Set<string>();
    const call = async () => {
      const answer = (await (await fetch(`${base}/wholesale/item_get/?${new URLSearchParams({ key: a.key, secret: a.secret, num_iid: demo.wholesaleNumIid })}`)).json()) as {
        error_code: string;
        reason: string;
        request_id: string;
      };
      if (answer.error_code === "4000" && answer.reason.includes("PostgreSQL")) unreachable.add(answer.request_id);
      return answer;
    };
    expect((await call()).error_code).toBe("0000");
    const readyz = async () => {
      const res = await fetch(`${base}/readyz`);
      return { status: res.status, body: (await res.json()) as { failing?: string[]; checks: Record<string, { ok: boolean; reason?: string }> } };
    };
    const before = await readyz();
    expect(before.status).toBe(200);
    expect(Object.keys(before.body.checks).sort()).toEqual(["draining", "postgres", "redis"]);

    await proxy.set("closed");
    await new Promise((r) => setTimeout(r, 1100)); // past what the replica remembers of the account
    const down = await call();
    expect(down.error_code).toBe("4000");
    expect(down.reason).toContain("PostgreSQL");
    // Readiness says so too, naming PostgreSQL and nothing else.
    const unready = await readyz();
    expect(unready.status).toBe(503);
    expect(unready.body.failing).toEqual(["postgres"]);
    // Callers go on calling (20 at a time) while it is away.
    const outageStarted = Date.now();
    const burst = await Promise.all(Array.from({ length: 300 }, (_, i) => new Promise((r) => setTimeout(r, Math.floor(i / 20) * 5)).then(call)));
    expect(burst.every((b) => b.error_code === "4000")).toBe(true);

    await proxy.set("open");
    const until = Date.now() + 15_000;
    let code = "";
    while (code !== "0000" && Date.now() < until) {
      await new Promise((r) => setTimeout(r, 200));
      code = (await call()).error_code;
    }
    expect(code).toBe("0000");
    expect((await readyz()).status).toBe(200);
    // Nothing was charged while it was away: the account was charged for exactly the two calls that answered 0000.
    const usage = JSON.parse((await runCli(["usage", "--account", a.key, "--json"], env)).stdout) as { totals: { code: string; charge: string; calls: number }[] };
    expect(usage.totals.filter((t) => t.charge === "charged").reduce((n, t) => n + t.calls, 0)).toBe(2);

    // A stop writes what the log still holds back, then its last line.
    const exited = new Promise((r) => gateway.once("exit", r));
    gateway.kill("SIGTERM");
    await exited;
    const outageSeconds = (Date.now() - outageStarted) / 1000;
    const lines = output()
      .split("\n")
      .filter((l) => l.startsWith("{"))
      .map((l) => JSON.parse(l) as { level: number; msg: string; requestId?: string; errorCode?: string; repeated?: number; err?: { stack?: string } });
    expect(lines.at(-1)!.msg).toBe("stopped");
    // The cause every call met: written whole (with its stack) once a window of 10 s, and counted in between,
    // so whole lines and counts add up to one a call, and no call's line was lost or written twice.
    const told = lines.filter((l) => l.level === 50 && l.msg.startsWith("the shared database (PostgreSQL) cannot be reached"));
    const whole = told.filter((l) => l.repeated === undefined);
    expect(unreachable.size).toBeGreaterThanOrEqual(301);
    expect(whole.length + told.reduce((n, l) => n + (l.repeated ?? 0), 0)).toBe(unreachable.size);
    expect(whole.length).toBeLessThanOrEqual(Math.ceil(outageSeconds / 10) + 1);
    expect(whole.every((l) => l.err?.stack !== undefined && unreachable.has(l.requestId!))).toBe(true);
    // Every call keeps its own access line, with its code.
    const completed = new Map(lines.filter((l) => l.msg === "request completed").map((l) => [l.requestId, l.errorCode]));
    expect([...unreachable].every((id) => completed.get(id) === "4000")).toBe(true);
    // No line was written hundreds of times: whatever else the outage made the gateway say, once a window too.
    const errorLines = lines.filter((l) => l.level >= 40);
    expect(errorLines.length).toBeLessThan(30);
  });
});
