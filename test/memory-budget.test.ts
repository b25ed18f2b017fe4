// The memory budget holds: a real `gateway serve` with GATEWAY_MEMORY_MB
// runs with the V8 heap limits it implies (and pretenuring off), and under
// random cache misses over a catalogue several times larger than its cache,
// its RSS stays within the budget plus the documented fixed overhead. (A short soak for CI; the
// 60 s soak and the large catalogues are the benchmark's: npm run bench -- --scale.)
import autocannon from "autocannon";
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it, vi } from "vitest";
import { loadConfig } from "../src/config.ts";
import { debugSignalFlag, fixedOverheadMb, hasHeapFlags, hasPretenuringFlag, heapFlags, mallocArenaMax, memoryMbOf, memoryPlan, pretenuringFlag, servingEnv, servingFlags } from "../src/memory-budget.ts";
import { distinctItems } from "./support/catalogue.ts";
import { root, runCli } from "./support/cli.ts";

const budgetMb = 160;
const items = 4000;
const dir = mkdtempSync(join(tmpdir(), "gateway-memory-"));
let server: ChildProcess | undefined;
afterAll(() => {
  server?.kill("SIGKILL");
  rmSync(dir, { recursive: true, force: true });
});

/** The commands of the processes whose parent is `pid`. */
const childrenOf = (pid: number): string[] =>
  readdirSync("/proc")
    .filter((d) => /^\d+$/.test(d))
    .flatMap((d) => {
      try {
        // The state and the parent are the fields after the command, which is in parentheses and may hold spaces.
        const stat = readFileSync(`/proc/${d}/stat`, "utf8");
        const [state, parent] = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
        // A child that has exited and is not yet reaped (state Z) has an empty command line: say so.
        return Number(parent) === pid ? [`${d} ${state} ${readFileSync(`/proc/${d}/cmdline`, "utf8").replaceAll("\0", " ").trim()}`] : [];
      } catch {
        return []; // gone meanwhile
      }
    });
const rssKb = (pid: number, field: "VmRSS" | "VmHWM") => Number(new RegExp(`${field}:\\s+(\\d+) kB`).exec(readFileSync(`/proc/${pid}/status`, "utf8"))![1]);

