import { spawn } from "node:child_process";
import { X509Certificate } from "node:crypto";
import { copyFileSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import http2 from "node:http2";
import https from "node:https";
import { tmpdir } from "node:os";
import { join } from "node:path";
import tls from "node:tls";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { makeCertificate, makeExpiredCertificate } from "./support/certificates.ts";
import { root } from "./support/cli.ts";
import { withoutSecrets } from "./support/gateway-process.ts";
import { demo, startGateway } from "./support/gateway-fixture.ts";
import { HttpCollector } from "./support/otlp-collectors.ts";

// A renewed certificate reaches a serving gateway without a restart: files read again every
// GATEWAY_TLS_CHECK_SECONDS when they changed, and on SIGHUP (src/transports/server/tls-certificate.ts).

let dir: string;
/** Two certificates for 127.0.0.1 with their keys (a, b), and one that expired yesterday (old). */
const pem = (name: string, what: "cert" | "key") => readFileSync(join(dir, `${name}.${what}.pem`));
const fingerprintOf = (name: string) => new X509Certificate(pem(name, "cert")).fingerprint256;

beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), "gateway-tls-reload-"));
  makeCertificate(dir, "a");
  makeCertificate(dir, "b", 90); // a renewal with another life: the expiry served moves
  makeExpiredCertificate(dir, "old", "a");
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** The fingerprint of the certificate a new TLS connection to `port` is given. */
function servedFingerprint(port: number): Promise<string> {
  return new Promise((resolve, reject) => {
    const socket = tls.connect({ port, host: "127.0.0.1", rejectUnauthorized: false, ALPNProtocols: ["http/1.1"] }, () => {
      const fingerprint = socket.getPeerX509Certificate()!.fingerprint256;
      socket.end();
      resolve(fingerprint);
    });
    socket.on("error", reject);
  });
}

async function waitFor<T>(what: string, read: () => Promise<T>, done: (value: T) => boolean, ms = 15_000): Promise<T> {
  const until = Date.now() + ms;
  for (;;) {
    const value = await read();
    if (done(value)) return value;
    if (Date.now() > until) throw new Error(`${what}: still ${withoutSecrets(JSON.stringify(value))} after ${ms} ms`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** A GET over HTTPS (HTTP/1.1, a new connection) trusting `ca`. */
function httpsGet(url: string, ca: Buffer[]): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    https
      .get(url, { ca, agent: false }, (res) => {
        let body = "";
        res.setEncoding("utf8");
        res.on("data", (d: string) => (body += d));
        res.on("end", () => resolve({ status: res.statusCode!, body }));
      })
      .on("error", reject);
  });
}

/** A legacy item_get on an HTTP/2 session: its error code. */
function legacyOnSession(session: http2.ClientHttp2Session, auth: { key: string; secret: string }): Promise<string> {
  return new Promise((resolve, reject) => {
    const query = new URLSearchParams({ key: auth.key, secret: auth.secret, num_iid: demo.retailNumIid });
    const stream = session.request({ ":path": `/retail/item_get/?${query}` });
    let body = "";
    stream.setEncoding("utf8");
    stream.on("data", (d: string) => (body += d));
    stream.on("end", () => resolve((JSON.parse(body) as { error_code: string }).error_code));
    stream.on("error", reject);
  });
}

function sample(metrics: string, name: string): number | undefined {
  const line = metrics.split("\n").find((l) => l.startsWith(`${name} `));
  return line === undefined ? undefined : Number(line.split(" ")[1]);
}

