import { execFile, spawn, type ChildProcess } from "node:child_process";
import { X509Certificate } from "node:crypto";
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, utimesSync, writeFileSync } from "node:fs";
import https from "node:https";
import { tmpdir } from "node:os";
import { join } from "node:path";
import tls from "node:tls";
import { promisify } from "node:util";
import { DatabaseSync } from "node:sqlite";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { defaultConfig } from "../src/config.ts";
import { defaultAppSettings } from "../src/transports/server/app.ts";
import { makeCertificate } from "./support/certificates.ts";
import { root, runCli } from "./support/cli.ts";
import { demo } from "./support/gateway-fixture.ts";

// deploy/systemd: the units are what systemd-analyze accepts, and their commands, run as they are written
// (paths moved into a temporary directory), start, reload, stop and back up a real gateway.

const units = join(root, "deploy", "systemd");
const run = promisify(execFile);

let dir: string;
/** Where the units' paths land here: the install, the data directory, the settings file, the backups. */
let paths: Record<string, string>;
beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), "gateway-systemd-"));
  paths = { "/opt/gateway": root, "/var/lib/gateway": join(dir, "state"), "/etc/gateway/gateway.env": join(dir, "gateway.env"), "/var/backups/gateway": join(dir, "backups") };
  for (const p of ["state", "backups", "units"]) mkdirSync(join(dir, p));
  makeCertificate(dir, "a");
  makeCertificate(dir, "b");
  copyFileSync(join(dir, "a.cert.pem"), join(dir, "live.cert.pem"));
  copyFileSync(join(dir, "a.key.pem"), join(dir, "live.key.pem"));
  writeFileSync(
    paths["/etc/gateway/gateway.env"]!,
    ["# as an operator writes it", "GATEWAY_PORT=0", `GATEWAY_TLS_CERT=${join(dir, "live.cert.pem")}`, `GATEWAY_TLS_KEY=${join(dir, "live.key.pem")}`, "GATEWAY_TLS_CHECK_SECONDS=0", ""].join("\n"),
  );
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** A unit file's text with its paths moved to this test's. */
function moved(name: string): string {
  let text = readFileSync(join(units, name), "utf8");
  for (const [from, to] of Object.entries(paths)) text = text.replaceAll(from, to);
  return text;
}

/** A unit's settings: key to its values, in order (a key may repeat). */
function settings(name: string): Map<string, string[]> {
  const out = new Map<string, string[]>();
  for (const line of moved(name).split("\n")) {
    const m = /^([A-Za-z]+)=(.*)$/.exec(line);
    if (m) out.set(m[1]!, [...(out.get(m[1]!) ?? []), m[2]!]);
  }
  return out;
}

const one = (unit: Map<string, string[]>, key: string) => unit.get(key)![0]!;

/** The environment systemd gives the service: Environment= lines, then the settings file, and nothing of this shell but a PATH. */
function environment(unit: Map<string, string[]>, extra: Record<string, string> = {}): Record<string, string> {
  const env: Record<string, string> = { PATH: "/usr/bin:/bin" };
  for (const e of unit.get("Environment") ?? []) {
    const [k, ...v] = e.split("=");
    env[k!] = v.join("=");
  }
  for (const file of unit.get("EnvironmentFile") ?? []) {
    for (const line of readFileSync(file.replace(/^-/, ""), "utf8").split("\n")) {
      const m = /^([A-Z_]+)=(.*)$/.exec(line);
      if (m) env[m[1]!] = m[2]!;
    }
  }
  return { ...env, ...extra };
}

/** An Exec line as systemd runs it: `%%` is `%`; a line with shell syntax is run by the `/bin/sh -c` it names. */
function execLine(line: string): string[] {
  const unescaped = line.replaceAll("%%", "%");
  const shell = /^\/bin\/sh -c '(.*)'$/.exec(unescaped);
  if (shell) return ["/bin/sh", "-c", shell[1]!];
  return unescaped.split(/\s+/).map((a) => a.replace(/^"(.*)"$/, "$1"));
}

function fingerprint(port: number): Promise<string> {
  return new Promise((resolve, reject) => {
    const s = tls.connect({ port, host: "127.0.0.1", rejectUnauthorized: false }, () => {
      resolve(s.getPeerX509Certificate()!.fingerprint256);
      s.end();
    });
    s.on("error", reject);
  });
}

/** The gateway.service's ExecStart, started as systemd would: its directory, its environment, its own process. */
async function startService(extra: Record<string, string> = {}): Promise<{ child: ChildProcess; port: number; out: { text: string }; exited: Promise<number | null> }> {
  const unit = settings("gateway.service");
  const [cmd, ...args] = execLine(one(unit, "ExecStart"));
  const child = spawn(cmd!, args, { cwd: one(unit, "WorkingDirectory"), env: environment(unit, extra), stdio: ["ignore", "pipe", "pipe"] });
  const out = { text: "" };
  child.stdout!.on("data", (d: Buffer) => (out.text += d.toString()));
  child.stderr!.on("data", (d: Buffer) => (out.text += d.toString()));
  const exited = new Promise<number | null>((r) => child.on("exit", (code) => r(code)));
  const until = Date.now() + 30_000;
  while (!/listening on https:\/\/127\.0\.0\.1:\d+ /.test(out.text) && child.exitCode === null && Date.now() < until) await new Promise((r) => setTimeout(r, 50));
  const port = Number(/listening on https:\/\/127\.0\.0\.1:(\d+) /.exec(out.text)?.[1] ?? 0);
  return { child, port, out, exited };
}