describe("how the budget divides, and where it is read", () => {
  it("gives V8 three power-of-two semi-spaces and the rest, the cache a quarter, and HTTP/2 answers waiting for their clients an eighth", () => {
    expect(memoryPlan(512)).toEqual({ memoryMb: 512, semiSpaceMb: 16, oldSpaceMb: 464, cacheMaxBytes: 128 * 1_048_576, waitingAnswerBytes: 64 * 1_048_576 });
    expect(memoryPlan(160)).toEqual({ memoryMb: 160, semiSpaceMb: 8, oldSpaceMb: 136, cacheMaxBytes: 40 * 1_048_576, waitingAnswerBytes: 20 * 1_048_576 });
    expect(memoryPlan(300).semiSpaceMb).toBe(8);
    expect(memoryPlan(4096).semiSpaceMb).toBe(16);
    expect(heapFlags(memoryPlan(512))).toEqual(["--max-old-space-size=464", "--max-semi-space-size=16"]);
  });

  it("reads the budget as the configuration does: the environment, then the GATEWAY_CONFIG file, then the default", () => {
    const file = join(dir, "config.json");
    writeFileSync(file, JSON.stringify({ memoryMb: 300 }));
    expect(memoryMbOf({})).toBe(512);
    expect(memoryMbOf({ GATEWAY_CONFIG: file })).toBe(300);
    expect(memoryMbOf({ GATEWAY_CONFIG: file, GATEWAY_MEMORY_MB: "200" })).toBe(200);
    expect(loadConfig({ GATEWAY_CONFIG: file }).memoryMb).toBe(300);
    for (const bad of ["abc", "64", "1.5"]) {
      expect(memoryMbOf({ GATEWAY_MEMORY_MB: bad })).toBeUndefined(); // left to the configuration, which refuses it
      expect(() => loadConfig({ GATEWAY_MEMORY_MB: bad })).toThrow(/GATEWAY_MEMORY_MB/);
    }
    expect(memoryMbOf({ GATEWAY_CONFIG: join(dir, "missing.json") })).toBeUndefined();
    expect(() => loadConfig({ GATEWAY_MEMORY_MB: "256", GATEWAY_CACHE_MAX_BYTES: String(200 * 1_048_576) })).toThrow(/more than half of the memory budget/);
  });

  it("leaves heap limits given on the command line or in NODE_OPTIONS alone", () => {
    expect(hasHeapFlags([], undefined)).toBe(false);
    expect(hasHeapFlags(["--max-old-space-size=900"], undefined)).toBe(true);
    expect(hasHeapFlags([], "--inspect --max_semi_space_size=4")).toBe(true);
    expect(hasHeapFlags(["--cpu-prof"], "--enable-source-maps")).toBe(false);
  });

  it("turns V8's allocation-site pretenuring off, unless the operator set it either way, and the debugger's signal off", () => {
    const plan = memoryPlan(512);
    expect(servingFlags(plan, [], undefined)).toEqual([...heapFlags(plan), "--no-allocation-site-pretenuring", "--disable-sigusr1"]);
    expect(pretenuringFlag).toBe("--no-allocation-site-pretenuring");
    expect(debugSignalFlag).toBe("--disable-sigusr1");
    // Each is left out on its own when the process has its own.
    expect(servingFlags(plan, ["--max-old-space-size=900"], undefined)).toEqual([pretenuringFlag, debugSignalFlag]);
    expect(servingFlags(plan, ["--allocation-site-pretenuring"], undefined)).toEqual([...heapFlags(plan), debugSignalFlag]);
    expect(servingFlags(plan, [], "--max_semi_space_size=4 --no_allocation_site_pretenuring")).toEqual([debugSignalFlag]);
    expect(servingFlags(plan, ["--disable-sigusr1"], "--max_semi_space_size=4 --no_allocation_site_pretenuring")).toEqual([]);
    // Once re-executed with them, nothing more is added (bin/gateway.js then runs on).
    expect(servingFlags(plan, servingFlags(plan, [], undefined), undefined)).toEqual([]);
    expect(hasPretenuringFlag(["--cpu-prof"], "--allocation-site-pretenuring-x")).toBe(false);
  });

  it("caps glibc's malloc arenas unless the operator chose a number", () => {
    expect(servingEnv({ PATH: "/bin" })).toEqual({ PATH: "/bin", MALLOC_ARENA_MAX: mallocArenaMax });
    expect(servingEnv({ MALLOC_ARENA_MAX: "" }).MALLOC_ARENA_MAX).toBe(mallocArenaMax);
    const own = { MALLOC_ARENA_MAX: "8" };
    expect(servingEnv(own)).toBe(own);
  });
});