describe("TLS certificate files read again while serving", () => {
  it("serves renewed files to new connections without a restart, refuses a pair caught half copied, and open sessions keep theirs", async () => {
    const cert = join(dir, "live.cert.pem");
    const key = join(dir, "live.key.pem");
    copyFileSync(join(dir, "a.cert.pem"), cert);
    copyFileSync(join(dir, "a.key.pem"), key);
    const logLines: string[] = [];
    const gw = await startGateway({ config: { tlsCert: cert, tlsKey: key, tlsCheckSeconds: 1 }, logLines });
    const ca = [pem("a", "cert"), pem("b", "cert")];
    const base = `https://127.0.0.1:${gw.port}`;
    const session = http2.connect(base, { ca });
    try {
      expect(await servedFingerprint(gw.port)).toBe(fingerprintOf("a"));
      expect(await legacyOnSession(session, gw.account)).toBe("0000");
      const before = (await httpsGet(`${base}/metrics`, ca)).body;
      expect(sample(before, "gateway_tls_certificate_start_timestamp_seconds")).toBe(new X509Certificate(pem("a", "cert")).validFromDate.getTime() / 1000);
      expect(sample(before, "gateway_tls_certificate_expiry_timestamp_seconds")).toBe(new X509Certificate(pem("a", "cert")).validToDate.getTime() / 1000);

      // A renewal copied one file at a time: the new certificate with the old key cannot serve, and is refused.
      writeFileSync(cert, pem("b", "cert"));
      await waitFor("the refusal's log line", async () => logLines.filter((l) => l.includes("TLS certificate not reloaded")).length, (n) => n >= 1);
      expect(await servedFingerprint(gw.port)).toBe(fingerprintOf("a"));
      // Looked at again every second while the files stay so, the refusal is told once.
      await new Promise((r) => setTimeout(r, 2500));
      const refusals = logLines.filter((l) => l.includes("TLS certificate not reloaded"));
      expect(refusals).toHaveLength(1);
      expect(JSON.parse(refusals[0]!)).toMatchObject({ level: 50, reason: "files changed", serving: fingerprintOf("a"), problem: expect.stringContaining("key values mismatch") });

      // The key arrives: served from the next look on.
      writeFileSync(key, pem("b", "key"));
      await waitFor("the new certificate", () => servedFingerprint(gw.port), (f) => f === fingerprintOf("b"));
      const reloaded = logLines.filter((l) => l.includes("TLS certificate reloaded")).map((l) => JSON.parse(l) as Record<string, unknown>);
      expect(reloaded).toEqual([expect.objectContaining({ level: 30, reason: "files changed", subject: "CN=gateway-b", fingerprint: fingerprintOf("b"), before: fingerprintOf("a") })]);

      // The session opened before keeps its handshake's certificate, and keeps answering.
      expect((session.socket as tls.TLSSocket).getPeerX509Certificate()!.fingerprint256).toBe(fingerprintOf("a"));
      expect(await legacyOnSession(session, gw.account)).toBe("0000");
      // New ones, HTTP/2 (ALPN h2) and HTTP/1.1, are answered under the new one.
      const fresh = http2.connect(base, { ca: [pem("b", "cert")] });
      try {
        expect(await legacyOnSession(fresh, gw.account)).toBe("0000");
        expect(fresh.alpnProtocol).toBe("h2");
      } finally {
        fresh.close();
      }
      const after = (await httpsGet(`${base}/metrics`, [pem("b", "cert")])).body;
      expect(sample(after, "gateway_tls_certificate_start_timestamp_seconds")).toBe(new X509Certificate(pem("b", "cert")).validFromDate.getTime() / 1000);
      expect(sample(after, "gateway_tls_certificate_expiry_timestamp_seconds")).toBe(new X509Certificate(pem("b", "cert")).validToDate.getTime() / 1000);
      expect(sample(after, 'gateway_tls_reloads_total{outcome="reloaded"}')).toBe(1);
      expect(sample(after, 'gateway_tls_reloads_total{outcome="refused"}')).toBe(1);

      // A file that disappears (a renewal replacing it) is refused once too, and the certificate served stays.
      rmSync(key);
      await waitFor("the missing file's log line", async () => logLines.filter((l) => l.includes("its files cannot be read")).length, (n) => n >= 1);
      expect(await servedFingerprint(gw.port)).toBe(fingerprintOf("b"));
      copyFileSync(join(dir, "b.key.pem"), key);
      await new Promise((r) => setTimeout(r, 1500));
      // Back as they were served: nothing to reload, nothing told.
      expect(logLines.filter((l) => l.includes("TLS certificate reloaded"))).toHaveLength(1);
      expect(await servedFingerprint(gw.port)).toBe(fingerprintOf("b"));

      // An expired certificate is served (a renewal may follow) and said loudly.
      writeFileSync(cert, pem("old", "cert"));
      writeFileSync(key, pem("old", "key"));
      await waitFor("the expired certificate", () => servedFingerprint(gw.port), (f) => f === fingerprintOf("old"));
      await waitFor("the warning", async () => logLines.filter((l) => l.includes("has expired")).length, (n) => n === 1);

      // No line holds a key.
      expect(logLines.join("\n")).not.toContain("PRIVATE KEY");
      for (const name of ["a", "b"]) expect(logLines.join("\n")).not.toContain(pem(name, "key").toString("utf8").split("\n")[1]!);
    } finally {
      session.close();
      await gw.close();
    }
  });

  it("a gateway without TLS shows no certificate validity (a 0 would read as expired)", async () => {
    const gw = await startGateway();
    try {
      const metrics = await (await fetch(`${gw.base}/metrics`)).text();
      expect(metrics).not.toContain("gateway_tls_certificate_start_timestamp_seconds");
      expect(metrics).not.toContain("gateway_tls_certificate_expiry_timestamp_seconds");
    } finally {
      await gw.close();
    }
  });
});

