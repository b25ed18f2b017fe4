import { execFileSync, spawn } from "node:child_process";
import { createHash } from "node:crypto";
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { DatabaseSync } from "node:sqlite";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { defaultConfig } from "../src/config.ts";
import { openRuntime } from "../src/runtime.ts";
import { migrations as embeddedSteps } from "../src/stores/embedded/sqlite-database.ts";
import { migrateSchema, migrations as sharedSteps, openPostgres } from "../src/stores/postgres/postgres-database.ts";
import { makeCertificate, makeExpiredCertificate } from "./support/certificates.ts";
import { root, runCli } from "./support/cli.ts";
import { freshDatabase } from "./support/postgres.ts";
import { HttpCollector } from "./support/otlp-collectors.ts";
import { cleartextCredentials, clockFinding, clockOffsetWarnMs } from "../src/cli/check-command.ts";
import { connectionCapUnder, openFilesLimit } from "../src/open-files.ts";

// `gateway check`: what serve would start with, read and never written (src/cli/check-command.ts).

interface Finding {
  check: string;
  status: "ok" | "warn" | "fail";
  detail: string;
}

let dir: string;
beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), "gateway-check-"));
  makeCertificate(dir, "good", 90);
  makeCertificate(dir, "soon", 5);
  makeCertificate(dir, "other", 90);
  makeExpiredCertificate(dir, "old", "good");
  // The key of good under a passphrase, which the gateway is never given.
  execFileSync("openssl", ["pkcs8", "-topk8", "-in", join(dir, "good.key.pem"), "-out", join(dir, "locked.key.pem"), "-passout", "pass:not-given"], { stdio: "ignore" });
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

async function check(env: Record<string, string>): Promise<{ code: number | null; ok: boolean; findings: Finding[]; text: string }> {
  const { code, stdout, stderr } = await runCli(["check", "--json"], env);
  const parsed = JSON.parse(stdout) as { ok: boolean; findings: Finding[] };
  return { code, ...parsed, text: stdout + stderr };
}

const of = (findings: Finding[], name: string) => findings.filter((f) => f.check === name);
const sha = (path: string) => createHash("sha256").update(readFileSync(path)).digest("hex");

