// A gateway whose clock steps back (an NTP correction, a VM resumed from a snapshot), as real processes under
// libfaketime: a rated account is served at its rate, not refused for the step, and a shared-mode replica sees an
// account stopped elsewhere at once, not after the step. The rules themselves are tested at handler level on
// injected clocks (rate-limit.test.ts, postgres-stores.test.ts, postgres-meter.test.ts).
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { runCli } from "./support/cli.ts";
import { faketime } from "./support/faketime.ts";
import { demo, legacyGet } from "./support/gateway-fixture.ts";
import { startServe, withoutSecrets, type ServeProcess } from "./support/gateway-process.ts";
import { freshDatabase } from "./support/postgres.ts";

let dir: string;
beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), "gateway-clock-"));
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** The demo account the banner printed. */
function demoAccount(gw: ServeProcess): { key: string; secret: string } {
  const m = /key: (\S+)\s+secret: (\S+)/.exec(gw.output());
  if (m === null) throw new Error(`no demo account in:\n${withoutSecrets(gw.output())}`);
  return { key: m[1]!, secret: m[2]! };
}

async function call(gw: ServeProcess, a: { key: string; secret: string }): Promise<{ code: string; reason: string }> {
  const r = await legacyGet(gw.base, "/retail/item_get/", { key: a.key, secret: a.secret, num_iid: demo.retailNumIid });
  return { code: String(r.json.error_code), reason: String(r.json.reason ?? "") };
}

async function stopped(gw: ServeProcess): Promise<void> {
  gw.child.kill("SIGTERM");
  if (gw.child.exitCode === null) await new Promise((r) => gw.child.once("exit", r));
}

describe("a gateway whose clock steps back an hour", () => {
  it("serves a rated account at its rate rather than refusing it for the hour (embedded store)", async () => {
    const clock = faketime(join(dir, "embedded-offset"));
    const env = { GATEWAY_DATA_DIR: join(dir, "embedded") };
    const gw = await startServe({ ...env, ...clock.env }, { demo: true });
    try {
      const a = demoAccount(gw);
      expect((await runCli(["accounts", "set-plan", a.key, "--rate", "2/s", "--burst", "3"], env)).code).toBe(0);
      // The plan reaches the serving process within its change watch's interval.
      const codes: string[] = [];
      for (let i = 0; i < 40 && !codes.includes("4008"); i++) codes.push((await call(gw, a)).code);
      expect(codes.at(-1)).toBe("4008");
      clock.set(-3600);
      // Before: "the next call is admitted in 3599… ms", for the hour. Now: one call at once, the next an interval on.
      expect(await call(gw, a)).toEqual({ code: "0000", reason: "" });
      const next = await call(gw, a);
      expect(next.code).toBe("4008");
      const waitMs = Number(/admitted in (\d+) ms$/.exec(next.reason)?.[1]);
      expect(waitMs).toBeLessThanOrEqual(500);
      await new Promise((r) => setTimeout(r, waitMs + 50));
      expect((await call(gw, a)).code).toBe("0000");
    } finally {
      await stopped(gw);
    }
  });

  it("sees an account stopped from the CLI at once, not after the hour (a shared-mode replica)", async () => {
    const db = await freshDatabase("clock_steps");
    const clock = faketime(join(dir, "shared-offset"));
    const env = { GATEWAY_DATABASE_URL: db.url, GATEWAY_REDIS_URL: "redis://127.0.0.1:6379/8" };
    const gw = await startServe({ ...env, ...clock.env }, { demo: true });
    try {
      const a = demoAccount(gw);
      expect((await call(gw, a)).code).toBe("0000");
      clock.set(-3600);
      expect((await runCli(["accounts", "stop", a.key], env)).code).toBe(0);
      // Before: 0000 for the hour (what the replica had read counted as fresh). Now: 4007 within a second or so.
      let answer = await call(gw, a);
      for (const started = Date.now(); answer.code === "0000" && Date.now() - started < 5000; ) {
        await new Promise((r) => setTimeout(r, 100));
        answer = await call(gw, a);
      }
      expect(answer).toEqual({ code: "4007", reason: "this account is stopped" });
      // Its clock, an hour behind PostgreSQL's, is in its metrics.
      const offset = Number(/^gateway_clock_offset_seconds (\S+)$/m.exec(await (await fetch(`${gw.base}/metrics`)).text())?.[1]);
      expect(offset).toBeGreaterThan(-3610);
      expect(offset).toBeLessThan(-3590);
    } finally {
      await stopped(gw);
      await db.drop();
    }
  });
});
