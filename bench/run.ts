// npm run bench: the gateway against bare baselines, side by side in one run
// (`npm run bench -- --scale`: cost as the catalogue grows, bench/scale.ts).
// Every server is a child process on loopback; everything started is stopped.
import { create, toBinary } from "@bufbuild/protobuf";
import autocannon from "autocannon";
import { spawn, type ChildProcess } from "node:child_process";
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { availableParallelism, tmpdir } from "node:os";
import { join } from "node:path";
import { demoRecords } from "../src/catalogue/demo-dataset.ts";
import { ItemGetRequestSchema } from "../src/gen/gateway/catalogue/v1/retail_pb.js";
import { addAnswers, allHits, answered, answerText, cacheBytes, type Answers } from "./answers.ts";
import { grpcLoad, type LoadResult } from "./grpc-load.ts";
import { cpuMicros, cpuMicrosOfAll, memoryMb } from "./proc.ts";
import { hasPretenuringFlag, pretenuringFlag } from "../src/memory-budget.ts";

// The load generator (autocannon and the gRPC client run in this process) and every server it starts run
// with V8's allocation-site pretenuring off, as `gateway serve` does (src/memory-budget.ts). With it on, this
// process was slow in 9 of 12 starts (0 of 11 with the flag), for the whole run: at 94% of a core it held the
// bare route's 8 s run to 36-40k req/s (46-55k otherwise), and every p99 took some 10 ms of its own (the bare
// route's went from 3 to 11-13 ms). Its setup (the demo dataset, the cache filled over fetch) most likely
// trained autocannon's hot places into the old generation, as a busy start once did the gateway's (README,
// Performance).
if (!hasPretenuringFlag(process.execArgv, process.env.NODE_OPTIONS) && typeof process.execve === "function") {
  process.execve(process.execPath, [process.execPath, pretenuringFlag, ...process.execArgv, process.argv[1]!, ...process.argv.slice(2)], process.env);
}

const root = join(import.meta.dirname, "..");
const seconds = Number(process.env.BENCH_SECONDS ?? 8);
const warmupSeconds = Number(process.env.BENCH_WARMUP_SECONDS ?? 2);
// Shared mode is loaded this long before its measured seconds: its lease table fills with dead rows at the rate
// of the calls, and what that costs shows only after some tens of thousands of them (sharedCase).
const sharedWarmupSeconds = Number(process.env.BENCH_SHARED_WARMUP_SECONDS ?? 20);
const connections = Number(process.env.BENCH_CONNECTIONS ?? 64);
// The side-by-side ratios: rounds of a short run of the case and of the bare Fastify route each.
const pairedRounds = Number(process.env.BENCH_PAIRED_ROUNDS ?? 4);
const pairedSliceSeconds = Number(process.env.BENCH_PAIRED_SECONDS ?? 2);
const children: ChildProcess[] = [];
const dirs: string[] = [];

const profileDir = process.env.BENCH_PROFILE ? join(root, "bench-results", `profile-${Date.now()}`) : undefined;

