// A shared-mode gateway whose PostgreSQL stops answering rather than going away: the server froze, failed over, or
// a link or a middlebox drops packets, so connections stay open and nothing comes back. A loopback TCP proxy in front
// of the real server plays each case on the connections open at the moment it is told to:
//   silent  drops what either side sends, and holds new connections without connecting them;
//   deaf    passes the gateway's statements on and drops the answers (they commit, and nobody hears), holds new ones;
//   cut     passes the statements on and cuts each connection as its answer comes (a reset after the commit);
//   open    passes everything again (connections held meanwhile stay held: the gateway's own bounds end them).
// A switch can also wait for the next ledger commit the gateway sends (its prepared statement's name in the bytes), so
// that one commit is surely in flight: passed on before going deaf (it commits), or dropped as it goes silent (it never
// arrives).
// Under load, every call is answered within a bound, the replica serves again by itself, and every answer says what
// the ledger holds: each 0000 has its charged row, and no call told "not charged" was charged.
import type { ChildProcess } from "node:child_process";
import net from "node:net";
import { randomBytes } from "node:crypto";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { inTransaction, openPostgres } from "../src/stores/postgres/postgres-database.ts";
import { openRedis } from "../src/stores/redis/redis-client.ts";
import { runCli } from "./support/cli.ts";
import { startServe } from "./support/gateway-process.ts";
import { demo } from "./support/gateway-fixture.ts";
import { freshDatabase } from "./support/postgres.ts";

type Mode = "open" | "silent" | "deaf";

interface Pair {
  readonly client: net.Socket;
  readonly server: net.Socket | undefined;
  /** What happens to this connection's traffic: set when it opened, and for every open one on each switch. */
  mode: Mode | "cut";
}

let db: Awaited<ReturnType<typeof freshDatabase>>;
let proxiedUrl: string;
let gateway: ChildProcess;
let base: string;
/** What the gateway has printed so far. */
let log: () => string;
let env: Record<string, string>;
let proxy: net.Server;
let newConnections: Mode = "open";
const pairs = new Set<Pair>();
/** A switch waiting for the next ledger commit, and what to tell when it happened. */
let atCommit: { readonly mode: "silent" | "deaf" | "cut"; readonly done: () => void } | undefined;
const commitName = Buffer.from("gw_commit\0");
const redisUrl = "redis://127.0.0.1:6379/11";

function openProxy(): Promise<number> {
  proxy = net.createServer((client) => {
    client.on("error", () => {});
    if (newConnections !== "open") {
      // Held: accepted, never connected on, never answered.
      const held: Pair = { client, server: undefined, mode: newConnections };
      pairs.add(held);
      client.on("close", () => pairs.delete(held));
      return;
    }
    const server = net.connect(5432, "127.0.0.1");
    server.on("error", () => {});
    const pair: Pair = { client, server, mode: "open" };
    pairs.add(pair);
    // The last bytes of the chunk before, so a name split between two chunks is still seen.
    let tail = Buffer.alloc(0);
    client.on("data", (d) => {
      const seen = Buffer.concat([tail, d]);
      tail = seen.subarray(Math.max(0, seen.length - commitName.length));
      if (atCommit !== undefined && pair.mode === "open" && seen.includes(commitName)) {
        const { mode, done } = atCommit;
        atCommit = undefined;
        if (mode !== "silent") server.write(d);
        // Cut: this connection alone, as the commit's answer comes; the others go on.
        if (mode === "cut") pair.mode = "cut";
        else switchTo(mode, mode);
        done();
        return;
      }
      if (pair.mode !== "silent") server.write(d);
    });
    server.on("data", (d) => {
      if (pair.mode === "open") client.write(d);
      else if (pair.mode === "cut") (client.destroy(), server.destroy());
    });
    const close = () => (pairs.delete(pair), client.destroy(), server.destroy());
    client.on("close", close);
    server.on("close", close);
  });
  return new Promise((resolve) => proxy.listen(0, "127.0.0.1", () => resolve((proxy.address() as net.AddressInfo).port)));
}

/** Switches the connections open now to `existing`, and what new connections get to `fresh`. */
function switchTo(existing: Mode | "cut", fresh: Mode): void {
  for (const p of pairs) if (p.server !== undefined) p.mode = existing;
  newConnections = fresh;
}

