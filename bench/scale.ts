// npm run bench -- --scale: what the gateway costs as its catalogue grows.
// For each size (BENCH_SCALE_SIZES, default 10000,100000,1000000) it writes a
// catalogue of that many distinct items, imports it with `gateway import`,
// starts `gateway serve` on it (default memory budget), and reports: import
// rate and peak RSS, database size, random-miss and hit throughput (and the
// server's CPU per call), RSS over a random-miss soak (BENCH_SCALE_SOAK_SECONDS,
// default 60), and the bytes the cache counts per item. Every process it
// starts is stopped and every file it writes is removed.
import autocannon from "autocannon";
import { spawn, type ChildProcess } from "node:child_process";
import { createWriteStream, mkdtempSync, readdirSync, rmSync, statSync, writeFileSync, mkdirSync } from "node:fs";
import { availableParallelism, tmpdir } from "node:os";
import { join } from "node:path";
import { once } from "node:events";
import { demoDetailCopies } from "../src/catalogue/demo-dataset.ts";
import { answerCounts, cacheBytes, type Answers } from "./answers.ts";
import { cpuMicros, memoryMb } from "./proc.ts";

const root = join(import.meta.dirname, "..");
const sizes = (process.env.BENCH_SCALE_SIZES ?? "10000,100000,1000000").split(",").map(Number);
const seconds = Number(process.env.BENCH_SECONDS ?? 10);
const soakSeconds = Number(process.env.BENCH_SCALE_SOAK_SECONDS ?? 60);
const connections = Number(process.env.BENCH_CONNECTIONS ?? 64);
const firstId = 800_000_000_000;
const children: ChildProcess[] = [];
const dirs: string[] = [];

const dirBytes = (dir: string): number => readdirSync(dir).reduce((n, f) => n + statSync(join(dir, f)).size, 0);

/** Runs `gateway <args>`; resolves with its stdout, its wall time and its peak RSS. */
function gateway(args: string[], env: Record<string, string>): Promise<{ out: string; ms: number; peakMb: number }> {
  const started = Date.now();
  const child = spawn(process.execPath, [join(root, "bin/gateway.js"), ...args], { cwd: root, env: { ...process.env, ...env }, stdio: ["ignore", "pipe", "pipe"] });
  children.push(child);
  let out = "";
  let err = "";
  let peak = 0;
  const sampler = setInterval(() => {
    try {
      peak = Math.max(peak, memoryMb(child.pid!, "VmHWM"));
    } catch {
      // gone
    }
  }, 200);
  child.stdout.on("data", (d: Buffer) => (out += d.toString()));
  child.stderr.on("data", (d: Buffer) => (err += d.toString()));
  return new Promise((resolve, reject) =>
    child.once("exit", (code) => {
      clearInterval(sampler);
      if (code === 0) resolve({ out, ms: Date.now() - started, peakMb: peak });
      else reject(new Error(`gateway ${args.join(" ")} exited ${code}: ${err.slice(-500)}`));
    }),
  );
}

async function writeCatalogue(file: string, n: number): Promise<void> {
  const out = createWriteStream(file);
  for (const record of demoDetailCopies(n, firstId)) {
    if (!out.write(`${JSON.stringify(record)}\n`)) await once(out, "drain");
  }
  out.end();
  await once(out, "finish");
}

function load(url: string, path: (random: boolean) => string, random: boolean, duration: number, pid: number, onSample?: () => void) {
  const before = cpuMicros(pid);
  const sampler = onSample === undefined ? undefined : setInterval(onSample, 250);
  return new Promise<{ rps: number; p99: number; errors: number; cpuUs: number }>((resolve, reject) =>
    autocannon(
      { url, connections, duration, requests: [{ setupRequest: (req) => ({ ...req, path: path(random) }) }] },
      (e, r) => {
        if (sampler) clearInterval(sampler);
        if (e) return reject(e);
        resolve({ rps: r.requests.average, p99: r.latency.p99, errors: r.errors + r.timeouts + r.non2xx, cpuUs: (cpuMicros(pid) - before) / Math.max(1, r.requests.total) });
      },
    ),
  );
}

