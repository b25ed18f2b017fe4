// `npm run soak`: the books held against what callers saw, from outside, under trouble. Three `gateway serve`
// replicas in shared mode (a PostgreSQL database and a redis-server of the run's own) in front of a fake provider
// that is slow, late, failing, limiting or silent at random; callers over legacy, Connect and gRPC, in Chinese and
// translated into English and Russian, some giving up at a random moment, some sending a call again under an
// Idempotency-Key; an operator following the ledger with WatchCalls; a replica killed or stopped and started again
// every 12 to 20 s. Then every answer a caller read is held to its ledger row, and the ledger to the limits, the
// balances, the keys, the provider's own count of requests and what the follower was given. Exits 1 if any check fails.
//
// SOAK_STORE=embedded: one replica on a data directory of the run's own (SQLite), killed or stopped the same way.
// SOAK_SECONDS (default 120), SOAK_CALLERS (24), SOAK_GIVE_UP (0.1: the share of calls whose caller gives up at a
// random moment within 2 s), SOAK_KILLS (on). Shared mode needs PostgreSQL (GATEWAY_TEST_POSTGRES_URL, as the
// tests) and redis-server on the PATH.
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";
import { spawn, type ChildProcess } from "node:child_process";
import { randomUUID } from "node:crypto";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { DatabaseSync } from "node:sqlite";
import pg from "pg";
import { demoRecords } from "../src/catalogue/demo-dataset.ts";
import { RetailService } from "../src/gen/gateway/catalogue/v1/retail_pb.js";
import { AdminService } from "../src/gen/gateway/admin/v1/admin_pb.js";
import { AccountService } from "../src/gen/gateway/account/v1/account_pb.js";
import { CacheMode, Lang, StatusBlockSchema } from "../src/gen/gateway/catalogue/v1/status_pb.js";
import { runCli } from "../test/support/cli.ts";
import { FakeUpstream, type Behaviour } from "../test/support/fake-upstream.ts";
import { freePort, startServe, withoutSecrets, type ServeProcess } from "../test/support/gateway-process.ts";
import { freshDatabase } from "../test/support/postgres.ts";

const seconds = Number(process.env.SOAK_SECONDS ?? 120);
const callers = Number(process.env.SOAK_CALLERS ?? 24);
const giveUp = Number(process.env.SOAK_GIVE_UP ?? 0.1);
const kills = (process.env.SOAK_KILLS ?? "on") !== "off";
const embedded = process.env.SOAK_STORE === "embedded";
const started = Date.now();
const at = () => Date.now() - started;
const random = (n: number) => Math.floor(Math.random() * n);
const pick = <T>(list: readonly T[]): T => list[random(list.length)]!;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
/** The wait the provider asks for with its 429s (Retry-After, whole seconds). */
const askedWaitMs = 1000;
/** How long after asking the provider may still receive a request: one a replica had sent, or one sent before the replica heard. */
const askedWaitGraceMs = 300;

/** The provider's behaviour for one request: mostly answers, sometimes late (past the 1 s attempt), failing, silent or asking to wait. */
function provider(): Behaviour {
  const x = Math.random();
  if (x < 0.7) return { kind: "normal", delayMs: random(150) };
  if (x < 0.75) return { kind: "normal", delayMs: 1300 + random(800) };
  if (x < 0.8) return { kind: "status", status: 502 };
  if (x < 0.83) return { kind: "hang" };
  if (x < 0.86) return { kind: "reset" };
  if (x < 0.9) return { kind: "code", code: "4008" };
  if (x < 0.91) return { kind: "status", status: 429, body: '{"message":"Too Many Requests"}', headers: { "retry-after": String(askedWaitMs / 1000) } };
  if (x < 0.93) return { kind: "garbage" };
  return { kind: "normal" };
}

interface Replica extends ServeProcess {
  readonly id: number;
  alive: boolean;
}