describe("the memory budget", () => {
  it(`keeps a serving gateway within ${budgetMb} MiB plus the fixed overhead under random misses over ${items} items`, async () => {
    // The console on, as in the demo: its build must leave nothing running beside the gateway.
    const env = { GATEWAY_DATA_DIR: dir, GATEWAY_PORT: "0", GATEWAY_LOG_LEVEL: "warn", GATEWAY_MEMORY_MB: String(budgetMb), GATEWAY_CONSOLE: "on" };
    // The demo's detail records under new ids: a catalogue of `items` distinct items, several times the cache.
    writeFileSync(join(dir, "catalogue.ndjson"), `${distinctItems(items, 800_000_000_000).map((r) => JSON.stringify(r)).join("\n")}\n`);
    expect((await runCli(["import", join(dir, "catalogue.ndjson")], env)).code).toBe(0);
    const account = JSON.parse((await runCli(["accounts", "create", "--json", "--max", "100000000", "--concurrency", "10000"], env)).stdout) as { key: string; secret: string };

    server = spawn(process.execPath, [join(root, "bin/gateway.js"), "serve"], { cwd: root, env: { ...process.env, ...env }, stdio: ["ignore", "pipe", "pipe"] });
    let out = "";
    const base = await new Promise<string>((resolve, reject) => {
      const read = (d: Buffer) => {
        out += d.toString();
        const m = /"url":"(http:\/\/127\.0\.0\.1:\d+)"/.exec(out);
        if (m) resolve(m[1]!);
      };
      server!.stdout!.on("data", read);
      server!.stderr!.on("data", read);
      server!.once("exit", (code) => reject(new Error(`serve exited ${code}: ${out}`)));
    });
    // The budget reached V8: the listening line says the heap limit it runs with.
    const listening = JSON.parse(out.split("\n").find((l) => l.includes('"memory"'))!) as { memory: { memoryMb: number; heapLimitMb: number; cacheMaxBytes: number } };
    const plan = memoryPlan(budgetMb);
    expect(listening.memory).toEqual({ memoryMb: budgetMb, heapLimitMb: plan.oldSpaceMb + 3 * plan.semiSpaceMb, cacheMaxBytes: plan.cacheMaxBytes });

    const pid = server.pid!;
    // The arena cap reached the process glibc started (the same pid, re-executed).
    expect(readFileSync(`/proc/${pid}/environ`, "utf8").split("\0")).toContain(`MALLOC_ARENA_MAX=${mallocArenaMax}`);
    // So did the flags: the heap limits, pretenuring off, and no debugger on SIGUSR1.
    expect(readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0")).toEqual(expect.arrayContaining([...heapFlags(plan), pretenuringFlag, debugSignalFlag]));
    // A SIGUSR1 (nginx's "reopen the logs") opens no debugger on 127.0.0.1:9229 and ends nothing: the load below is served.
    process.kill(pid, "SIGUSR1");
    await new Promise((r) => setTimeout(r, 500));
    expect(out).not.toContain("Debugger listening");
    expect(server.exitCode).toBeNull();
    // Nothing it started lives on beside it: esbuild's service, which built the console, is stopped.
    // Its stop closes the service's input and does not wait for the exit, so the service may still be
    // ending, or ended and not yet reaped, when the gateway says it listens: give it a few seconds.
    await vi.waitFor(() => expect(childrenOf(pid)).toEqual([]), { timeout: 10_000, interval: 50 });
    let peakKb = 0;
    const sampler = setInterval(() => (peakKb = Math.max(peakKb, rssKb(pid, "VmRSS"))), 100);
    let codes = new Map<string, number>();
    const result = await new Promise<autocannon.Result>((resolve, reject) =>
      autocannon(
        {
          url: base,
          connections: 32,
          duration: 12,
          requests: [
            {
              setupRequest: (req) => ({ ...req, path: `/retail/item_get/?${new URLSearchParams({ key: account.key, secret: account.secret, num_iid: String(800_000_000_000 + Math.floor(Math.random() * items)) })}` }),
              onResponse: (_status, body) => {
                const code = /"error_code":"(\d{4})"/.exec(body)?.[1] ?? "none";
                codes.set(code, (codes.get(code) ?? 0) + 1);
              },
            },
          ],
        },
        (e, r) => (e ? reject(e) : resolve(r)),
      ),
    );
    clearInterval(sampler);
    const metrics = await (await fetch(`${base}/metrics`)).text();
    const cacheBytes = Number(/^gateway_cache_bytes (\d+)/m.exec(metrics)![1]);
    const hwmMb = rssKb(pid, "VmHWM") / 1024;
    console.log(
      `memory budget ${budgetMb} MiB: ${result.requests.total} calls (${Math.round(result.requests.average)}/s) over ${items} items; peak RSS ${hwmMb.toFixed(0)} MiB (limit ${budgetMb + fixedOverheadMb}); cache ${(cacheBytes / 1_048_576).toFixed(1)} of ${(plan.cacheMaxBytes / 1_048_576).toFixed(0)} MiB; codes ${JSON.stringify(Object.fromEntries(codes))}`,
    );
    expect([...codes.keys()]).toEqual(["0000"]);
    expect(result.requests.total).toBeGreaterThan(items); // the cache filled and turned over
    expect(cacheBytes).toBeLessThanOrEqual(plan.cacheMaxBytes);
    expect(cacheBytes).toBeGreaterThan(plan.cacheMaxBytes / 2);
    expect(Math.max(hwmMb, peakKb / 1024)).toBeLessThanOrEqual(budgetMb + fixedOverheadMb);
  }, 90_000);
});