interface ScaleRow {
  items: number;
  importSeconds: number;
  importRate: number;
  importPeakMb: number;
  databaseMb: number;
  miss: { rps: number; p99: number; errors: number; cpuUs: number };
  hit: { rps: number; p99: number; errors: number; cpuUs: number };
  soakPeakMb: number;
  soakEndMb: number;
  cacheBytesPerItem: number;
  cachedItems: number;
  /** Of the random calls, the share the cache did not hold. */
  missShare: number;
  /** Calls of the measured random and hit loads the gateway answered with another code than 0000 (its own count). */
  notAnswered: number;
}

async function scaleCase(n: number): Promise<ScaleRow> {
  const dir = mkdtempSync(join(tmpdir(), `gateway-scale-${n}-`));
  dirs.push(dir);
  const data = join(dir, "data");
  const env = { GATEWAY_DATA_DIR: data, GATEWAY_PORT: "0", GATEWAY_LOG_LEVEL: "warn" };
  const file = join(dir, "catalogue.ndjson");
  console.error(`  ${n} items: writing the catalogue`);
  await writeCatalogue(file, n);
  console.error(`  ${n} items: importing`);
  const imported = await gateway(["import", file], env);
  rmSync(file);
  const account = JSON.parse((await gateway(["accounts", "create", "--json", "--max", "1000000000000", "--concurrency", "100000"], env)).out) as { key: string; secret: string };
  const databaseMb = dirBytes(data) / 1_048_576;

  const server = spawn(process.execPath, [join(root, "bin/gateway.js"), "serve"], { cwd: root, env: { ...process.env, ...env }, stdio: ["ignore", "pipe", "pipe"] });
  children.push(server);
  let out = "";
  const base = await new Promise<string>((resolve, reject) => {
    const read = (d: Buffer) => {
      out += d.toString();
      const m = /"url":"(http:\/\/127\.0\.0\.1:\d+)"/.exec(out);
      if (m) resolve(m[1]!);
    };
    server.stdout!.on("data", read);
    server.stderr!.on("data", read);
    server.once("exit", (code) => reject(new Error(`serve exited ${code}: ${out}`)));
  });
  const pid = server.pid!;
  const q = (id: number) => `/retail/item_get/?${new URLSearchParams({ key: account.key, secret: account.secret, num_iid: String(firstId + id) })}`;
  const path = (random: boolean) => q(random ? Math.floor(Math.random() * n) : 7);

  // Bytes per cached item: the cache's own count after K distinct items, each called twice as legacy
  // json (the second call keeps the rendering's bytes too, as every later hit finds them).
  const k = Math.min(500, n);
  const before = await cacheBytes(base);
  for (let i = 0; i < 2 * k; i++) await fetch(`${base}${q(n - 1 - (i % k))}`).then((r) => r.arrayBuffer());
  const cacheBytesPerItem = ((await cacheBytes(base)) - before) / k;
  const cacheEvents = async () => {
    const text = await (await fetch(`${base}/metrics`)).text();
    const count = (result: string) => [...text.matchAll(new RegExp(`^gateway_cache_events_total\\{[^}]*result="${result}"[^}]*\\} (\\d+)`, "gm"))].reduce((s, m) => s + Number(m[1]), 0);
    return { hit: count("hit"), miss: count("miss") };
  };

  console.error(`  ${n} items: random misses, then hits, ${seconds} s each`);
  await load(base, path, true, 2, pid);
  const e0 = await cacheEvents();
  const a0 = await answerCounts(base);
  const miss = await load(base, path, true, seconds, pid);
  const aMiss = await answerCounts(base);
  const e1 = await cacheEvents();
  const missShare = (e1.miss - e0.miss) / Math.max(1, e1.miss - e0.miss + e1.hit - e0.hit);
  await load(base, path, false, 2, pid);
  const a1 = await answerCounts(base);
  const hit = await load(base, path, false, seconds, pid);
  const a2 = await answerCounts(base);
  // Every measured call should be a 0000 (a legacy refusal is an HTTP 200 too, so autocannon cannot tell).
  const others = (from: Answers, to: Answers) => to.calls - from.calls - ((to.byCode["0000"] ?? 0) - (from.byCode["0000"] ?? 0));
  console.error(`  ${n} items: random-miss soak, ${soakSeconds} s`);
  let soakPeak = 0;
  await load(base, path, true, soakSeconds, pid, () => (soakPeak = Math.max(soakPeak, memoryMb(pid, "VmRSS"))));
  const soakEndMb = memoryMb(pid, "VmRSS");
  const peakMb = memoryMb(pid, "VmHWM");
  const cachedItems = Math.round((await cacheBytes(base)) / cacheBytesPerItem);
  server.kill("SIGTERM");
  await once(server, "exit");
  rmSync(dir, { recursive: true, force: true });
  return {
    items: n,
    importSeconds: imported.ms / 1000,
    importRate: n / (imported.ms / 1000),
    importPeakMb: imported.peakMb,
    databaseMb,
    miss,
    hit,
    soakPeakMb: Math.max(soakPeak, peakMb),
    soakEndMb,
    cacheBytesPerItem,
    cachedItems,
    missShare,
    notAnswered: others(a0, aMiss) + others(a1, a2),
  };
}

