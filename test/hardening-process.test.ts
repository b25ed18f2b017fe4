// Issue 11, items 1 (starting on a full disk), 2, 7, 12 and 15: what a running
// `serve`, a real socket flood and the operator's CLI must survive.
import { spawn, type ChildProcess } from "node:child_process";
import { randomUUID } from "node:crypto";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import net from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { demoExampleIds, demoRecords } from "../src/catalogue/demo-dataset.ts";
import { runCli, root } from "./support/cli.ts";
import { startServe, withoutSecrets } from "./support/gateway-process.ts";
import { startGateway } from "./support/gateway-fixture.ts";

const dirs: string[] = [];
const children: ChildProcess[] = [];
function freshDir(): string {
  const d = mkdtempSync(join(tmpdir(), "gateway-hardening-"));
  dirs.push(d);
  return d;
}
afterAll(() => {
  for (const c of children) c.kill("SIGKILL");
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

async function waitFor(predicate: () => boolean, what: string, output: () => string, ms = 20_000): Promise<void> {
  const until = Date.now() + ms;
  while (!predicate()) {
    if (Date.now() > until) throw new Error(`timed out waiting for ${what}; output so far:\n${withoutSecrets(output())}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

describe("11.1 starting on a full disk, and 11.7 every 4000 and internal logged", () => {
  it("serve starts on a store that cannot grow, answers 4000 with a logged request id, and stays up", async () => {
    const dir = freshDir();
    const ids = demoExampleIds(demoRecords());
    // A store with the demo catalogue and an account, made by the CLI as an operator would.
    const ndjson = join(dir, "demo.ndjson");
    writeFileSync(ndjson, demoRecords().map((r) => JSON.stringify(r)).join("\n"));
    const env = { GATEWAY_DATA_DIR: join(dir, "data") };
    expect((await runCli(["import", ndjson], env)).code).toBe(0);
    const created = await runCli(["accounts", "create", "--json"], env);
    const account = JSON.parse(created.stdout) as { key: string; secret: string };

    // The store may not grow past its size now: every new page is "disk full".
    let output = "";
    const server = spawn(process.execPath, [join(root, "bin", "gateway.js"), "serve"], {
      cwd: root,
      env: { ...process.env, ...env, GATEWAY_PORT: "0", GATEWAY_STORE_MAX_BYTES: "4096", GATEWAY_ADMIN_TOKEN: "admin-token-0123456789abcdef", GATEWAY_LOG_LEVEL: "info" },
      stdio: ["ignore", "pipe", "pipe"],
    });
    children.push(server);
    let exited: number | null | undefined;
    server.on("exit", (code) => (exited = code));
    server.stdout!.on("data", (d: Buffer) => (output += d.toString()));
    server.stderr!.on("data", (d: Buffer) => (output += d.toString()));
    await waitFor(() => /listening on http/.test(output), "the gateway to listen", () => output);
    const base = /listening on (http:\/\/127\.0\.0\.1:\d+)/.exec(output)![1]!;

    const q = new URLSearchParams({ key: account.key, secret: account.secret, num_iid: ids.retailNumIid });
    let failed: { error_code: string; reason: string; request_id: string } | undefined;
    for (let i = 0; i < 600 && failed === undefined; i++) {
      const json = (await (await fetch(`${base}/retail/item_get/?${q}&cache=${i % 2 ? "yes" : "no"}`)).json()) as { error_code: string; reason: string; request_id: string };
      expect(["0000", "4000"]).toContain(json.error_code);
      if (json.error_code === "4000") failed = json;
    }
    expect(failed, "the store never filled").toBeDefined();
    expect(failed!.reason).toMatch(/usage ledger cannot be written/);
    // Later calls keep being answered (4000, or 0000 when a probe's row happens to fit), and refusals keep their codes.
    for (let i = 0; i < 20; i++) {
      const later = (await (await fetch(`${base}/retail/item_get/?${q}`)).json()) as { error_code: string };
      expect(["0000", "4000"]).toContain(later.error_code);
    }
    const unknown = (await (await fetch(`${base}/retail/item_get/?key=nobody&secret=x&num_iid=1`)).json()) as { error_code: string };
    expect(unknown.error_code).toBe("4004");

    // The AdminService cannot write either: internal, with a request id that is in the log. (Accounts of the
    // longest name are made until one does not fit: a page's free room may hold a few.)
    let adminError: { code?: string; message: string } = { message: "" };
    for (let i = 0; i < 500 && adminError.code === undefined; i++) {
      const res = await fetch(`${base}/gateway.admin.v1.AdminService/CreateAccount`, {
        method: "POST",
        headers: { "content-type": "application/json", authorization: "Bearer admin-token-0123456789abcdef" },
        body: JSON.stringify({ name: `${i}`.padEnd(200, "x") }),
      });
      adminError = (await res.json()) as { code?: string; message: string };
    }
    expect(adminError.code).toBe("internal");
    const adminRequestId = /request id (\S+)/.exec(adminError.message)?.[1];
    expect(adminRequestId).toBeDefined();

    await new Promise((r) => setTimeout(r, 200));
    expect(exited).toBeUndefined();
    const errorLines = output
      .split("\n")
      .filter((l) => l.startsWith("{"))
      .map((l) => JSON.parse(l) as { level: number; requestId?: string; err?: { message?: string }; msg: string })
      .filter((l) => l.level >= 50);
    expect(errorLines.some((l) => l.requestId === failed!.request_id && l.err?.message !== undefined)).toBe(true);
    expect(errorLines.some((l) => l.requestId === adminRequestId && l.err?.message !== undefined)).toBe(true);
    expect(output).toMatch(/the usage ledger cannot be written/);
    server.kill("SIGTERM");
  });
});

describe("11.2 connections that send nothing", () => {
  it("are closed after the first-request timeout, so a flood of silent sockets past the cap does not lock clients out", async () => {
    const gw = await startGateway({ app: { limits: { maxConnections: 40, firstRequestTimeoutMs: 600 } } });
    const sockets: net.Socket[] = [];
    try {
      const closed: boolean[] = [];
      const open = (first: string) =>
        new Promise<void>((resolve) => {
          const s = net.connect(gw.port, "127.0.0.1", () => {
            if (first !== "") s.write(first);
            resolve();
          });
          const i = closed.push(false) - 1;
          s.on("close", () => (closed[i] = true));
          s.on("error", () => {});
          sockets.push(s);
        });
      // Silence, half a preface, and half a request line, past the connection cap.
      for (let i = 0; i < 30; i++) await open("");
      for (let i = 0; i < 10; i++) await open("PRI * HTTP/2.0\r\n");
      for (let i = 0; i < 10; i++) await open("GET /retail/item_get/?key=");
      await new Promise((r) => setTimeout(r, 100));
      // The cap is taken: a new client is turned away at once.
      const early = await fetch(`${gw.base}/retail/item_get/`).then(
        () => "served",
        () => "refused",
      );
      expect(early).toBe("refused");

      await expect.poll(() => closed.filter(Boolean).length, { timeout: 5000, interval: 100 }).toBe(50);
      const later = (await (await fetch(`${gw.base}/retail/item_get/?key=${gw.account.key}&secret=${gw.account.secret}&num_iid=${demoExampleIds().retailNumIid}`)).json()) as { error_code: string };
      expect(later.error_code).toBe("0000");
    } finally {
      for (const s of sockets) s.destroy();
      await gw.close();
    }
  });
});

describe("11.2 connections past what the open-files limit holds", () => {
  it("lower the connection cap to what the limit holds beside the gateway's own files, said at start: the gateway refuses the rest itself, counted, rather than the system unseen", async () => {
    const dataDir = mkdtempSync(join(tmpdir(), "gw-open-files-"));
    const adminToken = `admin-${randomUUID()}`;
    const serve = await startServe({ GATEWAY_DATA_DIR: dataDir, GATEWAY_FIRST_REQUEST_TIMEOUT_MS: "30000", GATEWAY_ADMIN_TOKEN: adminToken }, { demo: true, openFiles: 400 });
    const sockets: net.Socket[] = [];
    const port = Number(new URL(serve.base).port);
    /** A connection that asks for /healthz and stays open: its status line, or "closed" when it was closed with nothing written. */
    const hold = () =>
      new Promise<string>((resolve) => {
        const socket = net.connect(port, "127.0.0.1", () => socket.write("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"));
        sockets.push(socket);
        socket.on("error", () => {});
        socket.once("data", (d: Buffer) => resolve(d.toString("latin1").split("\r\n")[0]!));
        socket.once("close", () => resolve("closed"));
      });
    const scrape = async () => {
      const text = await fetch(`${serve.base}/metrics`, { headers: { connection: "close" } }).then((r) => r.text());
      const value = (name: string) => Number(new RegExp(`^${name.replace(/[{}"]/g, "\\$&")} (\\S+)$`, "m").exec(text)?.[1]);
      return { max: value("gateway_connections_max"), fds: value("process_max_fds"), refused: value('gateway_connections_refused_total{what="connection"}') };
    };
    try {
      // 400 files: 100 kept for the gateway's own, 300 for connections; said once, at start, with what to raise.
      const warned = serve
        .output()
        .split("\n")
        .filter((l) => l.includes('"level":40'))
        .map((l) => JSON.parse(l) as { msg: string; maxConnections: number; openFilesLimit: number; keptForOwnWork: number; connectionCap: number });
      expect(warned.map(({ maxConnections, openFilesLimit, keptForOwnWork, connectionCap }) => ({ maxConnections, openFilesLimit, keptForOwnWork, connectionCap }))).toEqual([
        { maxConnections: 10000, openFilesLimit: 400, keptForOwnWork: 100, connectionCap: 300 },
      ]);
      expect(warned[0]!.msg).toMatch(/^GATEWAY_MAX_CONNECTIONS \(10000\) is lowered to 300: .*LimitNOFILE=/);
      expect(serve.output()).toMatch(/"connections":\{"maxConnections":300,"openFilesLimit":400\}/);
      expect(await scrape()).toEqual({ max: 300, fds: 400, refused: 0 });
      // GetConnections says why the cap is what it is.
      const asked = await fetch(`${serve.base}/gateway.admin.v1.AdminService/GetConnections`, {
        method: "POST",
        headers: { "content-type": "application/json", authorization: `Bearer ${adminToken}`, connection: "close" },
        body: "{}",
      }).then((r) => r.json() as Promise<Record<string, unknown>>);
      expect([asked.maxConnections, asked.openFilesLimit, asked.maxConnectionsSet]).toEqual(["300", "400", "10000"]);
      // 320 clients that each make a request and stay: 300 served, the rest closed by the gateway, which counts them.
      const answers: string[] = [];
      for (let i = 0; i < 320; i++) answers.push(await hold());
      expect(answers.filter((a) => a === "HTTP/1.1 200 OK").length).toBe(300);
      expect(answers.slice(300)).toEqual(Array(20).fill("closed"));
      expect(serve.child.exitCode).toBe(null);
      for (const s of sockets) s.destroy();
      // Released, the gateway serves again, and its count and warning hold what it refused.
      let after = await scrape().catch(() => undefined);
      for (let tries = 0; tries < 100 && after === undefined; tries++) after = await new Promise((r) => setTimeout(r, 50)).then(() => scrape().catch(() => undefined));
      expect(after?.refused).toBeGreaterThanOrEqual(20);
      expect(serve.output()).toContain("a connection was refused: GATEWAY_MAX_CONNECTIONS connections were open");
      // The demo's first printed legacy call.
      const demoCall = /curl '(http:\/\/[^']+\?key=[^']+)'/.exec(serve.output())![1]!;
      expect(((await (await fetch(demoCall)).json()) as { error_code: string }).error_code).toBe("0000");
    } finally {
      for (const s of sockets) s.destroy();
      serve.child.kill("SIGTERM");
      await new Promise((r) => serve.child.once("exit", r));
      rmSync(dataDir, { recursive: true, force: true });
    }
  });
});

describe("11.12 bad operator input on the CLI", () => {
  it("answers one line naming the bad value and exit status 2, never a stack", async () => {
    const env = { GATEWAY_DATA_DIR: join(freshDir(), "data") };
    for (const args of [
      ["accounts", "create", "--expires", "2027-13-45"],
      ["accounts", "create", "--expires", "2026-02-30"],
      ["accounts", "create", "--zone", "Mars/Olympus"],
      ["accounts", "create", "--max=-5"],
      ["accounts", "create", "--max", "many"],
      ["accounts", "create", "--balance", "1e9"],
    ]) {
      const r = await runCli(args, env);
      expect(r.code, args.join(" ")).toBe(2);
      expect(r.stderr.trim().split("\n"), args.join(" ")).toHaveLength(1);
      expect(r.stderr).not.toMatch(/\n\s+at /);
      expect(r.stderr).toContain(args.at(-1)!.replace("--max=", ""));
    }
    // Top-ups of the largest amount until the balance would pass what the store holds (about 9.2e12).
    const { key } = JSON.parse((await runCli(["accounts", "create", "--json"], env)).stdout) as { key: string };
    let last = await runCli(["accounts", "top-up", key, "999999999999"], env);
    for (let i = 0; i < 12 && last.code === 0; i++) last = await runCli(["accounts", "top-up", key, "999999999999"], env);
    expect(last.code).toBe(2);
    expect(last.stderr.trim().split("\n")).toHaveLength(1);
    expect(last.stderr).toMatch(/largest it can hold/);
    // About twenty CLI processes, one after another: 21 s on a quiet 2-core machine, past 30 s on a busy one.
  }, 120_000);
});

describe("11.15 import rejects records missing fields the contract requires", () => {
  it("names the line and the missing field", async () => {
    const dir = freshDir();
    const [retail] = demoRecords();
    const full = retail!.item as Record<string, unknown>;
    const { seller_info: sellerInfo, ...noSellerInfo } = full;
    const { sid: _sid, ...sellerWithoutSid } = sellerInfo as Record<string, unknown>;
    const file = join(dir, "items.ndjson");
    writeFileSync(
      file,
      [
        JSON.stringify({ kind: "item_detail", item: { num_iid: "800000000001", title: "minimal" } }),
        JSON.stringify({ kind: "item_detail", item: { ...noSellerInfo, num_iid: "800000000002" } }),
        JSON.stringify({ kind: "item_detail", item: { ...full, num_iid: "800000000003", seller_info: sellerWithoutSid } }),
        JSON.stringify({ kind: "item_detail", item: { ...full, num_iid: "800000000004" } }),
        JSON.stringify({ kind: "peer_viewed", num_iid: "810000000001", sid: "b2b-1", item: [{ num_iid: "1", price: "1.00", title: "袜子" }] }),
      ].join("\n"),
    );
    const r = await runCli(["import", file, "--json"], { GATEWAY_DATA_DIR: join(dir, "data") });
    const report = JSON.parse(r.stdout) as { imported: number; skipped: { line: number; message: string }[] };
    expect(report.imported).toBe(1);
    expect(report.skipped.map((s) => s.line)).toEqual([1, 2, 3, 5]);
    expect(report.skipped[0]!.message).toMatch(/item\.desc_short is missing/);
    expect(report.skipped[1]!.message).toMatch(/item\.seller_info is missing/);
    expect(report.skipped[2]!.message).toMatch(/item\.seller_info\.sid is missing/);
    expect(report.skipped[3]!.message).toMatch(/item\[0\]\.pic_url is missing/);
  });
});