describe("the systemd units (deploy/systemd)", () => {
  it("are what systemd-analyze accepts, without a warning", async () => {
    for (const name of readdirSync(units)) writeFileSync(join(dir, "units", name), moved(name));
    const { stdout, stderr } = await run("systemd-analyze", ["verify", ...readdirSync(units).map((n) => join(dir, "units", n))]);
    expect(stdout + stderr).toBe("");
  });

  it("start a real gateway as ExecStart says, reload its renewed certificate as ExecReload says, back it up while it serves, and stop it within TimeoutStopSec", async () => {
    const unit = settings("gateway.service");
    // What the unit promises the gateway: descriptors for its connections, time for its drain and grace, no loop on bad settings.
    expect(Number(one(unit, "LimitNOFILE"))).toBeGreaterThan(defaultAppSettings.limits.maxConnections);
    expect(Number(one(unit, "TimeoutStopSec")) * 1000).toBeGreaterThan(defaultConfig.drainDelayMs + defaultConfig.shutdownGraceMs);
    const made = await runCli(["accounts", "create", "--json", "--name", "team"], environment(unit));
    expect(made.code).toBe(0);
    const team = JSON.parse(made.stdout) as { key: string; secret: string };

    const service = await startService();
    try {
      expect(service.port, service.out.text).toBeGreaterThan(0);
      const call = await new Promise<string>((resolve, reject) => {
        const q = new URLSearchParams({ key: team.key, secret: team.secret, num_iid: demo.retailNumIid });
        https.get(`https://127.0.0.1:${service.port}/retail/item_get/?${q}`, { ca: readFileSync(join(dir, "a.cert.pem")), agent: false }, (res) => {
          let body = "";
          res.on("data", (d: Buffer) => (body += d.toString()));
          res.on("end", () => resolve(body));
        }).on("error", reject);
      });
      // No catalogue was imported: the item is not found, and the call is answered with its status block.
      expect(JSON.parse(call)).toMatchObject({ error_code: "2000" });
      expect(await fingerprint(service.port)).toBe(new X509Certificate(readFileSync(join(dir, "a.cert.pem"))).fingerprint256);

      // A renewal, then `systemctl reload`: ExecReload with $MAINPID.
      copyFileSync(join(dir, "b.cert.pem"), join(dir, "live.cert.pem"));
      copyFileSync(join(dir, "b.key.pem"), join(dir, "live.key.pem"));
      const [reloadCmd, ...reloadArgs] = ["/bin/sh", "-c", one(unit, "ExecReload")];
      await run(reloadCmd!, reloadArgs, { env: { ...environment(unit), MAINPID: String(service.child.pid) } });
      const b = new X509Certificate(readFileSync(join(dir, "b.cert.pem"))).fingerprint256;
      const until = Date.now() + 10_000;
      while ((await fingerprint(service.port)) !== b && Date.now() < until) await new Promise((r) => setTimeout(r, 100));
      expect(await fingerprint(service.port)).toBe(b);

      // The backup unit's two commands, as its timer starts them, beside the serving gateway: a new backup, whole;
      // one from 20 days ago removed, one from yesterday kept.
      const backups = paths["/var/backups/gateway"]!;
      for (const [name, daysAgo] of [["gateway-old.db", 20], ["gateway-yesterday.db", 1]] as const) {
        writeFileSync(join(backups, name), "");
        const t = new Date(Date.now() - daysAgo * 86_400_000);
        utimesSync(join(backups, name), t, t);
      }
      const backup = settings("gateway-backup.service");
      for (const key of ["ExecStart", "ExecStartPost"]) {
        const [cmd, ...args] = execLine(one(backup, key));
        const done = await run(cmd!, args, { cwd: one(backup, "WorkingDirectory"), env: environment(backup) });
        expect(done.stderr).toBe("");
      }
      const left = readdirSync(backups).sort();
      expect(left).toEqual([expect.stringMatching(/^gateway-\d{8}T\d{6}Z\.db$/), "gateway-yesterday.db"]);
      const copy = new DatabaseSync(join(backups, left[0]!), { readOnly: true });
      try {
        expect(copy.prepare("PRAGMA integrity_check").get()).toEqual({ integrity_check: "ok" });
        expect(copy.prepare("SELECT count(*) AS n FROM ledger").get()).toEqual({ n: 1 });
      } finally {
        copy.close();
      }

      // `systemctl stop`: KillSignal, and the gateway's own drain, well within TimeoutStopSec.
      const started = Date.now();
      service.child.kill(one(unit, "KillSignal") as NodeJS.Signals);
      expect(await service.exited).toBe(0);
      expect(Date.now() - started).toBeLessThan(Number(one(unit, "TimeoutStopSec")) * 1000);
    } finally {
      service.child.kill("SIGKILL");
    }
    expect(service.out.text).toContain('"msg":"TLS certificate reloaded: new connections get it, open ones keep theirs"');
  });

  it("exit with a status RestartPreventExitStatus names when the settings do not read, so a bad setting does not restart in a loop", async () => {
    const unit = settings("gateway.service");
    const service = await startService({ GATEWAY_PORT: "not-a-port" });
    expect(await service.exited).toBe(2);
    expect(one(unit, "RestartPreventExitStatus").split(/\s+/)).toContain("2");
    expect(existsSync(join(paths["/var/lib/gateway"]!, "serve.owner"))).toBe(false);
  });
});