describe("gateway serve and its TLS files", () => {
  /** `gateway serve --demo` on TLS files; its output so far, and its exit. */
  function serve(env: Record<string, string>) {
    const dataDir = mkdtempSync(join(tmpdir(), "gateway-tls-serve-"));
    const child = spawn(process.execPath, [join(root, "bin", "gateway.js"), "serve", "--demo"], {
      env: { ...process.env, GATEWAY_DATA_DIR: dataDir, GATEWAY_PORT: "0", ...env },
      stdio: ["ignore", "pipe", "pipe"],
    });
    const out = { text: "" };
    child.stdout.on("data", (d: Buffer) => (out.text += d.toString()));
    child.stderr.on("data", (d: Buffer) => (out.text += d.toString()));
    const exited = new Promise<number | null>((r) => child.on("exit", r));
    return { child, out, exited, cleanup: () => (child.kill("SIGKILL"), rmSync(dataDir, { recursive: true, force: true })) };
  }

  it("reads the files again on SIGHUP, serves the new certificate to new connections and stays up", async () => {
    const cert = join(dir, "hup.cert.pem");
    const key = join(dir, "hup.key.pem");
    copyFileSync(join(dir, "a.cert.pem"), cert);
    copyFileSync(join(dir, "a.key.pem"), key);
    // Only SIGHUP reads them again.
    const gw = serve({ GATEWAY_TLS_CERT: cert, GATEWAY_TLS_KEY: key, GATEWAY_TLS_CHECK_SECONDS: "0" });
    try {
      await waitFor("the banner", async () => gw.out.text, (t) => /Demo account/.test(t), 30_000);
      const port = Number(/listening on https:\/\/127\.0\.0\.1:(\d+) /.exec(gw.out.text)![1]);
      const [, demoKey, demoSecret] = /Demo account\s+key: (\S+)\s+secret: (\S+)/.exec(gw.out.text)!;
      expect(await servedFingerprint(port)).toBe(fingerprintOf("a"));

      // Unchanged files: told, nothing else.
      gw.child.kill("SIGHUP");
      await waitFor("the unchanged line", async () => gw.out.text, (t) => t.includes("TLS certificate unchanged"));
      copyFileSync(join(dir, "b.cert.pem"), cert);
      copyFileSync(join(dir, "b.key.pem"), key);
      await new Promise((r) => setTimeout(r, 300));
      expect(await servedFingerprint(port)).toBe(fingerprintOf("a"));
      gw.child.kill("SIGHUP");
      await waitFor("the new certificate", () => servedFingerprint(port), (f) => f === fingerprintOf("b"));
      expect(gw.out.text).toContain(`"reason":"SIGHUP"`);
      const answer = await httpsGet(`https://127.0.0.1:${port}/retail/item_get/?${new URLSearchParams({ key: demoKey!, secret: demoSecret!, num_iid: demo.retailNumIid })}`, [pem("b", "cert")]);
      expect(JSON.parse(answer.body)).toMatchObject({ error_code: "0000" });
      expect(gw.child.exitCode).toBe(null);
      gw.child.kill("SIGTERM");
      expect(await gw.exited).toBe(0);
    } finally {
      gw.cleanup();
    }
  });

  it("stays up on SIGHUP with no file to read again (systemctl reload), serving, and says so", async () => {
    // Before, Node's default ended it at once (exit 129), and systemd does not restart a service a SIGHUP ended.
    const gw = serve({});
    try {
      await waitFor("the banner", async () => gw.out.text, (t) => /Demo account/.test(t), 30_000);
      const port = Number(/listening on http:\/\/127\.0\.0\.1:(\d+) /.exec(gw.out.text)![1]);
      const [, demoKey, demoSecret] = /Demo account\s+key: (\S+)\s+secret: (\S+)/.exec(gw.out.text)!;
      const call = () => fetch(`http://127.0.0.1:${port}/retail/item_get/?${new URLSearchParams({ key: demoKey!, secret: demoSecret!, num_iid: demo.retailNumIid })}`).then((r) => r.json() as Promise<{ error_code: string }>);
      // A call in flight across the signal, and one after it.
      const during = call();
      gw.child.kill("SIGHUP");
      await waitFor("the line", async () => gw.out.text, (t) => t.includes("SIGHUP: no TLS or collector certificate files are set, so there is nothing to read again; serving on"));
      expect((await during).error_code).toBe("0000");
      expect((await call()).error_code).toBe("0000");
      expect(gw.child.exitCode).toBe(null);
      gw.child.kill("SIGTERM");
      expect(await gw.exited).toBe(0);
    } finally {
      gw.cleanup();
    }
  });

  it("reads the OTLP collector's client certificate again on SIGHUP, without TLS of its own, and stays up", async () => {
    // The collector serves a's certificate and asks for a client's: a or b.
    const collector = await new HttpCollector({ cert: pem("a", "cert").toString(), key: pem("a", "key").toString(), clientCa: pem("a", "cert").toString() + pem("b", "cert").toString() }).start();
    const cert = join(dir, "otlp-client.cert.pem");
    const key = join(dir, "otlp-client.key.pem");
    copyFileSync(join(dir, "a.cert.pem"), cert);
    copyFileSync(join(dir, "a.key.pem"), key);
    const gw = serve({
      OTEL_EXPORTER_OTLP_ENDPOINT: collector.url.replace("/v1/traces", ""),
      OTEL_EXPORTER_OTLP_CERTIFICATE: join(dir, "a.cert.pem"),
      OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE: cert,
      OTEL_EXPORTER_OTLP_CLIENT_KEY: key,
      OTEL_TRACES_SAMPLER: "parentbased_always_on",
      GATEWAY_TLS_CHECK_SECONDS: "0",
    });
    try {
      await waitFor("the banner", async () => gw.out.text, (t) => /Demo account/.test(t), 30_000);
      const port = Number(/listening on http:\/\/127\.0\.0\.1:(\d+) /.exec(gw.out.text)![1]);
      const [, demoKey, demoSecret] = /Demo account\s+key: (\S+)\s+secret: (\S+)/.exec(gw.out.text)!;
      const call = () => fetch(`http://127.0.0.1:${port}/retail/item_get/?${new URLSearchParams({ key: demoKey!, secret: demoSecret!, num_iid: demo.retailNumIid })}`).then((r) => r.json());
      await call();
      await waitFor("a span shown a's certificate", async () => collector.peers, (p) => p.includes("gateway-a"));
      copyFileSync(join(dir, "b.cert.pem"), cert);
      copyFileSync(join(dir, "b.key.pem"), key);
      gw.child.kill("SIGHUP");
      await waitFor("the renewal line", async () => gw.out.text, (t) => t.includes("the OTLP collector's TLS files were read again and changed"));
      await call();
      await waitFor("a span shown b's certificate", async () => collector.peers, (p) => p.includes("gateway-b"));
      expect(gw.child.exitCode).toBe(null);
      gw.child.kill("SIGTERM");
      expect(await gw.exited).toBe(0);
      for (const name of ["a", "b"]) expect(gw.out.text).not.toContain(pem(name, "key").toString("utf8").split("\n")[1]!);
    } finally {
      gw.cleanup();
      await collector.stop();
    }
  });

  it("does not start on a certificate and a key that are not a pair: one line names the problem, no stack, no key", async () => {
    const gw = serve({ GATEWAY_TLS_CERT: join(dir, "a.cert.pem"), GATEWAY_TLS_KEY: join(dir, "b.key.pem") });
    try {
      expect(await gw.exited).toBe(2);
      const lines = gw.out.text.split("\n").filter((l) => l !== "" && !l.startsWith("{"));
      expect(lines).toEqual([expect.stringMatching(/^TLS: the certificate and key cannot serve TLS together \(key values mismatch\) \(GATEWAY_TLS_CERT .*a\.cert\.pem, GATEWAY_TLS_KEY .*b\.key\.pem\)$/)]);
      expect(gw.out.text).not.toContain("PRIVATE KEY");
    } finally {
      gw.cleanup();
    }
  });
});