function start(script: string, env: Record<string, string>, args: string[] = [], profile = false): Promise<{ child: ChildProcess; ports: number[] }> {
  const flags = [pretenuringFlag, ...(profile && profileDir ? ["--cpu-prof", "--cpu-prof-dir", profileDir] : [])];
  const child = spawn(process.execPath, [...flags, join(root, script), ...args], { cwd: root, env: { ...process.env, ...env }, stdio: ["ignore", "pipe", "pipe"] });
  children.push(child);
  let out = "";
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${script} did not start: ${out}`)), 30_000);
    const read = (d: Buffer) => {
      out += d.toString();
      const gateway = /listening on http:\/\/127\.0\.0\.1:(\d+)/.exec(out);
      const bare = /listening ([\d ]+)\n/.exec(out);
      if (gateway || bare) {
        clearTimeout(timer);
        resolve({ child, ports: (gateway ? [gateway[1]!] : bare![1]!.trim().split(" ")).map(Number) });
      }
    };
    child.stdout!.on("data", read);
    child.stderr!.on("data", read);
    child.once("exit", (code) => reject(new Error(`${script} exited ${code}: ${out}`)));
  });
}

function cli(args: string[], env: Record<string, string>): Promise<string> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [join(root, "bin/gateway.js"), ...args], { cwd: root, env: { ...process.env, ...env }, stdio: ["ignore", "pipe", "inherit"] });
    let out = "";
    child.stdout.on("data", (d: Buffer) => (out += d.toString()));
    child.once("exit", (code) => (code === 0 ? resolve(out) : reject(new Error(`gateway ${args.join(" ")} exited ${code}`))));
  });
}

interface Row {
  case: string;
  rps: number;
  p50: number;
  p99: number;
  max: number;
  errors: number;
  baseline?: string;
  ratio?: number;
  /** The server's CPU per request, in microseconds. */
  cpuUs?: number;
  /** What the gateway answered over the measured seconds (its own count). */
  answers?: Answers;
  note?: string;
}

type AutocannonOptions = Parameters<typeof autocannon>[0];

/** Runs `load` and adds the server's CPU per request. */
async function watched(pid: number, load: () => Promise<LoadResult>): Promise<LoadResult> {
  const before = cpuMicros(pid);
  const r = await load();
  return { ...r, cpuUs: (cpuMicros(pid) - before) / Math.max(1, r.requests) };
}

type Http1Options = Omit<AutocannonOptions, "duration" | "connections" | "pipelining">;

/** A gRPC length-prefixed message: not compressed, its length, the bytes. */
function grpcFrame(message: Uint8Array): Buffer {
  const frame = Buffer.concat([Buffer.from([0, 0, 0, 0, 0]), message]);
  frame.writeUInt32BE(message.length, 1);
  return frame;
}

/** `duration` seconds of HTTP/1.1 load, watched (no warm-up). */
function http1Slice(options: Http1Options, pid: number, duration: number): Promise<LoadResult> {
  return watched(pid, async () => {
    const r = await new Promise<autocannon.Result>((resolve, reject) =>
      autocannon({ ...options, duration, connections, pipelining: 1 } as AutocannonOptions, (err, result) => (err ? reject(err) : resolve(result))),
    );
    return loadResult(r);
  });
}

/** What autocannon measured, as a LoadResult (the server's CPU is added by `watched`). */
function loadResult(r: autocannon.Result): LoadResult {
  return { requests: r.requests.total, errors: r.errors + r.timeouts + r.non2xx, rps: r.requests.average, p50: r.latency.p50, p99: r.latency.p99, max: r.latency.max };
}

/** A warm-up, then the measured seconds; with the gateway's `base`, what it answered in them. */
async function http1(options: Http1Options, pid: number, base?: string): Promise<LoadResult> {
  await http1Slice(options, pid, warmupSeconds);
  const run = () => http1Slice(options, pid, seconds);
  return base === undefined ? run() : answered(base, run);
}

/** `duration` seconds of gRPC load, watched (no warm-up). */
function grpcSlice(url: string, frame: Buffer, headers: Record<string, string>, pid: number, duration: number): Promise<LoadResult> {
  return watched(pid, () => grpcLoad(url, "/gateway.catalogue.v1.RetailService/ItemGet", frame, headers, { sessions: 4, streams: connections, seconds: duration }));
}

async function grpc(url: string, frame: Buffer, headers: Record<string, string>, pid: number, base?: string): Promise<LoadResult> {
  await grpcSlice(url, frame, headers, pid, warmupSeconds);
  const run = () => grpcSlice(url, frame, headers, pid, seconds);
  return base === undefined ? run() : answered(base, run);
}

interface SideBySide {
  /** The case's requests over those of the bare route serving the case's own bytes, in runs of the same length taken in turn: the targets' ratio. */
  readonly ratio: number;
  /** The case's CPU per request over that bare route's, over the same runs. */
  readonly cpuRatio: number;
  /** The case's requests over those of the bare route serving case 1's bytes (the ratio of the rounds before the same-bytes baseline). */
  readonly ratioCase1Bytes: number;
  readonly rounds: readonly { readonly case: number; readonly bare: number; readonly case1Bytes: number }[];
  /** What the gateway answered over the case's runs. */
  readonly answers: Answers | undefined;
}

type Slice = (seconds: number) => Promise<LoadResult>;

/**
 * The lowest and highest of a side-by-side's ratios round by round (case
 * over the bare route serving the same bytes): how far one round strays
 * from the ratio of the sums, which is the target's. On a shared machine a
 * round can land on a neighbour's burst; the spread says how much one run's
 * ratio can be trusted.
 */
function roundSpread(r: SideBySide): string {
  const each = r.rounds.map((x) => x.case / Math.max(1, x.bare));
  return `${Math.min(...each).toFixed(2)}-${Math.max(...each).toFixed(2)}`;
}

/**
 * A case against the bare Fastify route side by side: `pairedRounds`
 * rounds of a `pairedSliceSeconds` run of each, their order reversed every
 * other round, so a neighbour that slows the machine for a while slows
 * both alike. Two runs of the bare route minutes apart on this shared
 * machine have differed by 1.5x and more (19.4k and 11.4k req/s in one
 * bench run); a ratio against one of them measured the neighbour as much as
 * the gateway. Each round also runs the bare route serving case 1's bytes,
 * the baseline of the rounds before each case had its own (`case1Bytes`),
 * unless there is none to run (`bare` serves case 1's bytes itself).
 */
async function sideBySide(bare: Slice, bareCase1Bytes: Slice | undefined, gateway: Slice): Promise<SideBySide> {
  const sides = { case: gateway, bare, case1Bytes: bareCase1Bytes };
  const total = { case: { requests: 0, cpu: 0 }, bare: { requests: 0, cpu: 0 }, case1Bytes: { requests: 0, cpu: 0 } };
  const rounds: { case: number; bare: number; case1Bytes: number }[] = [];
  let answers: Answers | undefined;
  for (let i = 0; i < pairedRounds; i++) {
    const round = { case: 0, bare: 0, case1Bytes: 0 };
    // Without a route serving case 1's bytes of its own (the case's own are case 1's), two sides.
    const order = bareCase1Bytes === undefined ? (["bare", "case"] as const) : (["bare", "case", "case1Bytes"] as const);
    for (const side of i % 2 === 0 ? order : [...order].reverse()) {
      const r = await sides[side]!(pairedSliceSeconds);
      total[side].requests += r.requests;
      total[side].cpu += (r.cpuUs ?? 0) * r.requests;
      round[side] = r.rps;
      if (side === "case") answers = addAnswers(answers, r.answers);
    }
    rounds.push(round);
  }
  const cpu = (t: { requests: number; cpu: number }) => t.cpu / Math.max(1, t.requests);
  return {
    ratio: total.case.requests / Math.max(1, total.bare.requests),
    cpuRatio: cpu(total.case) / cpu(total.bare),
    ratioCase1Bytes: total.case.requests / Math.max(1, (bareCase1Bytes === undefined ? total.bare : total.case1Bytes).requests),
    rounds,
    answers,
  };
}

async function main(): Promise<void> {
  const started = Date.now();
  const data = mkdtempSync(join(tmpdir(), "gateway-bench-"));
  dirs.push(data);
  const env = { GATEWAY_DATA_DIR: data, GATEWAY_PORT: "0", GATEWAY_LOG_LEVEL: "silent" };
  await cli(["accounts", "list"], env); // creates the store
  const gateway = await start("bin/gateway.js", env, ["serve", "--demo"], true);
  const base = `http://127.0.0.1:${gateway.ports[0]}`;
  const account = JSON.parse(await cli(["accounts", "create", "--json", "--max", "1000000000000", "--concurrency", "100000"], env)) as { key: string; secret: string };
  const broke = JSON.parse(await cli(["accounts", "create", "--json", "--max", "0"], env)) as { key: string; secret: string };

  // The realistic item: the most SKUs among the demo items with a long description.
  const records = demoRecords().filter((r) => r.kind === "item_detail" && r.obtainable).map((r) => r.item as { num_iid: string; desc: string; skus: { sku: unknown[] } });
  const item = records.filter((r) => r.desc.length > 1000).sort((a, b) => b.skus.sku.length - a.skus.sku.length)[0]!;
  const peers = demoRecords().find((r) => r.kind === "peer_viewed" && (r.item as unknown[]).length > 0)!;
  const q = (p: Record<string, string>) => new URLSearchParams({ key: account.key, secret: account.secret, ...p }).toString();
  const itemPath = `/retail/item_get/?${q({ num_iid: item.num_iid, is_promotion: "1" })}`;
  const body = Buffer.from(await (await fetch(`${base}${itemPath}`)).arrayBuffer()); // also fills the cache
  const ok = JSON.parse(body.toString()) as { error_code: string };
  if (ok.error_code !== "0000") throw new Error(`the bench account cannot call: ${body.toString().slice(0, 200)}`);
  const rpcHeaders = { "x-api-key": account.key, "x-api-secret": account.secret };
  const request = toBinary(ItemGetRequestSchema, create(ItemGetRequestSchema, { numIid: item.num_iid, isPromotion: "1" }));
  const binaryAnswer = Buffer.from(
    await (await fetch(`${base}/gateway.catalogue.v1.RetailService/ItemGet`, { method: "POST", headers: { "content-type": "application/proto", ...rpcHeaders }, body: request })).arrayBuffer(),
  );

  const jsonRequest = JSON.stringify({ numIid: item.num_iid, isPromotion: "1" });

  // Bytes per cached item, retail and wholesale, by the cache's own count (gateway_cache_bytes): every
  // other obtainable demo item of each catalogue asked for twice as legacy json (a local answer is kept
  // from its second ask, with the rendering it was asked in).
  const bytesPerCachedItem = async (catalogue: "retail" | "wholesale") => {
    const ids = demoRecords()
      .filter((r) => r.kind === "item_detail" && r.obtainable && ((r as { catalogue?: string }).catalogue ?? "retail") === catalogue)
      .map((r) => (r.item as { num_iid: string }).num_iid)
      .filter((id) => id !== item.num_iid);
    const before = await cacheBytes(base);
    for (let pass = 0; pass < 2; pass++) {
      for (const id of ids) {
        const answer = (await (await fetch(`${base}/${catalogue}/item_get/?${q({ num_iid: id, is_promotion: "1" })}`)).json()) as { error_code: string };
        if (answer.error_code !== "0000") throw new Error(`${catalogue} item ${id} answered ${answer.error_code}`);
      }
    }
    return { items: ids.length, bytes: ((await cacheBytes(base)) - before) / ids.length };
  };
  const cachedItem = { retail: await bytesPerCachedItem("retail"), wholesale: await bytesPerCachedItem("wholesale") };

  const rows: Row[] = [];
  const add = (name: string, r: LoadResult, extra: Partial<Row> = {}) => {
    rows.push({ case: name, rps: r.rps, p50: r.p50, p99: r.p99, max: r.max, errors: r.errors, ...(r.cpuUs !== undefined ? { cpuUs: r.cpuUs } : {}), ...(r.answers ? { answers: r.answers } : {}), ...extra });
    console.error(`  ${name}: ${r.rps.toFixed(0)} req/s, p99 ${r.p99.toFixed(2)} ms${r.cpuUs === undefined ? "" : `, ${r.cpuUs.toFixed(0)} µs server CPU per request`}${r.answers ? `; answered ${answerText(r.answers)}` : ""}`);
  };
  const ratio = (name: string, baseline: string) => {
    const row = rows.find((r) => r.case === name)!;
    const b = rows.find((r) => r.case === baseline)!;
    row.baseline = baseline;
    row.ratio = row.rps / b.rps;
  };

  console.error(`benchmark: ${seconds} s per case after ${warmupSeconds} s of warm-up, ${connections} connections, no pipelining`);
  const gw = gateway.child.pid!;
  // Each hit's load, for its own run and for its side-by-side rounds with the bare route.
  const legacyHit = (path: string): Http1Options => ({ url: `${base}${path}` });
  const rpcHit = (contentType: string, payload: Buffer | string): Http1Options => ({
    url: `${base}/gateway.catalogue.v1.RetailService/ItemGet`, method: "POST", headers: { "content-type": contentType, ...rpcHeaders }, body: payload as string,
  });
  const hits = {
    "1. legacy item_get hit, json": legacyHit(itemPath),
    "2a. legacy item_get hit, serialize": legacyHit(`${itemPath}&result_type=serialize`),
    "2b. legacy item_get hit, xml": legacyHit(`${itemPath}&result_type=xml`),
    "2c. legacy item_get hit, var_export": legacyHit(`${itemPath}&result_type=var_export`),
    "2d. legacy item_get hit, jsonu": legacyHit(`${itemPath}&result_type=jsonu`),
    "3. legacy item_search_peerbuy hit": legacyHit(`/wholesale/item_search_peerbuy/?${q({ num_iid: String(peers.num_iid), sid: String(peers.sid) })}`),
    "4a. Connect JSON ItemGet hit": rpcHit("application/json", jsonRequest),
    "4b. Connect binary ItemGet hit": rpcHit("application/proto", Buffer.from(request)),
  };
  const grpcHitCase = "5. gRPC ItemGet hit (h2, node:http2 client)";

  // Each case's own answer, for a bare route serving the same bytes (its side-by-side baseline): a
  // load generator's cost depends on the bytes it reads (autocannon decodes every body as UTF-8 text:
  // 26 µs of its CPU a call for the 7.5 kB binary answer against 13 µs for the ASCII json one), so
  // a baseline serving other bytes charges the load generator differently on the two sides.
  const files = mkdtempSync(join(tmpdir(), "gateway-bench-files-"));
  dirs.push(files);
  writeFileSync(join(files, "body.json"), body);
  writeFileSync(join(files, "answer.bin"), binaryAnswer);
  const frame = grpcFrame(request);
  const bodies: { name: string; route: string; file: string; contentType: string }[] = [];
  for (const [i, [name, o]] of Object.entries(hits).entries()) {
    const r = await fetch(o.url as string, { method: o.method ?? "GET", headers: o.headers as Record<string, string> | undefined, body: o.body as string | undefined });
    bodies.push({ name, route: `/case/${i}`, file: join(files, `case-${i}`), contentType: r.headers.get("content-type") ?? "" });
    writeFileSync(bodies.at(-1)!.file, Buffer.from(await r.arrayBuffer()));
  }
  const grpcAnswer = grpcFrame(binaryAnswer);
  bodies.push({ name: grpcHitCase, route: "/case/grpc", file: join(files, "case-grpc"), contentType: "application/grpc" });
  writeFileSync(join(files, "case-grpc"), grpcAnswer);
  writeFileSync(join(files, "bodies.json"), JSON.stringify(bodies));
  const bareFastify = await start("bench/servers/bare-fastify.ts", { BENCH_BODY_FILE: join(files, "body.json"), BENCH_BODIES: join(files, "bodies.json") });
  const bareConnect = await start("bench/servers/bare-connect.ts", { BENCH_MESSAGE_FILE: join(files, "answer.bin") });
  const bareHttp2 = await start("bench/servers/bare-http2.ts", { BENCH_MESSAGE_FILE: join(files, "answer.bin") });
  const fastifyBase = `http://127.0.0.1:${bareFastify.ports[0]}`;
  const connectBase = `http://127.0.0.1:${bareConnect.ports[0]}`;
  const connectH2 = `http://127.0.0.1:${bareConnect.ports[1]}`;
  const fastifyPid = bareFastify.child.pid!;
  const connectPid = bareConnect.child.pid!;
  const bareRoute: Http1Options = { url: `${fastifyBase}/retail/item_get/` };
  // The floor: node:http, the secret's salted hash and the gateway's own ledger, serving case 1's bytes (bench/servers/bare-ledger.ts).
  const floorDir = mkdtempSync(join(tmpdir(), "gateway-bench-floor-"));
  dirs.push(floorDir);
  const floorSecret = "floor-secret-0123456789abcdefghijklmnopqrs";
  const floorServer = await start("bench/servers/bare-ledger.ts", { BENCH_BODY_FILE: join(files, "body.json"), BENCH_DATA_DIR: floorDir, BENCH_SECRET: floorSecret });
  const floorPid = floorServer.child.pid!;
  const floorLoad: Http1Options = { url: `http://127.0.0.1:${floorServer.ports[0]}/retail/item_get/?${new URLSearchParams({ key: "bench", secret: floorSecret, num_iid: item.num_iid })}` };

  add("baseline: bare Fastify route (case 1 bytes)", await http1(bareRoute, fastifyPid));
  add("floor: node:http + secret's hash + ledger (case 1 bytes)", await http1(floorLoad, floorPid));
  add("baseline: bare connect-node, Connect JSON", await http1({ url: `${connectBase}/gateway.catalogue.v1.RetailService/ItemGet`, method: "POST", headers: { "content-type": "application/json" }, body: jsonRequest }, connectPid));
  add("baseline: bare connect-node, Connect binary", await http1({ url: `${connectBase}/gateway.catalogue.v1.RetailService/ItemGet`, method: "POST", headers: { "content-type": "application/proto" }, body: Buffer.from(request) as unknown as string }, connectPid));
  add("baseline: bare connect-node, gRPC (h2)", await grpc(connectH2, frame, {}, connectPid));
  add("baseline: bare node:http2 gRPC unary handler", await grpc(`http://127.0.0.1:${bareHttp2.ports[0]}`, frame, {}, bareHttp2.child.pid!));

  for (const [name, options] of Object.entries(hits)) add(name, await http1(options, gw, base));
  add(grpcHitCase, await grpc(base, frame, rpcHeaders, gw, base));
  add("7b. over-quota rejections (4013)", await http1({ url: `${base}/retail/item_get/?${new URLSearchParams({ key: broke.key, secret: broke.secret, num_iid: item.num_iid })}` }, gw, base));
  // The bare route again, minutes after its first run: how far apart the two are shows how much the
  // machine moved (the ratios come from the side-by-side rounds below).
  add("baseline: bare Fastify route, second run", await http1(bareRoute, fastifyPid));
  const bareRows = rows.filter((r) => r.case.startsWith("baseline: bare Fastify route"));

  // The targets' ratios: each hit against the bare Fastify route, side by side (see sideBySide).
  const bareSlice = (name: string) => (d: number) => http1Slice({ url: `${fastifyBase}${bodies.find((b) => b.name === name)!.route}` }, fastifyPid, d);
  const bareCase1Bytes = (d: number) => http1Slice(bareRoute, fastifyPid, d);
  const sideCases: [string, (d: number) => Promise<LoadResult>][] = [
    ...Object.entries(hits).map(([name, options]): [string, (d: number) => Promise<LoadResult>] => [name, (d) => answered(base, () => http1Slice(options, gw, d))]),
    [grpcHitCase, (d) => answered(base, () => grpcSlice(base, frame, rpcHeaders, gw, d))],
  ];
  const sideBySides = new Map<string, SideBySide>();
  for (const [name, run] of sideCases) {
    const r = await sideBySide(bareSlice(name), bareCase1Bytes, run);
    sideBySides.set(name, r);
    console.error(`  side by side with the bare Fastify route serving the same bytes: ${name}: ${r.ratio.toFixed(2)}x (by round ${roundSpread(r)}; CPU per request ${r.cpuRatio.toFixed(1)}x; ${r.ratioCase1Bytes.toFixed(2)}x of the route serving case 1's bytes); answered ${r.answers ? answerText(r.answers) : "?"}`);
  }

  // The floor side by side with the same route: how close to it any hit can come while it keeps its ledger row.
  const floor = await sideBySide(bareCase1Bytes, undefined, (d) => http1Slice(floorLoad, floorPid, d));
  console.error(`  side by side with the bare Fastify route serving the same bytes: the floor (node:http + secret's hash + ledger): ${floor.ratio.toFixed(2)}x (CPU per request ${floor.cpuRatio.toFixed(1)}x)`);

  // Last of this gateway's cases: after its flood the loopback address is refused (4008) for five
  // minutes, every call from it (until this round it ran before the side-by-side rounds, which then
  // measured refusals).
  add("7a. flood of wrong secrets", await http1({ url: `${base}/retail/item_get/?${new URLSearchParams({ key: account.key, secret: "wrong", num_iid: item.num_iid })}` }, gw, base), { note: "after 20 failures the address is refused (4008) before any lookup" });
  const peakRss = memoryMb(gateway.child.pid!, "VmHWM");

  // 6: a cold cache in front of an upstream answering in 20 ms: many callers, few items.
  const upstream = await start("bench/servers/fake-upstream.ts", {});
  const data6 = mkdtempSync(join(tmpdir(), "gateway-bench-upstream-"));
  dirs.push(data6);
  const env6 = { GATEWAY_DATA_DIR: data6, GATEWAY_PORT: "0", GATEWAY_LOG_LEVEL: "silent", GATEWAY_UPSTREAM_URL: `http://127.0.0.1:${upstream.ports[0]}`, GATEWAY_UPSTREAM_KEY: "bench", GATEWAY_UPSTREAM_SECRET: "bench-secret" };
  await cli(["accounts", "list"], env6);
  const account6 = JSON.parse(await cli(["accounts", "create", "--json", "--max", "1000000000000", "--concurrency", "100000"], env6)) as { key: string; secret: string };
  const upstreamGateway = await start("bin/gateway.js", env6, ["serve"]);
  const distinct = records.slice(0, 50).map((r) => r.num_iid);
  const requests = distinct.map((id) => ({ path: `/retail/item_get/?${new URLSearchParams({ key: account6.key, secret: account6.secret, num_iid: id })}` }));
  const r6 = await new Promise<autocannon.Result>((resolve, reject) =>
    autocannon({ url: `http://127.0.0.1:${upstreamGateway.ports[0]}`, requests, duration: seconds, connections, pipelining: 1 } as AutocannonOptions, (e, r) => (e ? reject(e) : resolve(r))),
  );
  const upstreamCalls = ((await (await fetch(`http://127.0.0.1:${upstream.ports[0]}/stats`)).json()) as { calls: number }).calls;
  const perCall = upstreamCalls / r6.requests.total;
  const allowed = distinct.length / r6.requests.total + 0.01;
  add("6. cold cache, upstream at 20 ms, 50 items", { requests: r6.requests.total, errors: r6.errors + r6.non2xx, rps: r6.requests.average, p50: r6.latency.p50, p99: r6.latency.p99, max: r6.latency.max }, {
    note: `${upstreamCalls} upstream calls for ${r6.requests.total} gateway calls = ${perCall.toFixed(5)} per call (target at most ${allowed.toFixed(5)})`,
  });

  // 8: shared mode, two replicas on one PostgreSQL and one Redis, the legacy hit spread over both.
  const shared = await sharedCase(item.num_iid);
  if (shared !== undefined) {
    const postgres = shared.postgresCpuUs === undefined ? {} : { note: `PostgreSQL's own CPU per call of the two replicas: ${shared.postgresCpuUs.toFixed(0)} µs (the CPU column is each replica's own); measured after ${sharedWarmupSeconds} s of load` };
    add("8a. shared mode, replica 1 of 2, legacy hit", shared.replicas[0]!, postgres);
    add("8b. shared mode, replica 2 of 2, legacy hit", shared.replicas[1]!);
    ratio("8a. shared mode, replica 1 of 2, legacy hit", "1. legacy item_get hit, json");
    ratio("8b. shared mode, replica 2 of 2, legacy hit", "1. legacy item_get hit, json");
  } else {
    console.error("  8. shared mode: skipped (no PostgreSQL at BENCH_POSTGRES_URL or no Redis at BENCH_REDIS_URL)");
  }

  for (const c of Object.keys(hits).filter((name) => /^[123]\w*\./.test(name))) {
    const row = rows.find((r) => r.case === c)!;
    row.baseline = "bare Fastify route, side by side";
    row.ratio = sideBySides.get(c)!.ratio;
  }
  ratio("4a. Connect JSON ItemGet hit", "baseline: bare connect-node, Connect JSON");
  ratio("4b. Connect binary ItemGet hit", "baseline: bare connect-node, Connect binary");
  ratio(grpcHitCase, "baseline: bare connect-node, gRPC (h2)");
  const vsFastify = (r: Row) => sideBySides.get(r.case)!.ratio;
  const rpcVsFastify = rows
    .filter((r) => /^[45]\w*\./.test(r.case))
    .map((r) => `${r.case}: ${vsFastify(r).toFixed(2)}x of the bare Fastify route serving the same bytes, side by side (CPU per request ${sideBySides.get(r.case)!.cpuRatio.toFixed(1)}x)`);
  const http2Ceiling = rows.find((r) => r.case === "baseline: bare node:http2 gRPC unary handler")!;
  const grpcRow = rows.find((r) => r.case.startsWith("5."))!;
  rpcVsFastify.push(`${grpcRow.case}: ${(grpcRow.rps / http2Ceiling.rps).toFixed(2)}x of the bare node:http2 gRPC unary handler${grpcRow.cpuUs !== undefined && http2Ceiling.cpuUs !== undefined ? ` (CPU per request ${(grpcRow.cpuUs / http2Ceiling.cpuUs).toFixed(1)}x)` : ""}`);

  const hitCases = [...Object.keys(hits), grpcHitCase];
  const hitsAnswered = hitCases.every((c) => allHits(rows.find((r) => r.case === c)!.answers) && allHits(sideBySides.get(c)!.answers));
  const legacyHits = rows.filter((r) => /^[123]\w*\./.test(r.case));
  const connectHits = rows.filter((r) => r.case.startsWith("4"));
  const grpcHit = rows.find((r) => r.case.startsWith("5."))!;
  const targets = [
    { target: "every hit case answered 0000 from the cache on every call (its 8 s run and its side-by-side runs; the ratios below count only then)", met: hitsAnswered },
    { target: "every legacy hit (json, jsonu, serialize, var_export, xml, peerbuy) ≥ 0.6x bare Fastify serving the same bytes (side by side)", met: hitsAnswered && legacyHits.every((r) => vsFastify(r) >= 0.6) },
    { target: "Connect JSON and binary hits ≥ 0.5x bare Fastify serving the same bytes (side by side)", met: hitsAnswered && connectHits.every((r) => vsFastify(r) >= 0.5) },
    { target: "gRPC hit ≥ 0.25x bare Fastify serving the same bytes (side by side)", met: hitsAnswered && vsFastify(grpcHit) >= 0.25 },
    { target: "gateway peak RSS ≤ 250 MB", met: peakRss <= 250 },
    { target: "p99 < 10 ms at 64 connections, every legacy cache-hit case", met: hitsAnswered && legacyHits.every((r) => r.p99 < 10) },
    { target: "upstream calls per gateway call ≤ distinct/total + 1%", met: perCall <= allowed },
    ...(shared !== undefined ? [{ target: "each shared-mode replica ≥ 0.5x the embedded legacy hit", met: rows.filter((r) => r.case.startsWith("8")).every((r) => allHits(r.answers) && (r.ratio ?? 0) >= 0.5) }] : []),
  ];

  const report = {
    when: new Date().toISOString(),
    machine: { cores: availableParallelism(), node: process.version },
    load: { http1: `autocannon, ${connections} connections, pipelining 1`, grpc: `node:http2 closed loop, ${connections} streams over 4 connections`, seconds, warmupSeconds },
    item: { num_iid: item.num_iid, skus: item.skus.sku.length, descBytes: item.desc.length, answerBytes: body.length },
    gatewayPeakRssMb: peakRss,
    cacheBytesPerItem: cachedItem,
    rows,
    sideBySide: { rounds: pairedRounds, seconds: pairedSliceSeconds, cases: Object.fromEntries(sideBySides), floor },
    rpcVsFastify,
    targets,
    elapsedSeconds: (Date.now() - started) / 1000,
  };
  mkdirSync(join(root, "bench-results"), { recursive: true });
  const file = join(root, "bench-results", `bench-${report.when.replace(/[:.]/g, "-")}.json`);
  writeFileSync(file, JSON.stringify(report, null, 2));

  const pad = (s: string, n: number) => s.padEnd(n);
  console.log(`\n${report.machine.cores} cores, Node ${report.machine.node}; HTTP/1.1 load: ${report.load.http1}; gRPC load: ${report.load.grpc}; ${seconds} s per case after ${warmupSeconds} s warm-up; load generator and servers with ${pretenuringFlag}`);
  console.log(`item ${item.num_iid}: ${item.skus.sku.length} SKUs, ${item.desc.length} characters of description, ${body.length} bytes as json; gateway peak RSS ${peakRss.toFixed(1)} MB`);
  const kib = (b: number) => `${(b / 1024).toFixed(1)} KiB`;
  console.log(`bytes the cache counts per cached item, kept with its legacy json rendering: retail ${kib(cachedItem.retail.bytes)} (over ${cachedItem.retail.items} items), wholesale ${kib(cachedItem.wholesale.bytes)} (over ${cachedItem.wholesale.items} items)\n`);
  console.log(`| ${pad("case", 46)} | req/s | p50 ms | p99 ms | max ms | errors | vs baseline | CPU µs/req |`);
  console.log(`|${"-".repeat(48)}|-------|--------|--------|--------|--------|-------------|------------|`);
  for (const r of rows) {
    console.log(
      `| ${pad(r.case, 46)} | ${r.rps.toFixed(0).padStart(5)} | ${r.p50.toFixed(2).padStart(6)} | ${r.p99.toFixed(2).padStart(6)} | ${r.max.toFixed(1).padStart(6)} | ${String(r.errors).padStart(6)} | ${r.ratio === undefined ? "" : `${r.ratio.toFixed(2)}x`.padStart(11)} | ${r.cpuUs === undefined ? "" : r.cpuUs.toFixed(0).padStart(10)} |`,
    );
  }
  for (const r of rows) if (r.note) console.log(`\n${r.case}: ${r.note}`);
  console.log("\nwhat the gateway answered (its own count, over the measured seconds):");
  for (const r of rows) if (r.answers) console.log(`  ${r.case}: ${answerText(r.answers)}`);
  for (const [name, r] of sideBySides) console.log(`  ${name}, side by side: ${r.answers ? answerText(r.answers) : "?"}`);
  console.log(`\nthe bare Fastify route ran twice, first and after case 7 (${bareRows.map((r) => r.rps.toFixed(0)).join(" and ")} req/s); not the ratios' baseline: see side by side below`);
  console.log(`\nside by side with the bare Fastify route serving each case's own bytes (${pairedRounds} rounds of ${pairedSliceSeconds} s each, in turn; the targets' ratios), and with it serving case 1's bytes (the rounds before):\n`);
  console.log(`| ${pad("case", 46)} | vs bare Fastify, same bytes (by round) | CPU per request | vs bare Fastify, case 1's bytes | req/s by round (case / bare, same bytes / bare, case 1's bytes) |`);
  console.log(`|${"-".repeat(48)}|----------------------------------------|-----------------|---------------------------------|------------------------------|`);
  for (const [name, r] of sideBySides) {
    console.log(
      `| ${pad(name, 46)} | ${`${r.ratio.toFixed(2)}x (${roundSpread(r)})`.padStart(38)} | ${`${r.cpuRatio.toFixed(1)}x`.padStart(15)} | ${`${r.ratioCase1Bytes.toFixed(2)}x`.padStart(31)} | ${r.rounds.map((x) => `${x.case.toFixed(0)}/${x.bare.toFixed(0)}/${x.case1Bytes.toFixed(0)}`).join(" ")} |`,
    );
  }
  console.log(
    `\nthe floor, side by side with the same route (node:http, the secret's salted SHA-256 and the gateway's own ledger, one row a call committed before the answer leaves; no routing, cache or rendering): ${floor.ratio.toFixed(2)}x (by round ${roundSpread(floor)}; CPU per request ${floor.cpuRatio.toFixed(1)}x; rounds ${floor.rounds.map((x) => `${x.case.toFixed(0)}/${x.bare.toFixed(0)}`).join(" ")})`,
  );
  console.log(`\n${rpcVsFastify.join("\n")}`);
  console.log("\ntargets:");
  for (const t of targets) console.log(`  ${t.met ? "met    " : "MISSED "} ${t.target}`);
  console.log(`\nwritten to ${file} (${report.elapsedSeconds.toFixed(0)} s)`);
  if (profileDir) {
    // A CPU profile is written when the process exits on its own: stop the gateway gracefully.
    gateway.child.kill("SIGTERM");
    await new Promise((r) => gateway.child.once("exit", r));
    printProfile(profileDir);
  }
}