export async function scale(): Promise<void> {
  const started = Date.now();
  console.error(`scale benchmark: ${sizes.join(", ")} items; ${seconds} s per load, ${soakSeconds} s soak, ${connections} connections`);
  const rows: ScaleRow[] = [];
  for (const n of sizes) rows.push(await scaleCase(n));
  const when = new Date().toISOString();
  mkdirSync(join(root, "bench-results"), { recursive: true });
  const file = join(root, "bench-results", `scale-${when.replace(/[:.]/g, "-")}.json`);
  writeFileSync(file, JSON.stringify({ when, cores: availableParallelism(), node: process.version, seconds, soakSeconds, connections, rows }, null, 2));
  console.log(`\n${availableParallelism()} cores, Node ${process.version}; autocannon, ${connections} connections; ${seconds} s per load after 2 s warm-up; ${soakSeconds} s soak; default memory budget\n`);
  console.log("| items | import (records/s) | import peak RSS MB | database MB | random items req/s (CPU µs/call) | of them misses | hit req/s (CPU µs/call) | random/hit | soak peak RSS MB | RSS after soak MB | cache bytes per item | items the cache held |");
  console.log("|---|---|---|---|---|---|---|---|---|---|---|---|");
  for (const r of rows) {
    console.log(
      `| ${r.items} | ${r.importRate.toFixed(0)} (${r.importSeconds.toFixed(1)} s) | ${r.importPeakMb.toFixed(0)} | ${r.databaseMb.toFixed(0)} | ${r.miss.rps.toFixed(0)} (${r.miss.cpuUs.toFixed(0)}) | ${(100 * r.missShare).toFixed(0)}% | ${r.hit.rps.toFixed(0)} (${r.hit.cpuUs.toFixed(0)}) | ${(r.miss.rps / r.hit.rps).toFixed(2)}x | ${r.soakPeakMb.toFixed(0)} | ${r.soakEndMb.toFixed(0)} | ${(r.cacheBytesPerItem / 1024).toFixed(1)} KiB | ${r.cachedItems} |`,
    );
  }
  const errors = rows.reduce((e, r) => e + r.miss.errors + r.hit.errors, 0);
  const notAnswered = rows.reduce((n, r) => n + r.notAnswered, 0);
  console.log(`\nerrors: ${errors}; calls answered with another code than 0000: ${notAnswered}; written to ${file} (${((Date.now() - started) / 1000).toFixed(0)} s)`);
}

export function cleanupScale(): void {
  for (const c of children) c.kill("SIGKILL");
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
}
