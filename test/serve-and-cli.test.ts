import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { operations } from "../src/operations/index.ts";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { root, runCli } from "./support/cli.ts";
import { withoutSecrets } from "./support/gateway-process.ts";

let dir: string;
let server: ChildProcess;
let output = "";
let base: string;
let demoKey: string;
let demoSecret: string;
let env: Record<string, string>;

async function waitFor(predicate: () => boolean, what: string, ms = 20_000): Promise<void> {
  const until = Date.now() + ms;
  while (!predicate()) {
    if (Date.now() > until) throw new Error(`timed out waiting for ${what}; output so far:\n${withoutSecrets(output)}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

async function code(url: string): Promise<string> {
  return ((await (await fetch(url)).json()) as { error_code: string }).error_code;
}

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), "gateway-serve-"));
  env = { GATEWAY_DATA_DIR: dir, GATEWAY_PORT: "0", GATEWAY_LOG_LEVEL: "info" };
  // What `npm start` runs, on a free port.
  server = spawn(process.execPath, [join(root, "bin", "gateway.js"), "serve", "--demo"], {
    cwd: root,
    env: { ...process.env, ...env },
    stdio: ["ignore", "pipe", "pipe"],
  });
  server.stdout!.on("data", (d: Buffer) => (output += d.toString()));
  server.stderr!.on("data", (d: Buffer) => (output += d.toString()));
  await waitFor(() => /gRPC \(HTTP\/2/.test(output) && output.includes("ItemSearchPeerbuy"), "the banner");
  base = /listening on (http:\/\/127\.0\.0\.1:\d+)/.exec(output)![1]!;
  const demoAccount = /Demo account\s+key: (\S+)\s+secret: (\S+)/.exec(output)!;
  demoKey = demoAccount[1]!;
  demoSecret = demoAccount[2]!;
});

afterAll(() => {
  server.kill("SIGKILL");
  rmSync(dir, { recursive: true, force: true });
});

describe("npm start", () => {
  it("prints a curl command for every operation, each working as printed", async () => {
    const urls = [...output.matchAll(/curl '(http[^']+)'/g)].map((m) => m[1]!);
    expect(urls.map((u) => new URL(u).pathname)).toEqual(operations.map((op) => op.path));
    for (const url of urls) {
      const json = (await (await fetch(url)).json()) as { error_code: string; item: unknown };
      expect(json.error_code).toBe("0000");
      expect(json.item).toBeTruthy();
    }
  });

  it("prints the AccountService's read of the demo account, working as printed", async () => {
    const printed = /curl -H 'content-type: application\/json' -H '(x-api-key): (\S+)' -H '(x-api-secret): (\S+)' \\\n\s+-d '(\{\})' (http\S+\/gateway\.account\.v1\.AccountService\/GetMyAccount)/.exec(output);
    expect(printed, output).not.toBeNull();
    const [, keyHeader, key, secretHeader, secret, body, url] = printed!;
    const res = await fetch(url!, { method: "POST", headers: { "content-type": "application/json", [keyHeader!]: key!, [secretHeader!]: secret! }, body: body! });
    const me = (await res.json()) as { key: string; name: string; status: string; dailyMax: string };
    expect([res.status, me.key, me.name, me.status, me.dailyMax]).toEqual([200, demoKey, "demo", "ACCOUNT_STATUS_ACTIVE", "10000"]);
  });

  it("never writes a secret or a key into its logs", async () => {
    await fetch(`${base}/retail/item_get/?key=${demoKey}&secret=${demoSecret}&num_iid=1`);
    await waitFor(() => output.includes("request completed"), "a request log line");
    const logLines = output.split("\n").filter((l) => l.startsWith("{"));
    expect(logLines.length).toBeGreaterThan(0);
    for (const line of logLines) {
      expect(line).not.toContain(demoSecret);
      expect(line).not.toContain(demoKey);
    }
    expect(logLines.join("\n")).toContain("secret=[redacted]");
  });
});

describe("npx gateway while the server runs", () => {
  it("creates an account whose key works at once, and switches it within a second", async () => {
    const created = await runCli(["accounts", "create", "--json"], env, { npx: true });
    expect(created.code).toBe(0);
    const account = JSON.parse(created.stdout) as { key: string; secret: string; operations: Record<string, string>; max: number };
    expect(account.key).toMatch(/^[a-z0-9]{16}$/);
    expect(account.secret).toHaveLength(40);
    expect(account.operations).toEqual(Object.fromEntries(operations.map((op) => [op.id, "enabled"])));
    const url = `${base}/retail/item_get/?key=${account.key}&secret=${account.secret}&num_iid=123`;
    expect(await code(url)).toBe("2000");

    const steps: [string[], string][] = [
      [["accounts", "stop", account.key], "4007"],
      [["accounts", "resume", account.key], "2000"],
      [["accounts", "disable-api", account.key, "retail/item_get"], "4006"],
      [["accounts", "remove-api", account.key, "retail/item_get"], "4012"],
      [["accounts", "enable-api", account.key, "retail/item_get"], "2000"],
    ];
    for (const [args, expected] of steps) {
      const r = await runCli(args, env);
      expect(r.code, r.stderr).toBe(0);
      const until = Date.now() + 1000;
      let seen = await code(url);
      while (seen !== expected && Date.now() < until) seen = await code(url);
      expect(seen, args.join(" ")).toBe(expected);
    }
  });

  it("sets, changes and removes an account's rate limit, which the running gateway applies within a second", async () => {
    const created = await runCli(["accounts", "create", "--json", "--rate", "1/min", "--burst", "2"], env);
    expect(created.code, created.stderr).toBe(0);
    const account = JSON.parse(created.stdout) as { key: string; secret: string; rate: string };
    expect(account.rate).toBe("1/min, burst 2");
    const url = `${base}/retail/item_get/?key=${account.key}&secret=${account.secret}&num_iid=123`;
    const answer = async () => (await (await fetch(url)).json()) as { error_code: string; reason: string };
    expect([(await answer()).error_code, (await answer()).error_code]).toEqual(["2000", "2000"]);
    const third = await answer();
    expect(third.error_code).toBe("4008");
    expect(third.reason).toMatch(/^this account's rate limit of 1\/min, burst 2 is reached; the next call is admitted in \d+ ms$/);
    for (const [args, message] of [
      [["accounts", "set-plan", account.key, "--rate", "10/day"], "--rate: a rate is calls per s, min or h, as 10/s or 600/min (or none), not 10/day"],
      [["accounts", "set-plan", account.key, "--rate", "5/s", "--burst", "0"], "--rate: a burst must be a whole number from 1 to 1000000000"],
      [["accounts", "create", "--burst", "5"], "--burst needs a --rate"],
    ] as const) {
      const r = await runCli([...args], env);
      expect([r.code, r.stderr.trim()]).toEqual([2, message]);
    }
    const removed = await runCli(["accounts", "set-plan", account.key, "--rate", "none"], env);
    expect(removed.code, removed.stderr).toBe(0);
    expect(removed.stdout).toContain('"rate":"none"');
    const until = Date.now() + 1000;
    let seen = (await answer()).error_code;
    while (seen !== "2000" && Date.now() < until) seen = (await answer()).error_code;
    expect(seen).toBe("2000");
    const noRate = await runCli(["accounts", "set-plan", account.key, "--burst", "3"], env);
    expect([noRate.code, noRate.stderr.trim()]).toEqual([2, "a burst needs a rate: this account has none"]);
    const history = JSON.parse((await runCli(["accounts", "history", account.key, "--json"], env)).stdout) as { events: { kind: string; changes: { field: string; before: string; after: string }[] }[] };
    expect(history.events.find((e) => e.kind === "created")!.changes).toContainEqual({ field: "rate", before: "", after: "1/min, burst 2" });
    expect(history.events.filter((e) => e.kind === "plan").map((e) => e.changes)).toEqual([[{ field: "rate", before: "1/min, burst 2", after: "" }]]);
  });

  it("lists accounts without their secrets", async () => {
    const r = await runCli(["accounts", "list", "--json"], env);
    const list = JSON.parse(r.stdout) as Record<string, unknown>[];
    expect(list.some((a) => a.key === demoKey && a.name === "demo")).toBe(true);
    expect(r.stdout).not.toContain(demoSecret);
    for (const a of list) expect(Object.keys(a)).not.toContain("secret");
    // Narrowed as ListAccounts narrows: part of a name or key in any case, a status, the first N.
    for (let i = 0; i < 3; i++) await runCli(["accounts", "create", "--name", `Listed-${i}`], env);
    const found = await runCli(["accounts", "list", "--json", "--query", "LISTED", "--limit", "2"], env);
    expect((JSON.parse(found.stdout) as { name: string }[]).map((a) => a.name)).toEqual(["Listed-0", "Listed-1"]);
    expect(found.stderr).toBe("2 of 3 accounts shown (--limit 2)\n");
    expect(JSON.parse((await runCli(["accounts", "list", "--json", "--query", "listed", "--status", "stopped"], env)).stdout)).toEqual([]);
    const refused = await runCli(["accounts", "list", "--status", "paused"], env);
    expect([refused.code, refused.stderr.trim()]).toEqual([2, "--status must be active or stopped"]);
  });

  it("refuses bad input with a message and exit status 2", async () => {
    const r = await runCli(["accounts", "create", "--expires", "next-week"], env);
    expect(r.code).toBe(2);
    expect(r.stderr).toContain("YYYY-MM-DD");
    const named = await runCli(["accounts", "create", "--name", "\u001b]0;pwned\u0007shop"], env);
    expect([named.code, named.stderr.trim()]).toEqual([2, 'an account\'s name cannot hold control characters, line separators or direction overrides: "\\u001b]0;pwned\\u0007shop"']);
    // A usage day out of the calendar printed an empty report with exit 0, as if no call had been made.
    for (const [flag, day] of [["--day", "2026-02-30"], ["--from", "2026-13-01"], ["--to", "tomorrow"]]) {
      const u = await runCli(["usage", flag!, day!], env);
      expect([u.code, u.stderr.trim()]).toEqual([2, `${flag}: a day is YYYY-MM-DD, not "${day}"`]);
    }
    const s = await runCli(["accounts", "stop", "nosuchkey"], env);
    expect(s.code).toBe(2);
    const bad = await runCli(["accounts", "list"], { ...env, GATEWAY_PORT: "99999", GATEWAY_TIME_ZONE: "Mars/Olympus" });
    expect(bad.code).toBe(2);
    expect(bad.stderr).toContain("GATEWAY_PORT");
    expect(bad.stderr).toContain("GATEWAY_TIME_ZONE");
  });
});

describe("a start that cannot be made", () => {
  // One line on stderr that says why and what to set, never a stack; 2 where a setting must change, 1 where waiting may do.
  const oneLine = (r: { code: number | null; stderr: string; stdout: string }) => {
    expect(r.stderr.trim().split("\n")).toHaveLength(1);
    expect(r.stderr).not.toMatch(/^\s+at /m);
    return [r.code, r.stderr.trim()];
  };

  it("says so in one line for a port another process holds, an address not on this machine, and a data directory it cannot make", async () => {
    const own = mkdtempSync(join(tmpdir(), "gateway-start-"));
    try {
      const port = new URL(base).port;
      expect(oneLine(await runCli(["serve"], { ...env, GATEWAY_DATA_DIR: own, GATEWAY_PORT: port }))).toEqual([
        1,
        `cannot listen on 127.0.0.1:${port}: another process listens there (EADDRINUSE); stop it, or set GATEWAY_PORT to another port`,
      ]);
      // TEST-NET-1 (RFC 5737): no machine has it.
      expect(oneLine(await runCli(["serve"], { ...env, GATEWAY_DATA_DIR: own, GATEWAY_HOST: "192.0.2.1" }))).toEqual([
        2,
        "cannot listen on 192.0.2.1:0: no interface of this machine has that address (EADDRNOTAVAIL); set GATEWAY_HOST to one of its addresses, or 0.0.0.0",
      ]);
      // A data directory under a file: serve and every command alike.
      const file = join(own, "a-file");
      writeFileSync(file, "");
      for (const args of [["serve"], ["accounts", "list"]]) {
        const [code, line] = oneLine(await runCli(args, { ...env, GATEWAY_DATA_DIR: join(file, "data") }));
        expect(code).toBe(2);
        expect(line).toMatch(/^the data directory \S+\/a-file\/data \(GATEWAY_DATA_DIR\) cannot be used: it, or a part of its path, is a file, not a directory \(ENOTDIR\)\. /);
      }
      // `gateway check` says what serve would meet, and that it would not start.
      const checked = await runCli(["check"], { ...env, GATEWAY_DATA_DIR: join(file, "data"), GATEWAY_PORT: port });
      expect(checked.code).toBe(1);
      expect(checked.stdout).toMatch(/^fail {2}data directory \S+\/a-file, where \S+\/a-file\/data would be made, is a file, not a directory: serve would not start$/m);
      expect(checked.stdout).toMatch(/^warn {2}listen {9}cannot listen on 127\.0\.0\.1:\d+: another process listens there \(EADDRINUSE\)/m);
      const unbound = await runCli(["check"], { ...env, GATEWAY_DATA_DIR: own, GATEWAY_HOST: "192.0.2.1" });
      expect(unbound.stdout).toMatch(/^fail {2}listen {9}cannot listen on 192\.0\.2\.1:0: no interface of this machine has that address/m);
    } finally {
      rmSync(own, { recursive: true, force: true });
    }
  });
});

describe("stopping", () => {
  it("exits cleanly on SIGTERM", async () => {
    const exited = new Promise<number | null>((resolve) => server.once("exit", (c) => resolve(c)));
    server.kill("SIGTERM");
    expect(await exited).toBe(0);
    const lines = output.split("\n").filter((l) => l.startsWith("{")).map((l) => JSON.parse(l) as { msg: string; signal?: string });
    expect(lines.find((l) => l.signal === "SIGTERM")?.msg).toMatch(/^stopping: not ready from now on/);
    expect(lines.at(-1)?.msg).toBe("stopped");
  });
});
