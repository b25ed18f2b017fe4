// Issue 13 (in part): two gateway processes on one embedded store each admitted an account's
// whole daily maximum. The second one is now refused at start, before it touches the store.
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { demo } from "./support/gateway-fixture.ts";
import { root, runCli } from "./support/cli.ts";
import { withoutSecrets } from "./support/gateway-process.ts";

const dir = mkdtempSync(join(tmpdir(), "gateway-lock-"));
const children: ChildProcess[] = [];
afterAll(() => {
  for (const c of children) c.kill("SIGKILL");
  rmSync(dir, { recursive: true, force: true });
});

function serve(): { child: ChildProcess; output: () => string; exit: Promise<number | null> } {
  let output = "";
  const child = spawn(process.execPath, [join(root, "bin", "gateway.js"), "serve", "--demo"], {
    cwd: root,
    env: { ...process.env, GATEWAY_DATA_DIR: dir, GATEWAY_PORT: "0", GATEWAY_LOG_LEVEL: "warn" },
    stdio: ["ignore", "pipe", "pipe"],
  });
  children.push(child);
  child.stdout!.on("data", (d: Buffer) => (output += d.toString()));
  child.stderr!.on("data", (d: Buffer) => (output += d.toString()));
  return { child, output: () => output, exit: new Promise((r) => child.on("exit", r)) };
}

async function banner(s: ReturnType<typeof serve>): Promise<{ base: string; key: string; secret: string }> {
  const until = Date.now() + 20_000;
  while (!/Admin API/.test(s.output())) {
    if (Date.now() > until) throw new Error(`no banner:\n${withoutSecrets(s.output())}`);
    await new Promise((r) => setTimeout(r, 50));
  }
  const [, key, secret] = /Demo account\s+key: (\S+)\s+secret: (\S+)/.exec(s.output())!;
  return { base: /listening on (http:\/\/\S+) /.exec(s.output())![1]!, key: key!, secret: secret! };
}

describe("one gateway process per data directory", () => {
  it("refuses a second serve on a live store, leaves the first untouched, and frees the store when the first is killed", async () => {
    const first = serve();
    const a = await banner(first);
    const call = async (b: { base: string; key: string; secret: string }) =>
      ((await (await fetch(`${b.base}/retail/item_get/?key=${b.key}&secret=${b.secret}&num_iid=${demo.retailNumIid}`)).json()) as { error_code: string }).error_code;
    expect(await call(a)).toBe("0000");

    const second = serve();
    expect(await second.exit).toBe(2);
    expect(second.output()).toContain(`is already served by process ${first.child.pid}`);
    expect(second.output()).toContain("One data directory serves one gateway process");
    expect(second.output()).not.toContain("Demo account");
    // It refused before touching the store: the first one's demo secret still works.
    expect(await call(a)).toBe("0000");

    // The operator's CLI is not a second gateway: it works beside the server.
    const listed = await runCli(["accounts", "list", "--json"], { GATEWAY_DATA_DIR: dir });
    expect(listed.code).toBe(0);

    // A SIGKILLed holder leaves no lock behind.
    first.child.kill("SIGKILL");
    await first.exit;
    const third = serve();
    const c = await banner(third);
    expect(await call(c)).toBe("0000");
    third.child.kill("SIGTERM");
    expect(await third.exit).toBe(0);
  });
});