describe("gateway check on the embedded store", () => {
  it("says what a data directory holds, and whether a gateway serves it now, without writing a byte", async () => {
    const dataDir = join(dir, "data");
    const before = await check({ GATEWAY_DATA_DIR: dataDir });
    expect(before.code).toBe(0);
    expect(of(before.findings, "store")).toEqual([{ check: "store", status: "warn", detail: `embedded: ${join(dataDir, "gateway.db")} does not exist yet; serve creates it empty (no accounts, no catalogue)` }]);
    // A look creates nothing.
    expect(existsSync(join(dataDir, "gateway.db"))).toBe(false);

    // A real gateway serves it (the demo: its catalogue, its account).
    const serve = spawn(process.execPath, [join(root, "bin", "gateway.js"), "serve", "--demo"], { env: { ...process.env, GATEWAY_DATA_DIR: dataDir, GATEWAY_PORT: "0" }, stdio: ["ignore", "pipe", "pipe"] });
    let out = "";
    serve.stdout.on("data", (d: Buffer) => (out += d.toString()));
    try {
      const until = Date.now() + 30_000;
      while (!out.includes("Demo account") && Date.now() < until) await new Promise((r) => setTimeout(r, 50));
      const serving = await check({ GATEWAY_DATA_DIR: dataDir });
      expect(serving.code).toBe(0);
      expect(of(serving.findings, "store")[0]).toMatchObject({ status: "ok", detail: expect.stringMatching(new RegExp(`schema step ${embeddedSteps.length}, this gateway's; served now by process ${serve.pid} \\(since `)) });
      expect(of(serving.findings, "accounts")).toEqual([{ check: "accounts", status: "ok", detail: "1 active, 0 stopped" }]);
      expect(of(serving.findings, "catalogue")[0]).toMatchObject({ status: "ok", detail: expect.stringMatching(/^records: retail \d+, wholesale \d+$/) });
    } finally {
      serve.kill("SIGTERM");
      await new Promise((r) => serve.once("exit", r));
    }

    const db = join(dataDir, "gateway.db");
    const bytes = sha(db);
    const stopped = await check({ GATEWAY_DATA_DIR: dataDir });
    expect(of(stopped.findings, "store")[0]!.detail).toMatch(/; not served now$/);
    expect(sha(db)).toBe(bytes);

    // A store a newer gateway wrote (its schema further on): serve would run on it without the steps it lacks.
    const newer = join(dir, "newer");
    runSql(db, join(newer, "gateway.db"), `PRAGMA user_version = ${embeddedSteps.length + 2}`);
    const ahead = await check({ GATEWAY_DATA_DIR: newer });
    expect(ahead.code).toBe(0);
    expect(of(ahead.findings, "store")[0]).toMatchObject({ status: "warn", detail: expect.stringContaining(`schema step ${embeddedSteps.length + 2}, written by a newer gateway (this one knows ${embeddedSteps.length})`) });
    // And a gateway started on it says so in its log, once, and serves.
    const told: string[] = [];
    const onNewer = await openRuntime({ ...defaultConfig, dataDir: newer }, { log: { error: (_o, m) => told.push(`error ${m}`), warn: (_o, m) => told.push(`warn ${m}`) } });
    await onNewer.close();
    expect(told.filter((m) => m.includes("newer gateway"))).toEqual([
      `warn the embedded store was written by a newer gateway (schema step ${embeddedSteps.length + 2}; this one knows ${embeddedSteps.length}): this one runs on it without what the newer steps added; run the newer version`,
    ]);
    // One with no account left active: every call would be refused.
    const stoppedAll = join(dir, "stopped");
    runSql(db, join(stoppedAll, "gateway.db"), "UPDATE accounts SET status = 'stopped'");
    expect(of((await check({ GATEWAY_DATA_DIR: stoppedAll })).findings, "accounts")[0]).toMatchObject({ status: "warn", detail: expect.stringContaining("none active (1 stopped)") });
  });

  it("a store that cannot be read fails the check", async () => {
    const broken = join(dir, "broken");
    mkdirSync(broken, { recursive: true });
    writeFileSync(join(broken, "gateway.db"), "this is not a database, but it is long enough to be read as one ".repeat(100));
    const result = await check({ GATEWAY_DATA_DIR: broken });
    expect(result.code).toBe(1);
    expect(of(result.findings, "store")[0]).toMatchObject({ status: "fail", detail: expect.stringContaining("cannot be read") });
  });
});

/** A copy of the store `from` at `to` (or a new one), with `sql` run on the copy. */
function runSql(from: string, to: string, sql: string): void {
  mkdirSync(join(to, ".."), { recursive: true });
  // The WAL folded in first, so the copy holds every commit.
  const source = new DatabaseSync(from);
  source.exec("PRAGMA wal_checkpoint(TRUNCATE)");
  source.close();
  copyFileSync(from, to);
  const db = new DatabaseSync(to);
  db.exec(sql);
  db.close();
}

describe("gateway check on the store's room", () => {
  it("fails a free-space floor above the free space and a store at its cap (every call would be refused), and warns near the cap", async () => {
    const dataDir = join(dir, "room");
    expect((await runCli(["accounts", "create", "--name", "x"], { GATEWAY_DATA_DIR: dataDir })).code).toBe(0);
    const size = statSync(join(dataDir, "gateway.db")).size;
    const roomy = await check({ GATEWAY_DATA_DIR: dataDir });
    expect(of(roomy.findings, "disk")).toEqual([{ check: "disk", status: "ok", detail: expect.stringMatching(new RegExp(`^\\d+\\.\\d [GM]iB free in ${dataDir}; calls are refused \\(4000\\) below 64\\.0 MiB \\(GATEWAY_MIN_FREE_MB\\)$`)) }]);

    const floor = await check({ GATEWAY_DATA_DIR: dataDir, GATEWAY_MIN_FREE_MB: "1000000000" });
    expect(floor.code).toBe(1);
    expect(of(floor.findings, "disk")[0]).toMatchObject({ status: "fail", detail: expect.stringContaining("under GATEWAY_MIN_FREE_MB (976562.5 GiB), so every call that would be served is refused (4000)") });

    const near = await check({ GATEWAY_DATA_DIR: dataDir, GATEWAY_STORE_MAX_BYTES: String(Math.ceil(size / 0.95)) });
    expect(near.code).toBe(0);
    expect(of(near.findings, "disk")[1]).toMatchObject({ status: "warn", detail: expect.stringContaining("raise the cap, or shorten GATEWAY_LEDGER_RETENTION_DAYS") });
    const full = await check({ GATEWAY_DATA_DIR: dataDir, GATEWAY_STORE_MAX_BYTES: String(size) });
    expect(full.code).toBe(1);
    expect(of(full.findings, "disk")[1]).toMatchObject({ status: "fail", detail: expect.stringContaining(": full, so every call that would be served is refused (4000)") });
  });
});