beforeAll(async () => {
  db = await freshDatabase("silence");
  const url = new URL(db.url);
  url.port = String(await openProxy());
  proxiedUrl = url.href;
  env = { GATEWAY_DATABASE_URL: url.href, GATEWAY_REDIS_URL: redisUrl, GATEWAY_LOG_LEVEL: "warn" };
  ({ child: gateway, base, output: log } = await startServe(env, { demo: true }));
}, 60_000);

afterAll(async () => {
  gateway?.kill("SIGKILL");
  for (const p of pairs) (p.client.destroy(), p.server?.destroy());
  await new Promise((r) => proxy?.close(r));
  await db?.drop();
  const redis = await openRedis(redisUrl);
  await redis.flushdb();
  redis.disconnect();
});

interface Answer {
  readonly code: string;
  readonly requestId: string;
  readonly reason: string;
  readonly ms: number;
  /** The Idempotency-Key it was sent with, if any, and whether it was answered as a replay of the key's call. */
  readonly key?: string;
  readonly replayed: boolean;
}

/** One legacy call (with an Idempotency-Key if given), answered within a caller's patience far past the gateway's bounds. */
async function call(account: { key: string; secret: string }, key?: string): Promise<Answer> {
  const url = `${base}/wholesale/item_get/?${new URLSearchParams({ key: account.key, secret: account.secret, num_iid: demo.wholesaleNumIid })}`;
  const t = performance.now();
  const res = await fetch(url, { headers: key === undefined ? {} : { "idempotency-key": key }, signal: AbortSignal.timeout(60_000) });
  const body = (await res.json()) as { error_code: string; request_id: string; reason?: string };
  return { code: body.error_code, requestId: body.request_id, reason: body.reason ?? "", ms: performance.now() - t, key, replayed: res.headers.get("idempotent-replayed") === "true" };
}

/** `loops` callers calling one after another until `stop` resolves (each call with a key of its own if `keyed`): every answer. */
async function load(account: { key: string; secret: string }, loops: number, stop: Promise<unknown>, keyed = false): Promise<Answer[]> {
  const answers: Answer[] = [];
  let stopped = false;
  let n = 0;
  const tag = randomBytes(4).toString("hex");
  void stop.then(() => (stopped = true));
  await Promise.all(
    Array.from({ length: loops }, async () => {
      while (!stopped) answers.push(await call(account, keyed ? `silence-${tag}-${n++}` : undefined));
    }),
  );
  return answers;
}

/** Each answer against the ledger, read from the real server (not through the proxy). */
async function ledgerOf(answers: readonly Pick<Answer, "requestId">[]): Promise<Map<string, { charge: string; error_code: number }>> {
  const c = new pg.Client({ connectionString: db.url });
  await c.connect();
  try {
    const { rows } = await c.query<{ request_id: string; charge: string; error_code: number }>("SELECT request_id, charge, error_code FROM ledger WHERE request_id = ANY($1)", [answers.map((a) => a.requestId)]);
    return new Map(rows.map((r) => [r.request_id, r]));
  } finally {
    await c.end();
  }
}

/** The checks every scenario makes of its answers: each told what the ledger holds. */
async function expectAnswersMatchTheLedger(answers: readonly Answer[]): Promise<void> {
  const ledger = await ledgerOf(answers);
  const wrong: string[] = [];
  for (const a of answers) {
    const row = ledger.get(a.requestId);
    if (a.code === "0000" && row?.charge !== "charged") wrong.push(`0000 ${a.requestId}: ${row?.charge ?? "no row"}`);
    if (a.code === "4000" && !a.reason.includes("did not confirm") && row?.charge === "charged") wrong.push(`4000 "${a.reason}" ${a.requestId}: charged`);
    if (a.code !== "0000" && a.code !== "4000") wrong.push(`${a.code} ${a.requestId}: ${a.reason}`);
  }
  expect(wrong).toEqual([]);
}

async function unanswered(): Promise<Record<string, number>> {
  const text = await (await fetch(`${base}/metrics`)).text();
  const out: Record<string, number> = {};
  for (const m of text.matchAll(/^gateway_ledger_unanswered_calls_total\{outcome="(\w+)"\} (\d+)/gm)) out[m[1]!] = Number(m[2]);
  return out;
}

