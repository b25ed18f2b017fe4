// A `gateway serve` whose stdout cannot take its log lines goes on serving (src/transports/server/log-output.ts):
// a reader that stops reading, a reader that is gone, a full disk. Before, the first grew the process without
// bound (151 MB to 601 MB in 15 s) and held a SIGTERM, and the other two ended it at their next line.
import { spawn } from "node:child_process";
import { openSync, closeSync, existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { demo } from "./support/gateway-fixture.ts";
import { root } from "./support/cli.ts";
import { freePort, startServe, type ServeProcess } from "./support/gateway-process.ts";

const token = "log-output-admin-token-0123456789";
const dirs: string[] = [];
const started: ServeProcess[] = [];
afterAll(() => {
  for (const s of started) s.child.kill("SIGKILL");
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

async function serve(env: Record<string, string> = {}, options: { stdout?: number } = {}): Promise<ServeProcess> {
  const dir = mkdtempSync(join(tmpdir(), "gateway-log-output-"));
  dirs.push(dir);
  const s = await startServe({ GATEWAY_DATA_DIR: dir, GATEWAY_ADMIN_TOKEN: token, ...env }, { demo: true, ...options });
  started.push(s);
  return s;
}

/** An account of its own, through the AdminService, and a legacy call of the demo item with it. */
async function caller(base: string): Promise<() => Promise<string>> {
  const res = await fetch(`${base}/gateway.admin.v1.AdminService/CreateAccount`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${token}` },
    body: JSON.stringify({ name: "log-output", dailyMax: 1_000_000, concurrency: 100 }),
  });
  const { account, secret } = (await res.json()) as { account: { key: string }; secret: string };
  const url = `${base}/retail/item_get/?${new URLSearchParams({ key: account.key, secret, num_iid: demo.retailNumIid })}`;
  return async () => ((await (await fetch(url)).json()) as { error_code: string }).error_code;
}

/** `n` calls, 20 at a time: their codes, counted. */
async function calls(call: () => Promise<string>, n: number): Promise<Record<string, number>> {
  const codes: Record<string, number> = {};
  for (let i = 0; i < n; i += 20) {
    for (const code of await Promise.all(Array.from({ length: Math.min(20, n - i) }, call))) codes[code] = (codes[code] ?? 0) + 1;
  }
  return codes;
}

/** gateway_log_lines_dropped_total by reason, from /metrics (-1: not exported). */
async function dropped(base: string): Promise<{ backlog: number; write_error: number; reader_gone: number }> {
  const text = await (await fetch(`${base}/metrics`)).text();
  const counts = { backlog: -1, write_error: -1, reader_gone: -1 };
  for (const m of text.matchAll(/^gateway_log_lines_dropped_total\{reason="(\w+)"\} (\d+)$/gm)) counts[m[1] as keyof typeof counts] = Number(m[2]);
  return counts;
}

/** The processes `pid` started. */
function children(pid: number): number[] {
  const path = `/proc/${pid}/task/${pid}/children`;
  return existsSync(path) ? readFileSync(path, "utf8").trim().split(/\s+/).filter(Boolean).map(Number) : [];
}

function exited(s: ServeProcess): Promise<number | null> {
  return s.child.exitCode !== null ? Promise.resolve(s.child.exitCode) : new Promise((r) => s.child.once("exit", (code) => r(code)));
}

describe("a gateway whose stdout cannot take its log lines", () => {
  it("drops what a reader that stopped reading leaves waiting past GATEWAY_LOG_BACKLOG_KB, serves on, says so once it reads again, and stops when told", async () => {
    const s = await serve({ GATEWAY_LOG_BACKLOG_KB: "64" });
    const call = await caller(s.base);
    expect(await dropped(s.base)).toEqual({ backlog: 0, write_error: 0, reader_gone: 0 });
    // The test stops reading: the pipe fills, then the gateway's backlog.
    s.child.stdout!.pause();
    let served = 0;
    for (let round = 0; (await dropped(s.base)).backlog === 0; round++) {
      expect(round).toBeLessThan(100);
      expect(await calls(call, 100)).toEqual({ "0000": 100 });
      served += 100;
    }
    // Some of those calls' lines were dropped, not all: 64 KiB and the pipe's own took the rest.
    expect((await dropped(s.base)).backlog).toBeLessThan(served * 2);
    s.child.stdout!.resume();
    const said = /^\{.*"msg":"(\d+) log lines were dropped: the reader of stdout fell behind; calls were served meanwhile"\}$/m;
    for (let i = 0; !said.test(s.output()); i++) {
      expect(i).toBeLessThan(200);
      expect(await call()).toBe("0000");
      await new Promise((r) => setTimeout(r, 50));
    }
    const line = JSON.parse(said.exec(s.output())![0]) as { level: number; droppedLines: number; droppedBytes: number; reason: string; droppedSince: string };
    expect(line).toMatchObject({ level: 40, reason: "backlog" });
    expect(line.droppedLines).toBe((await dropped(s.base)).backlog);
    expect(line.droppedBytes).toBeGreaterThan(line.droppedLines * 100);
    // Every line is whole: nothing was cut in the middle.
    for (const l of s.output().split("\n").filter((l) => l.startsWith("{"))) expect(() => JSON.parse(l)).not.toThrow();

    // A stop while the reader is stuck again: it waits for the reader a moment, not for good.
    s.child.stdout!.pause();
    await calls(call, 400);
    const stopping = exited(s);
    s.child.kill("SIGTERM");
    expect(await stopping).toBe(0);
  }, 120_000);

  it("serves on when its reader is gone, counting every line after, and stops when told", async () => {
    const s = await serve();
    const call = await caller(s.base);
    s.child.stdout!.destroy();
    expect(await calls(call, 200)).toEqual({ "0000": 200 });
    const gone = await dropped(s.base);
    expect(gone.reader_gone).toBeGreaterThan(200);
    expect(s.child.exitCode).toBeNull();
    const stopping = exited(s);
    s.child.kill("SIGTERM");
    expect(await stopping).toBe(0);
  }, 60_000);

  it("serves on when its log file's disk is full (/dev/full), counting each line it could not write", async () => {
    const full = openSync("/dev/full", "w");
    let s: ServeProcess;
    try {
      s = await serve({}, { stdout: full });
    } finally {
      closeSync(full);
    }
    const call = await caller(s.base);
    const before = (await dropped(s.base)).write_error;
    expect(before).toBeGreaterThan(0); // its start's lines
    expect(await calls(call, 200)).toEqual({ "0000": 200 });
    // Two access lines a call (and one a scrape), each dropped.
    expect((await dropped(s.base)).write_error - before).toBeGreaterThanOrEqual(400);
    const stopping = exited(s);
    s.child.kill("SIGTERM");
    expect(await stopping).toBe(0);
  }, 60_000);

  it("serves on when its terminal stops taking output (Ctrl-S, an SSH session whose client sleeps): its lines wait, then drop", async () => {
    // A terminal of its own: util-linux's script runs the gateway on a pty and copies what it writes to a pipe the test
    // never reads, so once the pipe and the pty are full the terminal takes nothing more. Node writes a terminal
    // synchronously: before, the gateway stopped at its next line, and answered nothing, not even /healthz.
    const dir = mkdtempSync(join(tmpdir(), "gateway-log-output-"));
    dirs.push(dir);
    const port = await freePort();
    const base = `http://127.0.0.1:${port}`;
    const terminal = spawn("script", ["-q", "-e", "-c", `exec '${process.execPath}' '${root}/bin/gateway.js' serve --demo`, "/dev/null"], {
      env: { ...process.env, GATEWAY_PORT: String(port), GATEWAY_DATA_DIR: dir, GATEWAY_ADMIN_TOKEN: token, GATEWAY_LOG_BACKLOG_KB: "64" },
      stdio: ["pipe", "pipe", "pipe"],
      detached: true,
    });
    terminal.stdout!.pause();
    try {
      for (let i = 0; !(await fetch(`${base}/readyz`).then((r) => r.ok, () => false)); i++) {
        expect(i, "the gateway did not start on its terminal").toBeLessThan(600);
        await new Promise((r) => setTimeout(r, 50));
      }
      const call = await caller(base);
      // Each round's calls must be answered within 10 s: a stopped gateway fails here rather than hanging the test.
      const within = (ms: number) => <T>(p: Promise<T>) => Promise.race([p, new Promise<never>((_, reject) => setTimeout(() => reject(new Error(`no answer within ${ms} ms`)), ms))]);
      let served = 0;
      for (let round = 0; (await within(10_000)(dropped(base))).backlog === 0; round++) {
        expect(round).toBeLessThan(100);
        expect(await within(10_000)(calls(call, 100))).toEqual({ "0000": 100 });
        served += 100;
      }
      expect(served).toBeGreaterThan(0);
      expect(await within(10_000)(fetch(`${base}/healthz`).then((r) => r.status))).toBe(200);
      // A stop waits for the terminal a moment, not for good (script, never read, does not reap it: a zombie is gone).
      const [gateway] = children(terminal.pid!);
      process.kill(gateway!, "SIGTERM");
      const ended = () => !existsSync(`/proc/${gateway}`) || readFileSync(`/proc/${gateway}/stat`, "utf8").split(") ")[1]!.startsWith("Z");
      for (let i = 0; !ended(); i++) {
        expect(i, "the gateway did not stop on SIGTERM within 20 s").toBeLessThan(400);
        await new Promise((r) => setTimeout(r, 50));
      }
    } finally {
      // The gateway leads a session of its own, on the pty: killed by its pid, then script.
      for (const pid of children(terminal.pid!)) process.kill(pid, "SIGKILL");
      process.kill(-terminal.pid!, "SIGKILL");
    }
  }, 120_000);
});