describe("gateway check's output", () => {
  it("ends quietly when its reader stops early (| head): no stack, its own exit code", async () => {
    const child = spawn(process.execPath, [join(root, "bin", "gateway.js"), "check"], { env: { ...process.env, GATEWAY_DATA_DIR: join(dir, "head") }, stdio: ["ignore", "pipe", "pipe"] });
    let stderr = "";
    child.stderr.on("data", (d: Buffer) => (stderr += d.toString()));
    // As `head -1` does: the first line read, then the pipe closed.
    child.stdout.once("data", () => child.stdout.destroy());
    const code = await new Promise<number | null>((r) => child.on("close", r));
    expect(stderr).toBe("");
    expect(code).toBe(0);
  });
});

describe("gateway check on TLS files", () => {
  const tlsEnv = (cert: string, key: string) => ({ GATEWAY_DATA_DIR: join(dir, "tls-data"), GATEWAY_TLS_CERT: join(dir, `${cert}.cert.pem`), GATEWAY_TLS_KEY: join(dir, `${key}.key.pem`) });

  it("names the certificate served and its time left, warns two weeks ahead, and fails an expired one or a pair that does not match", async () => {
    const good = await check(tlsEnv("good", "good"));
    expect(good.code).toBe(0);
    expect(of(good.findings, "tls")[0]).toMatchObject({ status: "ok", detail: expect.stringMatching(/^CN=gateway-good, SHA-256 [0-9A-F:]{95}, valid until \S+ \((89|90) days; read again every 60 s and on SIGHUP\)$/) });

    const soon = await check(tlsEnv("soon", "soon"));
    expect(soon.code).toBe(0);
    expect(of(soon.findings, "tls")[0]).toMatchObject({ status: "warn", detail: expect.stringMatching(/: expires in [45] day\(s\); renew it/) });

    const old = await check(tlsEnv("old", "old"));
    expect(old.code).toBe(1);
    expect(of(old.findings, "tls")[0]).toMatchObject({ status: "fail", detail: expect.stringContaining(": expired; clients refuse it") });

    const mismatched = await check(tlsEnv("good", "other"));
    expect(mismatched.code).toBe(1);
    expect(of(mismatched.findings, "tls")[0]).toMatchObject({ status: "fail", detail: expect.stringContaining("the certificate and key cannot serve TLS together (key values mismatch)") });
    expect(mismatched.text).not.toContain("PRIVATE KEY");

    const locked = await check(tlsEnv("good", "locked"));
    expect(locked.code).toBe(1);
    expect(of(locked.findings, "tls")[0]).toMatchObject({ status: "fail", detail: expect.stringContaining("(the key is encrypted with a passphrase; give the gateway an unencrypted key)") });

    const missing = await check({ ...tlsEnv("good", "good"), GATEWAY_TLS_KEY: join(dir, "nowhere.pem") });
    expect(missing.code).toBe(1);
    expect(of(missing.findings, "tls")[0]).toMatchObject({ status: "fail", detail: expect.stringContaining("nowhere.pem cannot be read (ENOENT)") });
  });

  it("warns what a public address exposes: cleartext without TLS, and /metrics without a token", async () => {
    const open = await check({ GATEWAY_DATA_DIR: join(dir, "tls-data"), GATEWAY_HOST: "0.0.0.0" });
    expect(of(open.findings, "listen").map((f) => f.status)).toEqual(["ok", "warn"]);
    expect(of(open.findings, "metrics")).toEqual([expect.objectContaining({ status: "warn" })]);
    const closed = await check({ ...tlsEnv("good", "good"), GATEWAY_HOST: "0.0.0.0", GATEWAY_METRICS_TOKEN: "a-metrics-token-of-some-length" });
    expect(of(closed.findings, "listen").map((f) => f.status)).toEqual(["ok"]);
    expect(of(closed.findings, "metrics")).toEqual([]);
    expect(closed.text).not.toContain("a-metrics-token-of-some-length");
  });
});

