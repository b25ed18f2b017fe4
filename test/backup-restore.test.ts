import { spawn, type ChildProcess } from "node:child_process";
import { copyFileSync, existsSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { DatabaseSync } from "node:sqlite";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { migrations } from "../src/stores/embedded/sqlite-database.ts";
import { root, runCli } from "./support/cli.ts";
import { withoutSecrets } from "./support/gateway-process.ts";
import { demo, legacyGet } from "./support/gateway-fixture.ts";

// `gateway backup` and `gateway restore` (src/stores/embedded/backup.ts): a consistent copy of the embedded
// store taken while it serves, and the store replaced by one while it does not.

let dir: string;
beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), "gateway-backup-"));
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** `gateway serve --demo` on `dataDir`: its base URL once it listens. */
async function serve(dataDir: string): Promise<{ child: ChildProcess; base: string; stop(): Promise<number | null> }> {
  const child = spawn(process.execPath, [join(root, "bin", "gateway.js"), "serve", "--demo"], {
    env: { ...process.env, GATEWAY_DATA_DIR: dataDir, GATEWAY_PORT: "0", GATEWAY_LOG_LEVEL: "warn" },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let out = "";
  child.stdout!.on("data", (d: Buffer) => (out += d.toString()));
  child.stderr!.on("data", (d: Buffer) => (out += d.toString()));
  const exited = new Promise<number | null>((r) => child.on("exit", r));
  const until = Date.now() + 30_000;
  while (!out.includes("Demo account") && Date.now() < until) await new Promise((r) => setTimeout(r, 50));
  const base = /listening on (http:\/\/\S+) /.exec(out)?.[1];
  if (base === undefined) throw new Error(`the gateway did not start: ${withoutSecrets(out)}`);
  return {
    child,
    base,
    stop: () => {
      child.kill("SIGTERM");
      return exited;
    },
  };
}

/** An account's balance, what was added to it, and its charged calls, as one store file holds them. */
function books(file: string, key: string): { balance: number; added: number; charged: number; calls: number } {
  const db = new DatabaseSync(file, { readOnly: true });
  try {
    const one = (sql: string) => Number((db.prepare(sql).get(key) as { n: number | null }).n ?? 0);
    return {
      balance: one("SELECT micros AS n FROM balances WHERE account = ?"),
      added: one("SELECT sum(amount) AS n FROM balance_changes WHERE account = ?"),
      charged: one("SELECT sum(price) AS n FROM ledger WHERE account = ? AND charge = 'charged'"),
      calls: one("SELECT count(*) AS n FROM ledger WHERE account = ?"),
    };
  } finally {
    db.close();
  }
}

describe("gateway backup and restore, the embedded store", () => {
  it("backs a serving gateway up under charged load to one moment of its books, and a restore serves from that moment", async () => {
    const dataDir = join(dir, "serving");
    const env = { GATEWAY_DATA_DIR: dataDir };
    const made = await runCli(["accounts", "create", "--json", "--name", "payer", "--balance", "100", "--price", "retail/item_get=0.01"], env);
    expect(made.code).toBe(0);
    const { key, secret } = JSON.parse(made.stdout) as { key: string; secret: string };
    const file = join(dir, "serving-backup.db");

    let gw = await serve(dataDir);
    let calls = 0;
    let stop = false;
    const codes = new Set<string>();
    const load = Array.from({ length: 4 }, async () => {
      while (!stop) {
        codes.add(String((await legacyGet(gw.base, "/retail/item_get/", { key, secret, num_iid: demo.retailNumIid })).json.error_code));
        calls++;
      }
    });
    try {
      while (calls < 50) await new Promise((r) => setTimeout(r, 10));
      const backup = await runCli(["backup", file, "--json"], env);
      expect(backup.stderr).toBe("");
      expect(backup.code).toBe(0);
      const atBackup = calls;
      // The gateway went on serving: calls after the backup, as many again.
      while (calls < atBackup + 50) await new Promise((r) => setTimeout(r, 10));
      const told = JSON.parse(backup.stdout) as { to: string; schemaStep: number; accounts: number; ledgerRows: number; seconds: number };
      expect(told).toMatchObject({ to: file, schemaStep: migrations.length, accounts: 2 });
      expect(readdirSync(dir).filter((f) => f.includes(".partial-"))).toEqual([]);

      // One moment of the books: every charged call in the copy took its price from the balance in the copy, none more.
      const copy = books(file, key);
      expect(copy.added).toBe(100_000_000);
      expect(copy.balance).toBe(copy.added - copy.charged);
      expect(copy.charged).toBe(copy.calls * 10_000);
      expect(copy.calls).toBeGreaterThanOrEqual(50);

      // Restoring under a serving gateway is refused, naming it, and changes nothing.
      const refused = await runCli(["restore", file], env);
      expect(refused.code).toBe(2);
      expect(refused.stderr).toContain("is already served by process");
    } finally {
      stop = true;
      await Promise.all(load);
      expect(await gw.stop()).toBe(0);
    }
    expect([...codes]).toEqual(["0000"]);
    const live = books(join(dataDir, "gateway.db"), key);
    expect(live.calls).toBe(calls);
    const copy = books(file, key);
    expect(live.calls).toBeGreaterThan(copy.calls);

    // Stopped: the store goes back to the backup's moment; the one it replaced is kept whole beside it.
    const restored = await runCli(["restore", file, "--json"], env);
    expect(restored.stderr).toBe("");
    expect(restored.code).toBe(0);
    const { keptAs } = JSON.parse(restored.stdout) as { keptAs: string };
    expect(books(keptAs, key)).toEqual(live);
    expect(books(join(dataDir, "gateway.db"), key)).toEqual(copy);
    expect(existsSync(join(dataDir, "gateway.db-wal"))).toBe(false);

    // Served again from it: the team's key and secret work, and its balance goes on from the backup's.
    gw = await serve(dataDir);
    try {
      expect((await legacyGet(gw.base, "/retail/item_get/", { key, secret, num_iid: demo.retailNumIid })).json.error_code).toBe("0000");
    } finally {
      expect(await gw.stop()).toBe(0);
    }
    const after = books(join(dataDir, "gateway.db"), key);
    expect(after).toEqual({ balance: copy.balance - 10_000, added: copy.added, charged: copy.charged + 10_000, calls: copy.calls + 1 });
  });

  it("refuses, changing nothing: a backup over an existing file or of no store, a restore of what is not a store or of a newer gateway's, and both in shared mode", async () => {
    const dataDir = join(dir, "refusals");
    const env = { GATEWAY_DATA_DIR: dataDir };
    expect((await runCli(["backup", join(dir, "none.db")], env)).stderr).toMatch(/^nothing backed up: there is no store at /);
    expect((await runCli(["accounts", "create", "--name", "x"], env)).code).toBe(0);
    const file = join(dir, "refusals-backup.db");
    expect((await runCli(["backup", file], env)).code).toBe(0);
    const again = await runCli(["backup", file], env);
    expect(again.code).toBe(2);
    expect(again.stderr).toContain("exists; a backup never overwrites a file");

    const nowhere = await runCli(["backup", join(dir, "no-such-directory", "b.db")], env);
    expect(nowhere.code).toBe(2);
    expect(nowhere.stderr).toMatch(/^nothing backed up: the backup could not be written to .*no-such-directory\/b\.db \(unable to open database/);
    expect(existsSync(join(dir, "no-such-directory"))).toBe(false);

    const junk = join(dir, "junk.db");
    writeFileSync(junk, "not a database at all, ".repeat(200));
    const notAStore = await runCli(["restore", junk], env);
    expect(notAStore.code).toBe(2);
    expect(notAStore.stderr).toMatch(/^nothing restored: .*junk\.db is not a gateway store/);

    const newer = join(dir, "newer.db");
    copyFileSync(file, newer);
    const db = new DatabaseSync(newer);
    db.exec(`PRAGMA user_version = ${migrations.length + 1}`);
    db.close();
    const tooNew = await runCli(["restore", newer], env);
    expect(tooNew.code).toBe(2);
    expect(tooNew.stderr).toContain(`was written by a newer gateway (schema step ${migrations.length + 1}; this one knows ${migrations.length})`);
    expect(readdirSync(dataDir).filter((f) => f.includes("replaced") || f.includes("restoring"))).toEqual([]);

    const shared = { ...env, GATEWAY_DATABASE_URL: "postgres://postgres@127.0.0.1:5432/none", GATEWAY_REDIS_URL: "redis://127.0.0.1:6379" };
    for (const command of ["backup", "restore"]) {
      const refused = await runCli([command, file], shared);
      expect(refused.code).toBe(2);
      expect(refused.stderr).toContain("back it up with PostgreSQL's own tools (pg_dump");
    }
  });
});