/** Calls until one answers 0000, for at most `ms`: the replica serving again by itself. */
async function servesAgain(account: { key: string; secret: string }, ms: number): Promise<number> {
  const started = Date.now();
  const url = `${base}/wholesale/item_get/?${new URLSearchParams({ key: account.key, secret: account.secret, num_iid: demo.wholesaleNumIid })}`;
  while (Date.now() - started < ms) {
    const body = (await (await fetch(url, { signal: AbortSignal.timeout(60_000) })).json()) as { error_code: string };
    if (body.error_code === "0000") return Date.now() - started;
    await new Promise((r) => setTimeout(r, 200));
  }
  throw new Error(`not serving ${ms} ms after PostgreSQL answered again`);
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe("a shared-mode gateway whose PostgreSQL stops answering", () => {
  let account: { key: string; secret: string };
  beforeAll(async () => {
    const created = await runCli(["accounts", "create", "--json", "--name", randomBytes(3).toString("hex"), "--max", "100000000", "--concurrency", "1000"], env);
    account = JSON.parse(created.stdout) as { key: string; secret: string };
  }, 30_000);

  it("answers a commit whose answer was cut after it committed as charged, and one that did not commit as not charged", async () => {
    const done = sleep(3000);
    const calls = load(account, 16, done.then(() => sleep(1500)));
    await sleep(1000);
    // The connection of the next commit is cut as its answer comes (it committed); every connection open then is cut
    // as its own next answer comes; new ones go through.
    await new Promise<void>((cut) => (atCommit = { mode: "cut", done: cut }));
    switchTo("cut", "open");
    await done;
    const answers = await calls;
    expect(answers.filter((a) => a.code === "0000").length).toBeGreaterThan(10);
    await expectAnswersMatchTheLedger(answers);
    // Commits had landed when their connections were cut: found in the ledger, and their calls answered.
    expect((await unanswered()).landed).toBeGreaterThan(0);
  }, 60_000);

  it("answers every call within its bounds while PostgreSQL takes statements and sends nothing back, then serves again", async () => {
    const before = await unanswered();
    // Deaf as the next commit goes out after a second of load (so one is surely caught), for 3 s.
    const healed = sleep(1000)
      .then(() => new Promise<void>((done) => (atCommit = { mode: "deaf", done })))
      .then(() => sleep(3000))
      .then(() => switchTo("open", "open"));
    const calls = load(account, 16, healed.then(() => sleep(20_000)));
    await healed;
    const answers = await calls;
    // A statement waits 5 s, a commit's outcome 10 s more; a connection 5 s: nothing near the caller's 60 s.
    expect(Math.max(...answers.map((a) => a.ms))).toBeLessThan(30_000);
    // Whether some call is told 4000 depends on what was in flight at the switch: an admission sent then times out
    // (4000), but when every caller was waiting on the commit caught, none sends one during the 3 s, and each is answered
    // from the ledger once it answers (0000, landed, below). Clean-clone CI saw that once; it asserts nothing here.
    await expectAnswersMatchTheLedger(answers);
    // The commits in flight reached the server and committed; learnt once it answered again, within their 10 s.
    const after = await unanswered();
    expect((after.landed ?? 0) - (before.landed ?? 0)).toBeGreaterThan(0);
    expect(after.unconfirmed ?? 0).toBe(before.unconfirmed ?? 0);
    await servesAgain(account, 15_000);
  }, 90_000);

  /**
   * PostgreSQL out of reach for longer than a commit's wait (5 s) and its settling (10 s), as `mode` plays it. Keyed
   * callers: each call told "unconfirmed" is sent again with its key once the replica serves again. Returns what the
   * replica learnt later of the unconfirmed calls (landed_late, lost_late), and the resent calls' answers.
   */
  async function outOfReachPastTheWait(mode: "silent" | "deaf"): Promise<{ late: { landed_late: number; lost_late: number }; unconfirmed: Answer[]; resent: Answer[] }> {
    const before = await unanswered();
    // Out of reach as the next commit goes out after a second of load, so that at least one is caught in flight.
    const healed = sleep(1000)
      .then(() => new Promise<void>((done) => (atCommit = { mode, done })))
      .then(() => sleep(18_000))
      .then(() => switchTo("open", "open"));
    const answers = await load(account, 16, healed, true);
    expect(Math.max(...answers.map((a) => a.ms))).toBeLessThan(30_000);
    // Commits sent as it went out of reach: not learnt within their 15 s, so their calls were told so, with their ids.
    const unconfirmed = answers.filter((a) => a.reason.includes("did not confirm"));
    expect(unconfirmed.length).toBeGreaterThan(0);
    for (const a of unconfirmed) expect(a.reason).toContain(a.requestId);
    await expectAnswersMatchTheLedger(answers);
    await servesAgain(account, 15_000);
    // Learnt once it answered: each such call is counted again as landed_late or lost_late, as the ledger shows.
    const until = Date.now() + 20_000;
    let after = await unanswered();
    const learnt = () => (after.landed_late ?? 0) + (after.lost_late ?? 0) - (before.landed_late ?? 0) - (before.lost_late ?? 0);
    while (learnt() < unconfirmed.length && Date.now() < until) {
      await sleep(250);
      after = await unanswered();
    }
    expect((after.unconfirmed ?? 0) - (before.unconfirmed ?? 0)).toBe(unconfirmed.length);
    const ledger = await ledgerOf(unconfirmed);
    const charged = unconfirmed.filter((a) => ledger.get(a.requestId)?.charge === "charged");
    const late = { landed_late: (after.landed_late ?? 0) - (before.landed_late ?? 0), lost_late: (after.lost_late ?? 0) - (before.lost_late ?? 0) };
    expect(late.landed_late).toBe(charged.length);
    expect(late.lost_late).toBe(unconfirmed.length - charged.length);
    expect(log()).toContain("could not be asked whether it committed");
    // Each sent again with its key: a call whose commit landed is replayed (its data, not charged again); one whose
    // commit was lost runs, charged once. Either way each key is charged exactly once.
    const resent: Answer[] = [];
    for (const a of unconfirmed) resent.push(await call(account, a.key));
    for (const [i, r] of resent.entries()) {
      expect(r.code).toBe("0000");
      expect(r.replayed).toBe(ledger.get(unconfirmed[i]!.requestId)?.charge === "charged");
    }
    const resentRows = await ledgerOf(resent);
    const chargedAgain = resent.filter((r) => resentRows.get(r.requestId)?.charge === "charged").length;
    expect(charged.length + chargedAgain).toBe(unconfirmed.length);
    return { late, unconfirmed, resent };
  }

  it("tells calls it could not learn about that they are unconfirmed, learns each as the ledger shows it, and charges each keyed call sent again once", async () => {
    // Silent: the commit that set it off was dropped (it never arrives: lost); one sent before whose answer was still
    // on its way landed.
    const { late, unconfirmed } = await outOfReachPastTheWait("silent");
    expect(late.lost_late).toBeGreaterThan(0);
    expect(late.landed_late + late.lost_late).toBe(unconfirmed.length);
  }, 120_000);

  it("learns late that unconfirmed commits landed, says so at error level, and replays their keyed calls uncharged", async () => {
    // Deaf: what was sent reached the server and committed; only the answers were lost.
    const { late, unconfirmed } = await outOfReachPastTheWait("deaf");
    expect(late.landed_late).toBe(unconfirmed.length);
    expect(late.lost_late).toBe(0);
    expect(log()).toContain("were told 4000 and are charged");
  }, 120_000);

  it("fails a transaction whose connection is cut, without ending the process that ran it", async () => {
    // In this process: node-postgres emits a checked-out client's lost connection as an event that, unheard, ends it.
    const pool = openPostgres(proxiedUrl, { max: 1 });
    try {
      const running = inTransaction(pool, (c) => c.query("SELECT pg_sleep(0.5)"));
      await sleep(100);
      switchTo("cut", "open");
      await expect(running).rejects.toThrow(/Connection terminated/);
      // The pool goes on, on a new connection.
      expect((await pool.query<{ n: number }>("SELECT 1 AS n")).rows[0]!.n).toBe(1);
    } finally {
      await pool.end();
    }
  });
});