describe("gateway check on the open-files limit", () => {
  it("warns when the limit holds fewer connections than GATEWAY_MAX_CONNECTIONS beside the gateway's own files, and says what serve does", () => {
    // Run under a limit of 600 (prlimit execs the command: the same process, so Node's own raise stops at 600).
    const run = (limit: number, max: string) =>
      JSON.parse(
        execFileSync("prlimit", [`--nofile=${limit}:${limit}`, "--", process.execPath, join(root, "bin/gateway.js"), "check", "--json"], {
          env: { ...process.env, GATEWAY_DATA_DIR: join(dir, "open-files-data"), GATEWAY_MAX_CONNECTIONS: max },
          encoding: "utf8",
        }),
      ) as { findings: Finding[] };
    expect(of(run(600, "10000").findings, "connections")).toEqual([
      {
        check: "connections",
        status: "warn",
        detail: "the open-files limit, 600, holds 450 connections beside the 150 files kept for the gateway's own work, not GATEWAY_MAX_CONNECTIONS (10000): serve lowers the cap to 450; raise the limit (LimitNOFILE= under systemd, a container's nofile ulimit) to keep 10000",
      },
    ]);
    expect(of(run(600, "400").findings, "connections")).toEqual([{ check: "connections", status: "ok", detail: "up to 400; the open-files limit, 600, holds them and 150 more for the gateway's own work" }]);
  });

  it("reads the soft limit from /proc/self/limits, and none where it is unlimited or cannot be read", () => {
    const limits = (soft: string) => () => `Limit                     Soft Limit           Hard Limit           Units     \nMax processes             95138                95138                processes \nMax open files            ${soft}                1048576              files     \n`;
    expect(openFilesLimit(limits("1024"))).toBe(1024);
    expect(openFilesLimit(limits("unlimited"))).toBe(undefined);
    expect(
      openFilesLimit(() => {
        throw Object.assign(new Error("no such file"), { code: "ENOENT" });
      }),
    ).toBe(undefined);
    expect(connectionCapUnder(10_000, undefined)).toEqual({ cap: 10_000, lowered: false, reserve: 0 });
    // A small limit keeps a quarter for the gateway's own work.
    expect(connectionCapUnder(10_000, 256)).toEqual({ cap: 192, lowered: true, reserve: 64 });
    expect(connectionCapUnder(10_000, 1024)).toEqual({ cap: 768, lowered: true, reserve: 256 });
    expect(connectionCapUnder(768, 1024)).toEqual({ cap: 768, lowered: false, reserve: 256 });
  });
});

