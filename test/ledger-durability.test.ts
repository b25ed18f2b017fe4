import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { DatabaseSync } from "node:sqlite";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { demo } from "./support/gateway-fixture.ts";
import { root, runCli } from "./support/cli.ts";

let dir: string;
let env: Record<string, string>;
let account: { key: string; secret: string };

interface Server {
  child: ChildProcess;
  base: string;
  exited: Promise<number | null>;
}

async function startServer(): Promise<Server> {
  const child = spawn(process.execPath, [join(root, "bin", "gateway.js"), "serve", "--demo"], { cwd: root, env: { ...process.env, ...env }, stdio: ["ignore", "pipe", "pipe"] });
  const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
  let out = "";
  const base = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no start: ${out}`)), 20_000);
    const onData = (d: Buffer) => {
      out += d.toString();
      const m = /listening on (http:\/\/\S+)/.exec(out);
      if (m) {
        clearTimeout(timer);
        resolve(m[1]!);
      }
    };
    child.stdout!.on("data", onData);
    child.stderr!.on("data", onData);
  });
  return { child, base, exited };
}

/** Workers calling until told to stop; every answer a client received is kept. */
function load(base: string, workers: number) {
  const received: { requestId: string; code: string }[] = [];
  let stop = false;
  const ids = [demo.retailNumIid, "123", demo.retailNumIid, "x"];
  const run = async (w: number) => {
    for (let i = 0; !stop; i++) {
      const q = new URLSearchParams({ key: account.key, secret: account.secret, num_iid: ids[(w + i) % ids.length]! });
      try {
        const json = (await (await fetch(`${base}/retail/item_get/?${q}`)).json()) as { request_id: string; error_code: string };
        received.push({ requestId: json.request_id, code: json.error_code });
      } catch {
        return; // the server went away
      }
    }
  };
  const done = Promise.all(Array.from({ length: workers }, (_, w) => run(w)));
  return { received, stop: () => ((stop = true), done), done };
}

function ledger(): { rows: Map<string, { charge: string; code: number }[]>; charged: number; counted: number } {
  const db = new DatabaseSync(join(dir, "gateway.db"), { readOnly: true });
  try {
    const rows = new Map<string, { charge: string; code: number }[]>();
    for (const r of db.prepare("SELECT request_id, charge, error_code FROM ledger").all() as { request_id: string; charge: string; error_code: number }[]) {
      rows.set(r.request_id, [...(rows.get(r.request_id) ?? []), { charge: r.charge, code: Number(r.error_code) }]);
    }
    const charged = Number((db.prepare("SELECT count(*) AS n FROM ledger WHERE account = ? AND charge = 'charged'").get(account.key) as { n: number }).n);
    const counted = Number((db.prepare("SELECT coalesce(sum(charged), 0) AS n FROM usage_daily WHERE account = ?").get(account.key) as { n: number }).n);
    return { rows, charged, counted };
  } finally {
    db.close();
  }
}

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), "gateway-crash-"));
  env = { GATEWAY_DATA_DIR: dir, GATEWAY_PORT: "0", GATEWAY_LOG_LEVEL: "silent", GATEWAY_ADMIN_TOKEN: "crash-test-admin-token" };
  const created = await runCli(["accounts", "create", "--json", "--max", "10000000", "--concurrency", "1000"], env);
  account = JSON.parse(created.stdout) as { key: string; secret: string };
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe("the ledger through crashes", () => {
  it("SIGKILL under load loses no row of an answered call and writes none twice; a restart carries on", async () => {
    const server = await startServer();
    const traffic = load(server.base, 12);
    // Killed once well into the load: after 100 answers at least (1.5 s made only 52 on a busy machine once), whatever
    // the machine's speed.
    await new Promise((r) => setTimeout(r, 1500));
    for (let waited = 0; traffic.received.length <= 100 && waited < 20_000; waited += 50) await new Promise((r) => setTimeout(r, 50));
    server.child.kill("SIGKILL");
    await server.exited;
    await traffic.stop();
    expect(traffic.received.length).toBeGreaterThan(100);

    const { rows, charged, counted } = ledger();
    for (const { requestId, code } of traffic.received) {
      const found = rows.get(requestId);
      expect(found, `row of answered call ${requestId} (${code})`).toHaveLength(1);
      expect(String(found![0]!.code).padStart(4, "0")).toBe(code);
      expect(found![0]!.charge).toBe(code === "0000" || code === "2000" ? "charged" : "ignored");
    }
    expect(counted).toBe(charged);
    const answeredCharged = traffic.received.filter((r) => r.code === "0000" || r.code === "2000").length;
    console.info(`SIGKILL: ${traffic.received.length} answers received (${answeredCharged} charged); ledger ${rows.size} rows, ${charged} charged`);

    const newestBefore = [...rows.keys()].sort().at(-1)!;
    const again = await startServer();
    const after = load(again.base, 4);
    await new Promise((r) => setTimeout(r, 300));
    await after.stop();
    expect(after.received.length).toBeGreaterThan(0);
    const seen = new Set(traffic.received.map((r) => r.requestId));
    expect(after.received.every((r) => !seen.has(r.requestId))).toBe(true);
    // Ids are time-ordered text: the restarted process continues after the newest one recorded.
    for (const r of after.received) expect(r.requestId > newestBefore, `${r.requestId} after ${newestBefore}`).toBe(true);

    // SIGTERM under load: answered calls drain and every one is on the ledger.
    const drain = load(again.base, 8);
    await new Promise((r) => setTimeout(r, 500));
    again.child.kill("SIGTERM");
    expect(await again.exited).toBe(0);
    await drain.stop();
    const final = ledger();
    for (const { requestId } of [...after.received, ...drain.received]) expect(final.rows.get(requestId), requestId).toHaveLength(1);
    expect(final.counted).toBe(final.charged);
  });

  it("keeps an account's rate through a SIGKILL and a restart: no fresh burst", async () => {
    const rated = JSON.parse((await runCli(["accounts", "create", "--json", "--rate", "1/h", "--burst", "2"], env)).stdout) as { key: string; secret: string };
    const call = async (base: string) => {
      const res = await fetch(`${base}/retail/item_get/?${new URLSearchParams({ key: rated.key, secret: rated.secret, num_iid: demo.retailNumIid })}`);
      const json = (await res.json()) as { error_code: string; reason: string };
      return { code: json.error_code, reason: json.reason, left: res.headers.get("ratelimit") };
    };
    const waitOf = (reason: string) => Number(/admitted in (\d+) ms$/.exec(reason)?.[1]);
    const server = await startServer();
    expect([(await call(server.base)).code, (await call(server.base)).code]).toEqual(["0000", "0000"]);
    const refused = await call(server.base);
    expect(refused.code).toBe("4008");
    server.child.kill("SIGKILL");
    await server.exited;
    // Before, a restart forgot the rate: this call was 0000, and so was the next.
    const again = await startServer();
    const after = await call(again.base);
    expect([after.code, after.left]).toEqual(["4008", expect.stringContaining('"rate";r=0;')]);
    // The same place as before the crash, less the time between the two calls.
    expect(waitOf(after.reason)).toBeLessThanOrEqual(waitOf(refused.reason));
    expect(waitOf(after.reason)).toBeGreaterThan(waitOf(refused.reason) - 60_000);
    // And through an ordinary stop and start.
    again.child.kill("SIGTERM");
    expect(await again.exited).toBe(0);
    const third = await startServer();
    expect((await call(third.base)).code).toBe("4008");
    third.child.kill("SIGTERM");
    expect(await third.exited).toBe(0);
  });
});