/**
 * Two gateways in shared mode on a fresh database of the PostgreSQL at
 * BENCH_POSTGRES_URL and the Redis at BENCH_REDIS_URL (database 5 by
 * default, emptied before and after), loaded at once with half the
 * connections each. They are loaded for `sharedWarmupSeconds` before the
 * measured seconds: every call leaves a dead lease behind, and on a fresh
 * database two replicas went from 7.5k-8.4k to 3.8k-3.9k calls a second
 * within a minute when nothing vacuumed them (the meter now does, see
 * PostgresMeter's `settled`); a run of a few seconds would not show it.
 * Undefined when either store is not there.
 */
async function sharedCase(numIid: string): Promise<{ replicas: LoadResult[]; postgresCpuUs: number | undefined } | undefined> {
  const { default: pg } = await import("pg");
  const adminUrl = process.env.BENCH_POSTGRES_URL ?? "postgres://postgres@127.0.0.1:5432/postgres";
  const redisUrl = process.env.BENCH_REDIS_URL ?? "redis://127.0.0.1:6379/5";
  const name = `gw_bench_${Date.now()}`;
  const admin = new pg.Client({ connectionString: adminUrl });
  try {
    await admin.connect();
    await admin.query(`CREATE DATABASE ${name}`);
  } catch {
    return undefined;
  }
  const { openRedis } = await import("../src/stores/redis/redis-client.ts");
  let redis: Awaited<ReturnType<typeof openRedis>>;
  try {
    redis = await openRedis(redisUrl);
    await redis.flushdb();
  } catch {
    await admin.query(`DROP DATABASE IF EXISTS ${name}`).catch(() => {});
    await admin.end();
    return undefined;
  }
  const url = new URL(adminUrl);
  url.pathname = `/${name}`;
  const env = { GATEWAY_DATABASE_URL: url.href, GATEWAY_REDIS_URL: redisUrl, GATEWAY_PORT: "0", GATEWAY_LOG_LEVEL: "silent" };
  try {
    const one = await start("bin/gateway.js", env, ["serve", "--demo"]);
    const two = await start("bin/gateway.js", env, ["serve"]);
    const account = JSON.parse(await cli(["accounts", "create", "--json", "--max", "1000000000000", "--concurrency", "100000"], env)) as { key: string; secret: string };
    const path = `/retail/item_get/?${new URLSearchParams({ key: account.key, secret: account.secret, num_iid: numIid, is_promotion: "1" })}`;
    for (const port of [one.ports[0]!, two.ports[0]!]) {
      const check = (await (await fetch(`http://127.0.0.1:${port}${path}`)).json()) as { error_code: string };
      if (check.error_code !== "0000") throw new Error(`shared mode: the bench account cannot call (${check.error_code})`);
    }
    const run = (port: number, duration: number) =>
      new Promise<autocannon.Result>((resolve, reject) =>
        autocannon({ url: `http://127.0.0.1:${port}${path}`, duration, connections: Math.max(1, connections / 2), pipelining: 1 } as AutocannonOptions, (e, r) => (e ? reject(e) : resolve(r))),
      );
    await Promise.all([run(one.ports[0]!, sharedWarmupSeconds), run(two.ports[0]!, sharedWarmupSeconds)]);
    const cpuBefore = [cpuMicros(one.child.pid!), cpuMicros(two.child.pid!)];
    const postgresBefore = cpuMicrosOfAll("postgres");
    const measured = await Promise.all([one, two].map((r) => answered(`http://127.0.0.1:${r.ports[0]}`, async () => loadResult(await run(r.ports[0]!, seconds)))));
    const cpuAfter = [cpuMicros(one.child.pid!), cpuMicros(two.child.pid!)];
    const postgresAfter = cpuMicrosOfAll("postgres");
    for (const c of [one.child, two.child]) c.kill("SIGTERM");
    await new Promise((r) => setTimeout(r, 500));
    const calls = measured.reduce((n, r) => n + r.requests, 0);
    return {
      replicas: measured.map((r, i) => ({ ...r, cpuUs: (cpuAfter[i]! - cpuBefore[i]!) / Math.max(1, r.requests) })),
      // PostgreSQL's CPU for the two replicas' calls together (every postgres process on this machine), per call.
      postgresCpuUs: postgresBefore === undefined || postgresAfter === undefined ? undefined : (postgresAfter - postgresBefore) / Math.max(1, calls),
    };
  } finally {
    await redis.flushdb().catch(() => {});
    redis.disconnect();
    await admin.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`).catch(() => {});
    await admin.end();
  }
}

/** The functions with the most self time in the gateway's CPU profile, over every case above. */
function printProfile(dir: string): void {
  const file = readdirSync(dir).find((f) => f.endsWith(".cpuprofile"));
  if (file === undefined) return void console.log("no CPU profile was written");
  const profile = JSON.parse(readFileSync(join(dir, file), "utf8")) as {
    nodes: { id: number; callFrame: { functionName: string; url: string; lineNumber: number }; hitCount: number }[];
  };
  const self = new Map<string, number>();
  let total = 0;
  for (const n of profile.nodes) {
    total += n.hitCount;
    const where = `${n.callFrame.functionName || "(anonymous)"} ${n.callFrame.url.replace(/^.*node_modules\//, "").replace(/^file:\/\/.*\/work\/main\//, "").replace(/^file:\/\/.*?\/(src|bench)\//, "$1/")}:${n.callFrame.lineNumber + 1}`;
    self.set(where, (self.get(where) ?? 0) + n.hitCount);
  }
  console.log(`\ngateway CPU profile (${join(dir, file)}), top self time:`);
  for (const [where, hits] of [...self].sort((a, b) => b[1] - a[1]).slice(0, 25)) console.log(`  ${((100 * hits) / total).toFixed(1).padStart(5)}%  ${where}`);
}

const cleanup = () => {
  for (const c of children) c.kill("SIGKILL");
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
};
// `npm run bench -- --scale`: the catalogue-size cases (bench/scale.ts) instead.
const scaleBench = process.argv.includes("--scale") ? await import("./scale.ts") : undefined;
// Stopped by a signal (Ctrl-C, or SIGTERM from `timeout` or a CI runner), it stops every server it started and
// removes its directories first: without a handler, SIGTERM left the gateway and the bare servers running.
for (const [signal, code] of [["SIGINT", 130], ["SIGTERM", 143], ["SIGHUP", 129]] as const) {
  process.once(signal, () => {
    cleanup();
    scaleBench?.cleanupScale();
    process.exit(code);
  });
}
(scaleBench ? scaleBench.scale().finally(scaleBench.cleanupScale) : main()).then(
  () => {
    cleanup();
    process.exit(0);
  },
  (e: unknown) => {
    console.error(e);
    cleanup();
    process.exit(1);
  },
);