describe("gateway check on the gateway's spans", () => {
  it("sends the collector one export of no spans, and says whether it was taken, never showing the collector's token", async () => {
    const collector = await new HttpCollector().start();
    try {
      const env = { GATEWAY_DATA_DIR: join(dir, "traces-data"), OTEL_EXPORTER_OTLP_ENDPOINT: collector.url.replace("/v1/traces", ""), OTEL_EXPORTER_OTLP_HEADERS: "authorization=Bearer%20hunter2-token" };
      const took = await check(env);
      expect(of(took.findings, "traces")).toEqual([{ check: "traces", status: "ok", detail: `spans to ${collector.url} over http/protobuf; the collector took an empty export` }]);
      expect(collector.received.map((r) => [r.spans.length, r.headers.authorization])).toEqual([[0, "Bearer hunter2-token"]]);
      collector.answer = () => ({ kind: "status", status: 401, message: "unknown token" });
      const refused = await check(env);
      expect(of(refused.findings, "traces")).toEqual([
        { check: "traces", status: "warn", detail: `spans to ${collector.url} over http/protobuf; an empty export was not taken (the collector answered HTTP 401: unknown token): serve would start, and drop every span` },
      ]);
      // Tried once: a check does not wait out retries.
      expect(collector.received.length).toBe(2);
      expect(took.text + refused.text).not.toContain("hunter2");
      const off = await check({ GATEWAY_DATA_DIR: join(dir, "traces-data"), OTEL_EXPORTER_OTLP_ENDPOINT: collector.url, OTEL_TRACES_EXPORTER: "none" });
      expect(of(off.findings, "traces").map((f) => f.detail)).toEqual(["off (GATEWAY_TRACES_EXPORTER=none): no span is recorded"]);
    } finally {
      await collector.stop();
    }
  });

  it("warns of a collector's credentials sent in cleartext off this machine", () => {
    const headers = { authorization: "Bearer t" };
    expect(cleartextCredentials({ url: "http://collector.example:4318/v1/traces", headers })).toEqual([
      { check: "traces", status: "warn", detail: "the collector's header fields (GATEWAY_OTLP_HEADERS, credentials) cross the network to collector.example:4318 in cleartext: use https" },
    ]);
    expect(cleartextCredentials({ url: "https://collector.example:4318/v1/traces", headers })).toEqual([]);
    expect(cleartextCredentials({ url: "http://127.0.0.1:4318/v1/traces", headers })).toEqual([]);
    expect(cleartextCredentials({ url: "http://[::1]:4318/v1/traces", headers })).toEqual([]);
    expect(cleartextCredentials({ url: "http://collector.example:4318/v1/traces", headers: {} })).toEqual([]);
  });
});