/** One call as its caller saw it; `trace` is the trace id it sent, by which the replica's access line names its request id. */
interface Seen {
  readonly trace: string;
  readonly account: number;
  readonly transport: "legacy" | "connect" | "grpc";
  readonly item: string;
  readonly cacheNo: boolean;
  readonly lang: "cn" | "en" | "ru";
  readonly key: string | undefined;
  readonly start: number;
  end: number;
  outcome: "answered" | "gave_up" | "failed";
  code: string;
  requestId: string;
  replayOf: string | undefined;
}

interface Check {
  readonly name: string;
  readonly ok: boolean;
  readonly detail: string;
}

/** The run's own stores: a data directory (embedded), or a PostgreSQL database and a redis-server (shared). */
const dataDir = embedded ? mkdtempSync(join(tmpdir(), "soak-")) : undefined;
const db = embedded ? undefined : await freshDatabase("soak");
const pool = db === undefined ? undefined : new pg.Pool({ connectionString: db.url, max: 2 });
const redisPort = await freePort();
const redis = embedded ? undefined : spawn("redis-server", ["--port", String(redisPort), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"], { stdio: "ignore" });
/** Rows of a query on the ledger's store, whichever it is ($1 in the SQL for the first parameter). */
async function query<T>(sql: string, params: unknown[] = []): Promise<T[]> {
  if (pool !== undefined) return (await pool.query(sql, params)).rows as T[];
  const sqlite = new DatabaseSync(join(dataDir!, "gateway.db"), { readOnly: true });
  try {
    return sqlite.prepare(sql.replaceAll("$1", "?")).all(...(params as string[])) as T[];
  } finally {
    sqlite.close();
  }
}
const upstream = await new FakeUpstream().start();
const replicas: Replica[] = [];
const outputs: (() => string)[] = [];
const stops: { at: number; replica: number; signal: NodeJS.Signals }[] = [];
const exits: string[] = [];
let exitCode = 1;
try {
  await sleep(300);
  /** Provider answers per item, and requests it received. */
  const answered = new Map<string, number>();
  let received = 0;
  /** When each request came, and when the provider asked the gateway to wait. */
  const arrivals: number[] = [];
  const asked: number[] = [];
  upstream.script = (req) => {
    received++;
    arrivals.push(Date.now());
    const b = provider();
    if (b.kind === "status" && b.status === 429) asked.push(Date.now());
    if (b.kind === "normal") answered.set(req.query.get("num_iid")!, (answered.get(req.query.get("num_iid")!) ?? 0) + 1);
    return b;
  };
  const env: Record<string, string> = {
    ...(db === undefined ? { GATEWAY_DATA_DIR: dataDir! } : { GATEWAY_DATABASE_URL: db.url, GATEWAY_REDIS_URL: `redis://127.0.0.1:${redisPort}` }),
    GATEWAY_ADMIN_TOKEN: `soak-${randomUUID()}`,
    GATEWAY_LOG_LEVEL: "info",
    GATEWAY_ACCESS_LOG: "both",
    GATEWAY_SOURCES: "retail=upstream,wholesale=embedded",
    GATEWAY_UPSTREAM_URL: upstream.url,
    GATEWAY_UPSTREAM_KEY: "soak-key",
    GATEWAY_UPSTREAM_SECRET: `soak-${randomUUID()}`,
    GATEWAY_UPSTREAM_TIMEOUT_MS: "1000",
    GATEWAY_UPSTREAM_DEADLINE_MS: "3000",
    GATEWAY_AUTH_LOCK_AFTER: "1000000",
  };
  const start = async (id: number, demo: boolean) => {
    const serving = await startServe(env, { demo });
    const replica: Replica = Object.assign(serving, { id, alive: true });
    outputs.push(serving.output);
    serving.child.once("exit", (code, signal) => {
      replica.alive = false;
      const stopped = stops.some((s) => s.replica === id && at() - s.at < 30_000);
      if (!stopped) exits.push(`replica ${id} exited by itself at ${at()} ms (code ${code}, signal ${signal})`);
    });
    replicas[id] = replica;
  };
  await start(0, true);
  if (!embedded) await Promise.all([start(1, false), start(2, false)]);
  const create = async (...flags: string[]) => {
    const r = await runCli(["accounts", "create", "--json", ...flags], env);
    if (r.code !== 0) throw new Error(r.stderr);
    return { ...(JSON.parse(r.stdout) as { key: string; secret: string }), flags: flags.join(" ") };
  };
  const accounts = [
    await create("--max", "100000000", "--concurrency", "1000"),
    await create("--max", "300", "--concurrency", "1000"),
    await create("--max", "100000000", "--concurrency", "1000", "--balance", "5", "--price", "retail/item_get=0.01"),
    await create("--max", "100000000", "--concurrency", "4", "--rate", "20/s", "--burst", "20"),
  ];
  const retail = demoRecords().filter((r) => r.kind === "item_detail" && (r.catalogue ?? "retail") === "retail");
  const items = [...retail.filter((r) => r.obtainable).slice(0, 60), ...retail.filter((r) => !r.obtainable).slice(0, 6)].map((r) => (r.item as { num_iid: string }).num_iid);

  /** A replica alive, picked at random, waited for while none is (all stopped at once); undefined once `still()` is false. */
  const someAlive = async (still: () => boolean): Promise<Replica | undefined> => {
    while (still()) {
      const alive = replicas.filter((r) => r.alive);
      if (alive.length > 0) return pick(alive);
      await sleep(50);
    }
    return undefined;
  };
  /** An RPC client's way to a replica: gRPC (HTTP/2) or Connect over HTTP/1.1. */
  const transportTo = (replica: Replica, grpc: boolean) => (grpc ? createGrpcTransport({ baseUrl: replica.base }) : createConnectTransport({ baseUrl: replica.base, httpVersion: "1.1" }));

  const seen: Seen[] = [];
  const call = async (account: number, transport: Seen["transport"], replica: Replica, item: string, cacheNo: boolean, lang: Seen["lang"], giveUpAfter: number | undefined, key: string | undefined) => {
    const a = accounts[account]!;
    const trace = randomUUID().replaceAll("-", "");
    const headers: Record<string, string> = { traceparent: `00-${trace}-${trace.slice(0, 16)}-01`, ...(key === undefined ? {} : { "idempotency-key": key }) };
    const s: Seen = { trace, account, transport, item, cacheNo, lang, key, start: at(), end: 0, outcome: "failed", code: "", requestId: "", replayOf: undefined };
    const abort = new AbortController();
    const timer = giveUpAfter === undefined ? undefined : setTimeout(() => abort.abort(), giveUpAfter);
    try {
      if (transport === "legacy") {
        const query = new URLSearchParams({ key: a.key, secret: a.secret, num_iid: item, lang, ...(cacheNo ? { cache: "no" } : {}) });
        const res = await fetch(`${replica.base}/retail/item_get/?${query}`, { signal: abort.signal, headers });
        const json = JSON.parse(await res.text()) as { error_code: string; request_id: string };
        Object.assign(s, { outcome: "answered", code: json.error_code, requestId: json.request_id, replayOf: res.headers.get("original-request-id") ?? undefined });
      } else {
        const client = createClient(RetailService, transportTo(replica, transport === "grpc"));
        let replayOf: string | undefined;
        try {
          const r = await client.itemGet(
            { numIid: item, cache: cacheNo ? CacheMode.NO : CacheMode.UNSPECIFIED, lang: lang === "en" ? Lang.EN : lang === "ru" ? Lang.RU : Lang.CN },
            { signal: abort.signal, headers: { ...headers, "x-api-key": a.key, "x-api-secret": a.secret }, onHeader: (h) => (replayOf = h.get("original-request-id") ?? undefined) },
          );
          Object.assign(s, { outcome: "answered", code: "0000", requestId: r.status!.requestId, replayOf });
        } catch (e) {
          const error = ConnectError.from(e);
          const status = error.findDetails(StatusBlockSchema)[0];
          if (status === undefined) throw e;
          Object.assign(s, { outcome: "answered", code: String(status.errorCode).padStart(4, "0"), requestId: status.requestId, replayOf: error.metadata.get("original-request-id") ?? undefined });
        }
      }
    } catch (e) {
      s.outcome = abort.signal.aborted ? "gave_up" : "failed";
      s.code = e instanceof ConnectError ? Code[e.code] : ((e as { cause?: { code?: string } }).cause?.code ?? (e as Error).name);
    } finally {
      clearTimeout(timer);
      s.end = at();
    }
    seen.push(s);
  };

  let running = true;
  const caller = async () => {
    for (;;) {
      const replica = await someAlive(() => running);
      if (replica === undefined) return;
      const account = pick([0, 0, 0, 1, 2, 3]);
      const item = pick(items);
      const cacheNo = Math.random() < 0.03;
      const key = Math.random() < 0.1 ? randomUUID() : undefined;
      const lang = pick(["cn", "cn", "cn", "en", "ru"] as const);
      await call(account, pick(["legacy", "connect", "grpc"] as const), replica, item, cacheNo, lang, Math.random() < giveUp ? 10 + random(2000) : undefined, key);
      // Half the calls sent with a key are sent again, to a replica picked anew: charged once, whatever happened.
      if (key !== undefined && Math.random() < 0.5) {
        const again = replicas.filter((r) => r.alive);
        if (again.length > 0) await call(account, pick(["legacy", "connect", "grpc"] as const), pick(again), item, cacheNo, lang, undefined, key);
      }
    }
  };
  const trouble = async () => {
    while (running) {
      await sleep(12_000 + random(8000));
      if (!running) return;
      const alive = replicas.filter((r) => r.alive);
      if (alive.length === 0) continue;
      // Half the time the replica the ledger's follower reads from, so its stream is cut or drained under it.
      const replica = (Math.random() < 0.5 ? alive.find((r) => r.id === followingOn) : undefined) ?? pick(alive);
      const signal: NodeJS.Signals = Math.random() < 0.5 ? "SIGKILL" : "SIGTERM";
      stops.push({ at: at(), replica: replica.id, signal });
      const exited = new Promise((r) => replica.child.once("exit", r));
      replica.child.kill(signal);
      await exited;
      await sleep(500);
      await start(replica.id, false);
    }
  };
  // An operator's follower of the ledger: WatchCalls on one replica at a time, over gRPC or Connect, resumed from the
  // last cursor it received whenever its stream ends (its replica killed or stopped). Every committed call, once.
  // It leaves each stream after 5 to 15 s for another replica, and the trouble stops its replica half the time.
  const followed = new Map<string, number>();
  /** What the follower did, a line each: each stream's start and end, and each message (its calls' ids, its cursor); read when a check fails. */
  const journal: string[] = [];
  /** Where each call was given: the journal's message numbers. */
  const givenAt = new Map<string, number[]>();
  let following = true;
  let followingOn: number | undefined;
  const streamEnds = { ended: 0, broken: 0, left: 0 };
  const followerAbort = new AbortController();
  const follower = async () => {
    let cursor = "";
    for (;;) {
      const replica = await someAlive(() => following);
      if (replica === undefined) return;
      followingOn = replica.id;
      const grpc = Math.random() < 0.5;
      const transport = transportTo(replica, grpc);
      const leave = AbortSignal.timeout(5000 + random(10_000));
      const stream = streamEnds.ended + streamEnds.broken + streamEnds.left + 1;
      journal.push(`${new Date().toISOString()} stream ${stream} on replica ${replica.id} over ${grpc ? "gRPC" : "Connect"} from ${cursor || "(start)"}`);
      try {
        const headers = { authorization: `Bearer ${env.GATEWAY_ADMIN_TOKEN}` };
        for await (const m of createClient(AdminService, transport).watchCalls({ cursor }, { headers, signal: AbortSignal.any([followerAbort.signal, leave]) })) {
          for (const r of m.calls) {
            followed.set(r.requestId, (followed.get(r.requestId) ?? 0) + 1);
            givenAt.set(r.requestId, [...(givenAt.get(r.requestId) ?? []), journal.length]);
          }
          journal.push(`${new Date().toISOString()} stream ${stream} message: ${m.calls.length} calls${m.calls.length > 0 ? ` ${m.calls.map((c) => c.requestId).join(" ")}` : ""}, cursor ${m.cursor}`);
          cursor = m.cursor;
        }
        streamEnds.ended++; // its replica drained (SIGTERM)
        journal.push(`${new Date().toISOString()} stream ${stream} ended by the gateway`);
      } catch (e) {
        if (leave.aborted) streamEnds.left++;
        else if (!followerAbort.signal.aborted) streamEnds.broken++; // its replica killed, or down when asked
        journal.push(`${new Date().toISOString()} stream ${stream} ${leave.aborted ? "left" : "broken"}: ${String(e)}`);
      }
      followingOn = undefined;
      if (following) await sleep(100);
    }
  };
  const following$ = follower();
  // A team following its own calls (account 0's, FollowMyCalls with its key): an answer of 20 calls at most, so
  // answers are often full (where an order wrong by a digit passed over rows), each asked of any replica alive
  // (a cursor is the store's, good on every replica), a fifth of a second apart once caught up.
  const teamFollowed = new Map<string, number>();
  let teamAnswers = 0;
  let teamFailures = 0;
  const teamFollower = async () => {
    let cursor = "";
    for (;;) {
      const replica = await someAlive(() => following);
      if (replica === undefined) return;
      const transport = transportTo(replica, Math.random() < 0.5);
      try {
        const page = await createClient(AccountService, transport).followMyCalls(
          { cursor, pageSize: 20 },
          { headers: { "x-api-key": accounts[0]!.key, "x-api-secret": accounts[0]!.secret }, signal: AbortSignal.any([followerAbort.signal, AbortSignal.timeout(5000)]) },
        );
        teamAnswers++;
        for (const c of page.calls) teamFollowed.set(c.requestId, (teamFollowed.get(c.requestId) ?? 0) + 1);
        cursor = page.cursor;
        if (page.caughtUp) await sleep(200);
      } catch {
        teamFailures++; // its replica killed or down when asked: asked again, of another
        if (following) await sleep(100);
      }
    }
  };
  const teamFollowing$ = teamFollower();
  console.log(`soak: ${seconds} s, ${callers} callers (${Math.round(giveUp * 100)}% of calls given up at random), ${embedded ? "1 replica on the embedded store" : "3 replicas in shared mode"}${kills ? ", one stopped every 12-20 s" : ""}`);
  const all = Array.from({ length: callers }, caller);
  const troubling = kills ? trouble() : Promise.resolve();
  await sleep(seconds * 1000);
  running = false;
  await Promise.all([...all, troubling]);
  // Late answers land within the 3 s deadline; rows are written before answers.
  await sleep(5000);

  const rows = await query<{ request_id: string; account: string; error_code: number; charge: string; price: string | number; upstream_requests: number; at: string | number; latency_us: string | number }>(
    "SELECT request_id, account, error_code, charge, price, upstream_requests, at, latency_us FROM ledger",
  );
  const byId = new Map(rows.map((r) => [r.request_id, r]));
  // The follower catches up with the ledger (a quarter of a second from another replica's commit), or is given 20 s.
  const teamRows = rows.filter((r) => r.account === accounts[0]!.key);
  for (let waited = 0; waited < 20_000 && (rows.some((r) => !followed.has(r.request_id)) || teamRows.some((r) => !teamFollowed.has(r.request_id))); waited += 100) await sleep(100);
  following = false;
  followerAbort.abort();
  await Promise.all([following$, teamFollowing$]);
  const checks: Check[] = [];
  const check = (name: string, problems: string[], detail: string) => checks.push({ name, ok: problems.length === 0, detail: problems.length === 0 ? detail : problems.slice(0, 5).join("; ") + (problems.length > 5 ? `; and ${problems.length - 5} more` : "") });

  const read = seen.filter((s) => s.outcome === "answered");
  const unrecorded: string[] = [];
  const misrecorded: string[] = [];
  for (const s of read) {
    const row = byId.get(s.requestId);
    if (row === undefined) {
      // Refused before an account is known: no row by design.
      if (!["4003", "4004", "4005", "4014"].includes(s.code)) unrecorded.push(`${s.transport} ${s.code} ${s.requestId}`);
      continue;
    }
    const charged = (s.code === "0000" || s.code === "2000") && s.replayOf === undefined;
    if (String(row.error_code).padStart(4, "0") !== s.code || charged !== (row.charge === "charged")) misrecorded.push(`${s.transport} answered ${s.code}${s.replayOf ? " (replay)" : ""}, row ${row.error_code} ${row.charge}`);
  }
  check("every answer a caller read has its ledger row", unrecorded, `${read.length} answers read`);
  check("each row says what its caller was told, charged only for 0000 and 2000 that were not replays", misrecorded, `${read.length} answers`);

  for (const [i, a] of accounts.entries()) {
    const charged = rows.filter((r) => r.account === a.key && r.charge === "charged");
    const day = (await query<{ n: string | number }>("SELECT coalesce(sum(charged), 0) AS n FROM usage_daily WHERE account = $1", [a.key]))[0]!.n;
    const balance = (await query<{ micros: string | number }>("SELECT micros FROM balances WHERE account = $1", [a.key]))[0]?.micros;
    const prices = charged.reduce((n, r) => n + BigInt(r.price), 0n);
    const problems: string[] = [];
    if (Number(day) !== charged.length) problems.push(`its day's count ${day}, its charged rows ${charged.length}`);
    if (i === 1 && charged.length > 300) problems.push(`${charged.length} charged calls for a maximum of 300`);
    if (balance !== undefined && BigInt(balance) !== 5_000_000n - prices) problems.push(`balance ${balance} micros, 5 less its charged prices is ${5_000_000n - prices}`);
    if (balance !== undefined && BigInt(balance) < 0n) problems.push(`balance below zero: ${balance}`);
    check(`account ${i} (${a.flags}): its day, limits and balance agree with its rows`, problems, `${charged.length} charged${balance === undefined ? "" : `, balance ${Number(balance) / 1e6}`}`);
  }

  const byKey = new Map<string, Seen[]>();
  for (const s of seen) if (s.key !== undefined) byKey.set(s.key, [...(byKey.get(s.key) ?? []), s]);
  const twice = [...byKey].filter(([, copies]) => new Set(copies.map((s) => s.requestId).filter((id) => byId.get(id)?.charge === "charged")).size > 1).map(([key]) => key);
  /** What a follower was given against the rows it should have been given: each once, none missed, no other. */
  const givenOnce = (own: readonly { request_id: string }[], given: ReadonlyMap<string, number>, where: (id: string) => string = () => "") => {
    const ids = new Set(own.map((r) => r.request_id));
    return [
      ...own.filter((r) => !given.has(r.request_id)).map((r) => `${r.request_id} never given`),
      ...[...given].filter(([, n]) => n > 1).map(([id, n]) => `${id} given ${n} times${where(id)}`),
      ...[...given.keys()].filter((id) => !ids.has(id)).map((id) => `${id} given, ${byId.has(id) ? "another account's" : "not in the ledger"}`),
    ];
  };
  check(
    "an operator following the ledger (WatchCalls, resumed from its cursor across stops) is given every call once",
    givenOnce(rows, followed, (id) => ` (journal lines ${givenAt.get(id)!.map((at) => at + 1).join(", ")})`),
    `${followed.size} calls over ${streamEnds.ended + streamEnds.broken + streamEnds.left + 1} streams: ${streamEnds.ended} ended by a replica draining, ${streamEnds.broken} broken or refused (a replica killed, stopping or down), ${streamEnds.left} left for another replica`,
  );
  check(
    "a team following its own calls (FollowMyCalls, answers of 20, any replica) is given each of its calls once, and no other account's",
    givenOnce(teamRows, teamFollowed),
    `${teamFollowed.size} calls over ${teamAnswers} answers (${teamFailures} ${teamFailures === 1 ? "ask" : "asks"} failed: a replica killed or down)`,
  );
  check("a call sent again under its Idempotency-Key is charged once", twice, `${byKey.size} keys, ${[...byKey.values()].filter((c) => c.length > 1).length} sent twice`);

  const killed = stops.some((s) => s.signal === "SIGKILL");
  const counted = rows.reduce((n, r) => n + r.upstream_requests, 0);
  // A replica killed while buying sent a request whose row it never wrote.
  check(
    "the ledger counts every request the provider received",
    counted === received || (killed && counted <= received) ? [] : [`the ledger counts ${counted}, the provider received ${received}`],
    `${counted} counted, ${received} received${killed && counted < received ? ` (${received - counted} by replicas killed while buying)` : ""}`,
  );
  const refreshed = new Map<string, number>();
  for (const s of seen) if (s.cacheNo) refreshed.set(s.item, (refreshed.get(s.item) ?? 0) + 1);
  const rebought = [...answered].filter(([item, n]) => n > 1 + (refreshed.get(item) ?? 0)).map(([item, n]) => `${item} answered ${n} times, ${refreshed.get(item) ?? 0} cache=no`);
  checks.push({
    name: "no item is bought again but for cache=no",
    ok: rebought.length === 0 || killed,
    detail: rebought.length === 0 ? `${answered.size} items bought` : `${rebought.slice(0, 5).join("; ")}${killed ? " (a replica was killed: an answer landing there is lost)" : ""}`,
  });
  check("no replica stopped by itself", exits, "none did");
  // A SIGTERM lets calls in flight finish within the grace; an error line a replica wrote is named too.
  const troubles = outputs.flatMap((o, i) =>
    o()
      .split("\n")
      .filter((l) => l.startsWith("{") && /"level":(50|60)/.test(l))
      .map((l) => `start ${i + 1}: ${(JSON.parse(l) as { msg: string }).msg}`),
  );
  check("no replica wrote an error line (a store closed under a call, a grace run out…)", troubles, `${outputs.length} starts`);
  // Every replica holds to a wait the provider asked one of them for (shared through Redis in shared mode).
  const unheeded = asked.flatMap((t) => arrivals.filter((a) => a > t + askedWaitGraceMs && a < t + askedWaitMs - 100).map((a) => `a request ${a - t} ms into a ${askedWaitMs} ms wait`));
  check(
    `a provider that asked to wait (429, Retry-After) is sent nothing by any replica from ${askedWaitGraceMs} ms on`,
    unheeded,
    (() => {
      const early = arrivals.flatMap((a) => asked.filter((t) => a > t && a <= t + askedWaitGraceMs).map((t) => a - t));
      return `${asked.length} waits asked, ${early.length} requests within ${askedWaitGraceMs} ms of one${early.length === 0 ? "" : ` (the latest ${Math.max(...early)} ms after)`}`;
    })(),
  );

  // Charged calls no caller read: a caller that gave up after its answer was on its way (the answer's row commits
  // before it leaves), or one a replica was stopped under. One that had gone well before its answer was ready is over-billed.
  const traceOf = new Map<string, string>();
  for (const output of outputs)
    for (const line of output().split("\n")) {
      if (!line.includes('"incoming request"')) continue;
      const j = JSON.parse(line) as { requestId?: string; req?: { traceId?: string } };
      if (j.requestId !== undefined && j.req?.traceId !== undefined) traceOf.set(j.requestId, j.req.traceId);
    }
  const byTrace = new Map(seen.map((s) => [s.trace, s]));
  const readIds = new Set(read.map((s) => s.requestId));
  const unread = rows.filter((r) => r.charge === "charged" && !readIds.has(r.request_id));
  const goneBefore = unread.filter((r) => {
    const s = byTrace.get(traceOf.get(r.request_id) ?? "");
    return s !== undefined && s.outcome === "gave_up" && s.end < Number(r.at) - started + Number(r.latency_us) / 1000 - 50;
  });
  checks.push({
    name: "no caller that had gone 50 ms before its answer was ready is charged",
    ok: goneBefore.length === 0,
    detail: `${unread.length} charged calls no caller read, ${goneBefore.length} of them given up over 50 ms before the answer${goneBefore
      .slice(0, 5)
      .map((r) => {
        const s = byTrace.get(traceOf.get(r.request_id)!)!;
        const ready = Number(r.at) - started + Number(r.latency_us) / 1000;
        return `; ${r.request_id} (${s.transport}${s.lang === "cn" ? "" : `, ${s.lang}`}${s.cacheNo ? ", cache=no" : ""}${s.key === undefined ? "" : ", with a key"}): ready ${Math.round(Number(r.latency_us) / 1000)} ms after it came, its caller gone ${Math.round(ready - s.end)} ms before`;
      })
      .join("")}`,
  });

  const outcomes = new Map<string, number>();
  for (const s of seen) {
    const what = s.outcome === "answered" ? s.code : `${s.outcome} (${s.code})`;
    outcomes.set(what, (outcomes.get(what) ?? 0) + 1);
  }
  // The transaction ids the shared ledger's rows span: a follower's order crosses a new digit only when they do (10^k).
  const span = pool === undefined ? [] : await query<{ first: string; last: string }>("SELECT min(txid)::text AS first, max(txid)::text AS last FROM ledger");
  const txids = span[0]?.first === undefined || span[0].first === null ? "" : ` (transaction ids ${span[0].first} to ${span[0].last})`;
  console.log(`${seen.length} calls, ${rows.length} ledger rows${txids}; stops: ${stops.map((s) => `${s.signal} replica ${s.replica} at ${Math.round(s.at / 1000)} s`).join(", ") || "none"}`);
  console.log(`what callers saw: ${[...outcomes].sort((a, b) => b[1] - a[1]).map(([k, n]) => `${k} ${n}`).join(", ")}`);
  for (const c of checks) console.log(`${c.ok ? "ok  " : "FAIL"} ${c.name}: ${c.detail}`);
  exitCode = checks.every((c) => c.ok) ? 0 : 1;
  for (const r of goneBefore) {
    const lines = outputs.flatMap((o) => o().split("\n").filter((l) => l.includes(`"${r.request_id}"`)));
    console.log(`${r.request_id}'s log lines:\n${withoutSecrets(lines.join("\n"))}`);
  }
  if (exitCode !== 0) {
    // What each replica wrote (each start its own file), to read a failure by: the secrets masked.
    const dir = join("bench-results", `soak-${new Date(started).toISOString().replaceAll(":", "-")}`);
    mkdirSync(dir, { recursive: true });
    outputs.forEach((o, i) => writeFileSync(join(dir, `start-${i + 1}.log`), withoutSecrets(o())));
    writeFileSync(join(dir, "follower.log"), `${journal.join("\n")}\n`);
    if (pool !== undefined) {
      const ledger = await query<{ txid: string; request_id: string; xmin: string; ctid: string; at: string }>('SELECT txid::text AS txid, request_id, xmin::text AS xmin, ctid::text AS ctid, at::text AS at FROM ledger ORDER BY ledger.txid, request_id COLLATE "C"');
      writeFileSync(join(dir, "ledger.tsv"), ledger.map((r) => `${r.txid}\t${r.request_id}\t${r.xmin}\t${r.ctid}\t${r.at}`).join("\n") + "\n");
    }
    console.log(`what the replicas wrote, a file for each start, and the follower's journal (follower.log): ${dir}`);
  }
} finally {
  for (const r of replicas) r?.child.kill("SIGKILL");
  redis?.kill("SIGKILL");
  await upstream.stop();
  await pool?.end();
  await db?.drop();
  if (dataDir !== undefined) rmSync(dataDir, { recursive: true, force: true });
}
process.exit(exitCode);