describe("gateway check on the shared stores", () => {
  let database: Awaited<ReturnType<typeof freshDatabase>>;
  beforeAll(async () => {
    database = await freshDatabase("check");
  });
  afterAll(() => database.drop());

  it("reads PostgreSQL's schema step and counts and Redis's version, shows neither password, and fails a server it cannot reach", async () => {
    // A password in the URL (trust auth ignores it) must appear nowhere.
    const url = new URL(database.url);
    url.password = "hunter2-not-shown";
    const shared = { GATEWAY_DATABASE_URL: url.href, GATEWAY_REDIS_URL: "redis://:redis-secret-not-shown@127.0.0.1:6379" };
    const empty = await check(shared);
    expect(empty.code).toBe(0);
    expect(of(empty.findings, "store")[0]).toMatchObject({ status: "ok", detail: expect.stringMatching(new RegExp(`^shared: PostgreSQL postgres://127\\.0\\.0\\.1:5432/${database.name} \\(server [^)]+\\)\\): no schema yet; serve creates it \\(step ${sharedSteps.length}\\)$`)) });
    expect(of(empty.findings, "cache")[0]).toMatchObject({ status: "ok", detail: expect.stringMatching(/^shared: Redis redis:\/\/127\.0\.0\.1:6379 \(server \d+\.\d+\.\d+\)$/) });

    const pool = openPostgres(database.url);
    try {
      await migrateSchema(pool);
    } finally {
      await pool.end();
    }
    const made = await runCli(["accounts", "create", "--name", "team"], shared);
    expect(made.code).toBe(0);
    const migrated = await check(shared);
    expect(of(migrated.findings, "store")[0]!.detail).toContain(`schema step ${sharedSteps.length}, this gateway's`);
    expect(of(migrated.findings, "accounts")).toEqual([{ check: "accounts", status: "ok", detail: "1 active, 0 stopped" }]);
    expect(migrated.text).not.toContain("hunter2");
    expect(of(migrated.findings, "clock")).toEqual([{ check: "clock", status: "ok", detail: expect.stringMatching(/^this machine's clock is within \d+ ms of PostgreSQL's \(±\d+ ms\)$/) }]);
    // A replica started on a schema a newer gateway moved on says so in its log.
    const later = openPostgres(database.url);
    try {
      await later.query("INSERT INTO schema_migrations (version) VALUES ($1)", [sharedSteps.length + 1]);
    } finally {
      await later.end();
    }
    const told: string[] = [];
    const replica = await openRuntime({ ...defaultConfig, databaseUrl: database.url, redisUrl: "redis://127.0.0.1:6379/14" }, { log: { error: (_o, m) => told.push(m), warn: (_o, m) => told.push(m) } });
    await replica.close();
    expect(told.filter((m) => m.includes("newer gateway"))).toEqual([expect.stringContaining(`the shared store was written by a newer gateway (schema step ${sharedSteps.length + 1}; this one knows ${sharedSteps.length})`)]);
    expect(of((await check(shared)).findings, "store")[0]).toMatchObject({ status: "warn", detail: expect.stringContaining("written by a newer gateway") });
    expect(migrated.text).not.toContain("redis-secret");

    const started = Date.now();
    const down = await check({ GATEWAY_DATABASE_URL: `postgres://postgres:hunter2-not-shown@127.0.0.1:5432/${database.name}_gone`, GATEWAY_REDIS_URL: "redis://127.0.0.1:1" });
    expect(down.code).toBe(1);
    expect(of(down.findings, "store")[0]).toMatchObject({ status: "fail", detail: expect.stringContaining("cannot be reached or read (the database does not exist)") });
    // serve starts without Redis (redis-outage.test.ts): a warning, not a failure.
    expect(of(down.findings, "cache")[0]).toMatchObject({ status: "warn", detail: expect.stringMatching(/^shared: Redis redis:\/\/127\.0\.0\.1:1 cannot be reached \(connection refused\); serve starts and serves without it/) });
    // A refused connection is told at once, not after a reconnecting client's wait.
    expect(Date.now() - started).toBeLessThan(15_000);
    expect(down.text).not.toContain("hunter2");
  });

  it("says how far this machine's clock is from PostgreSQL's, in gateway check (libfaketime moving the CLI's clock) and in a gauge read when scraped", async () => {
    const shared = { GATEWAY_DATABASE_URL: database.url, GATEWAY_REDIS_URL: "redis://127.0.0.1:6379/14" };
    // The CLI's clock 90 s ahead, PostgreSQL's as it is: a warning that says by how much, which way, and what it costs.
    const ahead = await new Promise<string>((resolve, reject) => {
      const child = spawn("faketime", ["-f", "+90s", process.execPath, join(root, "bin", "gateway.js"), "check", "--json"], { cwd: root, env: { ...process.env, ...shared }, stdio: ["ignore", "pipe", "inherit"] });
      let out = "";
      child.stdout.on("data", (d: Buffer) => (out += d.toString()));
      child.on("error", reject);
      child.on("close", () => resolve(out));
    });
    const clock = of((JSON.parse(ahead) as { findings: Finding[] }).findings, "clock");
    expect(clock).toEqual([{ check: "clock", status: "warn", detail: expect.stringMatching(/^this machine's clock is (89\.\d|90\.\d) s ahead of PostgreSQL's \(±\d+ ms\): each replica decides rate limits, .* \(NTP\)$/) }]);
    // The finding's words both ways, and where a warning starts.
    expect(clockFinding({ offsetMs: -1500.4, withinMs: 0.2 })).toEqual({ check: "clock", status: "warn", detail: expect.stringMatching(/^this machine's clock is 1500 ms behind PostgreSQL's \(±1 ms\): /) });
    expect(clockFinding({ offsetMs: clockOffsetWarnMs, withinMs: 2.5 }).status).toBe("ok");
    // A replica's gauge, on its own clock and on one a minute ahead.
    const offset = (text: string) => Number(/^gateway_clock_offset_seconds (\S+)$/m.exec(text)?.[1]);
    const right = await openRuntime({ ...defaultConfig, databaseUrl: database.url, redisUrl: "redis://127.0.0.1:6379/14" });
    const minuteAhead = await openRuntime({ ...defaultConfig, databaseUrl: database.url, redisUrl: "redis://127.0.0.1:6379/14" }, { clock: { now: () => Date.now() + 60_000 } });
    try {
      expect(Math.abs(offset(await right.metrics.scrape()))).toBeLessThan(1);
      expect(offset(await minuteAhead.metrics.scrape())).toBeGreaterThan(59);
      expect(offset(await minuteAhead.metrics.scrape())).toBeLessThan(61);
    } finally {
      await right.close();
      await minuteAhead.close();
    }
  });
});
