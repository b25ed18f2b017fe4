import { create, createFileRegistry, fromBinary, toBinary, type DescMessage } from "@bufbuild/protobuf";
import { FileDescriptorProtoSchema, FileDescriptorSetSchema } from "@bufbuild/protobuf/wkt";
import * as grpc from "@grpc/grpc-js";
import { execFile } from "node:child_process";
import { join } from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { HealthCheckRequestSchema, HealthCheckResponseSchema, HealthCheckResponse_ServingStatus as Serving } from "../src/gen/grpc/health/v1/health_pb.js";
import * as reflection from "../src/gen/grpc/reflection/v1alpha/reflection_pb.js";
import { adminToken, demo, legacyGet, startGateway, type GatewayFixture } from "./support/gateway-fixture.ts";
import { ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport, createGrpcWebTransport } from "@connectrpc/connect-node";
import { AdminService } from "../src/gen/gateway/admin/v1/admin_pb.js";
import type { AccessLogMode } from "../src/transports/server/access-log.ts";
import { fourDigits } from "../src/contract/error-codes.ts";
import { RetailService } from "../src/gen/gateway/catalogue/v1/retail_pb.js";
import { AccountService } from "../src/gen/gateway/account/v1/account_pb.js";
import { StatusBlockSchema } from "../src/gen/gateway/catalogue/v1/status_pb.js";
import { root } from "./support/cli.ts";
import { FakeUpstream } from "./support/fake-upstream.ts";
import { demoRecords } from "../src/catalogue/demo-dataset.ts";
import net from "node:net";
import { errorCode, rawHttp2 } from "./support/raw-http2.ts";

const run = promisify(execFile);
const bin = join(root, "node_modules", ".bin");

/** `buf curl` as an operator types it, against a server it knows nothing of but its address. */
async function bufCurl(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  try {
    const { stdout, stderr } = await run(join(bin, "buf"), ["curl", ...args], { cwd: root, timeout: 60_000 });
    return { code: 0, stdout, stderr };
  } catch (e) {
    const err = e as { code: number; stdout: string; stderr: string };
    return { code: err.code, stdout: err.stdout, stderr: err.stderr };
  }
}

/** One unary gRPC call with grpc-js, messages coded with protobuf-es. */
function grpcUnary<I extends DescMessage, O extends DescMessage>(port: number, path: string, input: I, output: O, message: object, metadata = new grpc.Metadata()): Promise<unknown> {
  const client = new grpc.Client(`127.0.0.1:${port}`, grpc.credentials.createInsecure());
  return new Promise((resolve, reject) => {
    client.makeUnaryRequest(
      path,
      (m: object) => Buffer.from(toBinary(input, create(input, m as never))),
      (b: Buffer) => fromBinary(output, b),
      message,
      metadata,
      (err, res) => {
        client.close();
        if (err) reject(err);
        else resolve(res);
      },
    );
  });
}

/** Prometheus text as samples: `name{labels}` → value. */
function samples(text: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const line of text.split("\n")) {
    if (line === "" || line.startsWith("#")) continue;
    const m = /^(\S+?(?:\{.*\})?) (\S+)$/.exec(line);
    if (m) out.set(m[1]!, Number(m[2]));
  }
  return out;
}

async function usageRows(gw: GatewayFixture): Promise<number> {
  const report = await gw.runtime.meter.query({ rows: 10_000 });
  return report.totals.reduce((n, t) => n + t.calls, 0);
}

let gw: GatewayFixture;
const logLines: string[] = [];

beforeAll(async () => {
  gw = await startGateway({ logLines, config: { metricsToken: "" } });
});
afterAll(async () => {
  await gw?.close();
});

describe("probes", () => {
  it("/healthz and /readyz answer 200 with their checks, need no key, and are neither metered nor ledgered", async () => {
    const before = await usageRows(gw);
    const live = await fetch(`${gw.base}/healthz`);
    expect(live.status).toBe(200);
    expect(await live.json()).toEqual({ status: "ok", checks: { process: { ok: true } } });
    const ready = await fetch(`${gw.base}/readyz`);
    expect(ready.status).toBe(200);
    expect(await ready.json()).toEqual({ status: "ready", checks: { draining: { ok: true }, store: { ok: true } } });
    expect((await fetch(`${gw.base}/readyz/`)).status).toBe(200);
    expect((await fetch(`${gw.base}/healthz`, { method: "HEAD" })).status).toBe(200);
    expect((await fetch(`${gw.base}/metrics`)).status).toBe(200);
    await gw.runtime.meter.flush();
    expect(await usageRows(gw)).toBe(before);
  });

  it("/readyz answers 503 naming the store when the ledger cannot be written (the disk is below its floor)", async () => {
    const full = await startGateway({ config: { minFreeMb: 1_000_000_000 } });
    try {
      const res = await fetch(`${full.base}/readyz`);
      expect(res.status).toBe(503);
      const body = (await res.json()) as { status: string; failing: string[]; checks: Record<string, { ok: boolean; reason?: string }> };
      expect(body.status).toBe("unready");
      expect(body.failing).toEqual(["store"]);
      expect(body.checks.store!.reason).toMatch(/less than \d+ MB free/);
      // Alive all the same: liveness is not readiness.
      expect((await fetch(`${full.base}/healthz`)).status).toBe(200);
    } finally {
      await full.close();
    }
  });

  it("grpc.health.v1 over real gRPC: Check overall and per service, NOT_FOUND for others, and Watch sees draining", async () => {
    const check = (service: string) => grpcUnary(gw.port, "/grpc.health.v1.Health/Check", HealthCheckRequestSchema, HealthCheckResponseSchema, { service });
    expect(((await check("")) as { status: Serving }).status).toBe(Serving.SERVING);
    expect(((await check("gateway.catalogue.v1.RetailService")) as { status: Serving }).status).toBe(Serving.SERVING);
    const err = (await check("nope.v1.Nothing").catch((e: unknown) => e)) as grpc.ServiceError;
    expect(err.code).toBe(grpc.status.NOT_FOUND);

    const watched = await startGateway();
    const client = new grpc.Client(`127.0.0.1:${watched.port}`, grpc.credentials.createInsecure());
    try {
      const seen: Serving[] = [];
      const ended = new Promise<grpc.StatusObject>((resolve) => {
        const call = client.makeServerStreamRequest(
          "/grpc.health.v1.Health/Watch",
          (m: object) => Buffer.from(toBinary(HealthCheckRequestSchema, create(HealthCheckRequestSchema, m as never))),
          (b: Buffer) => fromBinary(HealthCheckResponseSchema, b),
          { service: "" },
        );
        call.on("data", (r: { status: Serving }) => {
          seen.push(r.status);
          if (seen.length === 1) watched.runtime.readiness.drain();
        });
        call.on("status", resolve);
        call.on("error", () => {});
      });
      const status = await ended;
      expect(status.code).toBe(grpc.status.OK);
      expect(seen).toEqual([Serving.SERVING, Serving.NOT_SERVING]);
      const ready = await fetch(`${watched.base}/readyz`);
      expect(ready.status).toBe(503);
      expect(((await ready.json()) as { failing: string[] }).failing).toEqual(["draining"]);
    } finally {
      client.close();
      await watched.close();
    }
  });
});

describe("metrics", () => {
  it("counts exactly the calls made, by operation, code and transport, with cache events, auth failures and ledger batches", async () => {
    const m = await startGateway({ config: { metricsToken: "scrape-token-0123456789" } });
    try {
      expect((await fetch(`${m.base}/metrics`)).status).toBe(401);
      expect((await fetch(`${m.base}/metrics`, { headers: { authorization: "Bearer wrong" } })).status).toBe(401);
      const scrape = async () => {
        const res = await fetch(`${m.base}/metrics`, { headers: { authorization: "Bearer scrape-token-0123456789" } });
        expect(res.status).toBe(200);
        expect(res.headers.get("content-type")).toMatch(/^text\/plain; version=0\.0\.4/);
        return res.text();
      };
      const auth = { key: m.account.key, secret: m.account.secret };
      for (let i = 0; i < 5; i++) expect((await legacyGet(m.base, "/retail/item_get/", { ...auth, num_iid: demo.retailNumIid })).json.error_code).toBe("0000");
      for (let i = 0; i < 3; i++) expect((await legacyGet(m.base, "/retail/item_get/", { key: "no-such-key", secret: "x", num_iid: "1" })).json.error_code).toBe("4004");
      const connect = await fetch(`${m.base}/gateway.catalogue.v1.RetailService/ItemGet`, {
        method: "POST",
        headers: { "content-type": "application/json", "x-api-key": auth.key, "x-api-secret": auth.secret },
        body: JSON.stringify({ numIid: demo.retailNumIid }),
      });
      expect(connect.status).toBe(200);
      await legacyGet(m.base, "/nowhere/at_all/", {});
      const admin = await fetch(`${m.base}/gateway.admin.v1.AdminService/ListAccounts`, { method: "POST", headers: { "content-type": "application/json", authorization: "Bearer not-the-token" }, body: "{}" });
      expect(admin.status).toBe(401);
      await m.runtime.meter.flush();
      const text = await scrape();
      const s = samples(text);
      expect(s.get('gateway_calls_total{operation="retail/item_get",code="0000",transport="legacy"}')).toBe(5);
      expect(s.get('gateway_calls_total{operation="retail/item_get",code="4004",transport="legacy"}')).toBe(3);
      expect(s.get('gateway_calls_total{operation="retail/item_get",code="0000",transport="connect"}')).toBe(1);
      expect(s.get('gateway_calls_total{operation="",code="4010",transport="legacy"}')).toBe(1);
      expect(s.get('gateway_call_duration_seconds_count{operation="retail/item_get",transport="legacy"}')).toBe(8);
      // The embedded catalogue's answer is kept from its second request on (doorkeeper.ts): two misses, then hits.
      expect(s.get('gateway_cache_events_total{operation="retail/item_get",result="miss"}')).toBe(2);
      expect(s.get('gateway_cache_events_total{operation="retail/item_get",result="hit"}')).toBe(4);
      expect(s.get('gateway_auth_failures_total{reason="unknown_key"}')).toBe(3);
      expect(s.get('gateway_auth_failures_total{reason="admin_token"}')).toBe(1);
      expect(s.get("gateway_inflight_calls")).toBe(0);
      // One item in the cache, with its renderings: what the cache counts against its bound.
      expect(s.get("gateway_cache_bytes")).toBe(m.runtime.cache!.bytes);
      expect(s.get("gateway_cache_bytes")).toBeGreaterThan(10_000);
      // Every call has one ledger row (or refusal count), and every one went through a group commit.
      // The 6 calls of an account each have a ledger row; the 4 without one are counted per address instead.
      expect(s.get("gateway_ledger_batch_rows_sum")).toBe(6);
      expect(s.get("gateway_ledger_commit_seconds_count")).toBeGreaterThan(0);
      for (const family of ["process_cpu_seconds_total", "nodejs_heap_size_used_bytes", "nodejs_eventloop_lag_seconds"]) expect(text).toContain(`# TYPE ${family}`);
      for (const family of ["gateway_upstream_requests_total", "gateway_upstream_duration_seconds", "gateway_circuit_open"]) expect(text).toContain(`# TYPE ${family}`);
      // No account key or secret in any label.
      expect(text).not.toContain(auth.key);
      expect(text).not.toContain(auth.secret);
    } finally {
      await m.close();
    }
  });
});

describe("the embedded store's room, as metrics", () => {
  it("gives the store's size, its WAL's, the data directory's free space and the limits they are held to, measured when scraped", async () => {
    const { statSync, statfsSync } = await import("node:fs");
    const gw = await startGateway({ config: { storeMaxBytes: 50_000_000, minFreeMb: 64 } });
    try {
      expect((await legacyGet(gw.base, "/retail/item_get/", { ...gw.account, num_iid: demo.retailNumIid })).json.error_code).toBe("0000");
      const s = samples(await (await fetch(`${gw.base}/metrics`)).text());
      const db = join(gw.config.dataDir, "gateway.db");
      expect(s.get("gateway_store_bytes")).toBe(statSync(db).size);
      expect(s.get("gateway_store_wal_bytes")).toBe(statSync(`${db}-wal`).size);
      const fs = statfsSync(gw.config.dataDir);
      // Other test files write to the same disk meanwhile.
      expect(Math.abs(s.get("gateway_store_free_bytes")! - fs.bavail * fs.bsize)).toBeLessThan(0.05 * fs.bavail * fs.bsize);
      expect(s.get("gateway_store_max_bytes")).toBe(50_000_000);
      expect(s.get("gateway_store_min_free_bytes")).toBe(64 * 1_048_576);
    } finally {
      await gw.close();
    }
    // Limits not set are not shown (a 0 would read as full).
    const plain = await startGateway({ config: { minFreeMb: 0 } });
    try {
      const text = await (await fetch(`${plain.base}/metrics`)).text();
      expect(text).toContain("gateway_store_bytes ");
      expect(text).not.toContain("gateway_store_max_bytes");
      expect(text).not.toContain("gateway_store_min_free_bytes");
    } finally {
      await plain.close();
    }
  });
});

describe("gRPC server reflection", () => {
  it("buf curl lists every method with no schema, over Connect and over gRPC", async () => {
    for (const args of [[], ["--protocol", "grpc", "--http2-prior-knowledge"], ["--protocol", "grpcweb"]]) {
      const listed = await bufCurl([...args, "--list-methods", gw.base]);
      expect(listed.code, listed.stderr).toBe(0);
      const methods = listed.stdout.trim().split("\n");
      for (const m of [
        "gateway.catalogue.v1.RetailService/ItemGet",
        "gateway.catalogue.v1.WholesaleService/ItemGet",
        "gateway.catalogue.v1.WholesaleService/ItemSearchPeerbuy",
        "gateway.admin.v1.AdminService/CreateAccount",
        "grpc.health.v1.Health/Watch",
        "grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
        "grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
      ]) {
        expect(methods).toContain(m);
      }
    }
  });

  it("buf curl calls both catalogue operations knowing only the server's reflection", async () => {
    const headers = ["-H", `x-api-key: ${gw.account.key}`, "-H", `x-api-secret: ${gw.account.secret}`];
    const retail = await bufCurl([...headers, "-d", JSON.stringify({ numIid: demo.retailNumIid }), `${gw.base}/gateway.catalogue.v1.RetailService/ItemGet`]);
    expect(retail.code, retail.stderr).toBe(0);
    expect(JSON.parse(retail.stdout).item.numIid).toBe(demo.retailNumIid);
    const peerbuy = await bufCurl([
      "--protocol",
      "grpc",
      "--http2-prior-knowledge",
      ...headers,
      "-d",
      JSON.stringify({ numIid: demo.wholesaleNumIid, sid: demo.wholesaleSid }),
      `${gw.base}/gateway.catalogue.v1.WholesaleService/ItemSearchPeerbuy`,
    ]);
    expect(peerbuy.code, peerbuy.stderr).toBe(0);
    expect(JSON.parse(peerbuy.stdout).status.errorCode).toBeUndefined(); // 0 (success) is the default, left out of JSON
  });

  it("a grpc-js reflection client reads services and their files, and calls ItemGet with the reflected descriptors", async () => {
    const client = new grpc.Client(`127.0.0.1:${gw.port}`, grpc.credentials.createInsecure());
    try {
      const stream = client.makeBidiStreamRequest(
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
        (m: reflection.ServerReflectionRequest) => Buffer.from(toBinary(reflection.ServerReflectionRequestSchema, m)),
        (b: Buffer) => fromBinary(reflection.ServerReflectionResponseSchema, b),
      );
      const responses: reflection.ServerReflectionResponse[] = [];
      const done = new Promise<void>((resolve, reject) => {
        stream.on("data", (r: reflection.ServerReflectionResponse) => responses.push(r));
        stream.on("end", resolve);
        stream.on("error", reject);
      });
      const ask = (messageRequest: reflection.ServerReflectionRequest["messageRequest"]) => stream.write(create(reflection.ServerReflectionRequestSchema, { messageRequest }));
      ask({ case: "listServices", value: "" });
      ask({ case: "fileContainingSymbol", value: "gateway.catalogue.v1.RetailService" });
      ask({ case: "fileContainingSymbol", value: "gateway.catalogue.v1.RetailService.ItemGet" });
      ask({ case: "fileByFilename", value: "no/such/file.proto" });
      stream.end();
      await done;
      expect(responses).toHaveLength(4);
      const [list, file, method, missing] = responses;
      expect(list!.messageResponse.case).toBe("listServicesResponse");
      const names = (list!.messageResponse.value as reflection.ListServiceResponse).service.map((s) => s.name);
      expect(names).toEqual(expect.arrayContaining(["gateway.catalogue.v1.RetailService", "grpc.health.v1.Health"]));
      expect(missing!.messageResponse.case).toBe("errorResponse");
      expect((missing!.messageResponse.value as reflection.ErrorResponse).errorCode).toBe(grpc.status.NOT_FOUND);
      expect(method!.messageResponse.case).toBe("fileDescriptorResponse");
      // The files as a reflection client gets them: enough to build every message and call the method.
      const protos = (file!.messageResponse.value as reflection.FileDescriptorResponse).fileDescriptorProto.map((b) => fromBinary(FileDescriptorProtoSchema, b));
      expect(protos[0]!.name).toBe("gateway/catalogue/v1/retail.proto");
      const registry = createFileRegistry(create(FileDescriptorSetSchema, { file: protos.reverse() }));
      const service = registry.getService("gateway.catalogue.v1.RetailService")!;
      const itemGet = service.methods.find((m) => m.name === "ItemGet")!;
      const metadata = new grpc.Metadata();
      metadata.set("x-api-key", gw.account.key);
      metadata.set("x-api-secret", gw.account.secret);
      const res = (await grpcUnary(gw.port, "/gateway.catalogue.v1.RetailService/ItemGet", itemGet.input, itemGet.output, { numIid: demo.retailNumIid }, metadata)) as {
        item: { numIid: string };
      };
      expect(res.item.numIid).toBe(demo.retailNumIid);
    } finally {
      client.close();
    }
  });
});

describe("unknown RPC paths answer in the caller's protocol", () => {
  it("gRPC via grpc-js and buf curl: UNIMPLEMENTED (12)", async () => {
    const err = (await grpcUnary(gw.port, "/gateway.catalogue.v1.RetailService/Nope", HealthCheckRequestSchema, HealthCheckResponseSchema, {}).catch((e: unknown) => e)) as grpc.ServiceError;
    expect(err.code).toBe(grpc.status.UNIMPLEMENTED);
    const schema = join(root, "test", "fixtures", "unknown-service.proto");
    for (const protocol of [["--protocol", "grpc", "--http2-prior-knowledge"], ["--protocol", "grpcweb"], ["--protocol", "connect"]]) {
      const res = await bufCurl([...protocol, "--schema", schema, "-d", "{}", `${gw.base}/elsewhere.v1.ElsewhereService/Ping`]);
      expect(res.code, res.stderr).not.toBe(0);
      expect(JSON.parse(res.stdout || res.stderr).code).toBe("unimplemented");
    }
  });

  it("Connect: 404 with the unimplemented error JSON; gRPC-Web: grpc-status 12; legacy: still 4010", async () => {
    const connect = await fetch(`${gw.base}/gateway.catalogue.v1.RetailService/Nope`, { method: "POST", headers: { "content-type": "application/json" }, body: "{}" });
    expect(connect.status).toBe(404);
    expect(connect.headers.get("content-type")).toMatch(/^application\/json\b/);
    expect(((await connect.json()) as { code: string }).code).toBe("unimplemented");
    const web = await fetch(`${gw.base}/x.v1.Y/Z`, { method: "POST", headers: { "content-type": "application/grpc-web+proto" }, body: new Uint8Array(5) });
    expect(web.status).toBe(200);
    expect(web.headers.get("grpc-status")).toBe("12");
    const legacy = await legacyGet(gw.base, "/retail/no_such_api/", {});
    expect(legacy.json.error_code).toBe("4010");
    const legacyPost = await fetch(`${gw.base}/retail/no_such_api/`, { method: "POST", headers: { "content-type": "application/json" }, body: "{}" });
    expect(((await legacyPost.json()) as { error_code: string }).error_code).toBe("4010");
  });
});

describe("trusted proxies", () => {
  const forwardedCall = (base: string, headers: Record<string, string>, auth: { key: string; secret: string }) =>
    fetch(`${base}/retail/item_get/?${new URLSearchParams({ ...auth, num_iid: demo.retailNumIid })}`, { headers }).then((r) => r.json() as Promise<Record<string, string>>);

  it("from an untrusted peer, Forwarded and X-Forwarded-For change nothing", async () => {
    const res = await forwardedCall(gw.base, { "x-forwarded-for": "203.0.113.9", forwarded: "for=198.51.100.7" }, gw.account);
    expect(res.client_ip).toBe("127.0.0.1");
  });

  it("behind a trusted proxy the rightmost untrusted hop is the client: in client_ip, the lockout and the logs", async () => {
    const lines: string[] = [];
    const proxied = await startGateway({ logLines: lines, config: { trustedProxies: "127.0.0.1, 10.0.0.0/8", authLockAfter: 3, authSlowAfter: 100, authLockSeconds: 60 } });
    try {
      const auth = proxied.account;
      expect((await forwardedCall(proxied.base, { "x-forwarded-for": "198.51.100.1, 203.0.113.9, 10.1.2.3" }, auth)).client_ip).toBe("203.0.113.9");
      expect((await forwardedCall(proxied.base, { forwarded: 'for=198.51.100.7;proto=https, for="[2001:db8::1]:4711"' }, auth)).client_ip).toBe("2001:db8::1");
      // An RPC sees the same address.
      const rpc = await fetch(`${proxied.base}/gateway.catalogue.v1.RetailService/ItemGet`, {
        method: "POST",
        headers: { "content-type": "application/json", "x-api-key": auth.key, "x-api-secret": auth.secret, "x-forwarded-for": "192.0.2.44" },
        body: JSON.stringify({ numIid: demo.retailNumIid }),
      });
      expect(((await rpc.json()) as { status: { clientIp: string } }).status.clientIp).toBe("192.0.2.44");
      // One client's failed logins lock out that client, not everyone behind the proxy.
      const bad = { key: "no-such-key", secret: "x" };
      for (let i = 0; i < 4; i++) await forwardedCall(proxied.base, { "x-forwarded-for": "203.0.113.66" }, bad);
      expect((await forwardedCall(proxied.base, { "x-forwarded-for": "203.0.113.66" }, auth)).error_code).toBe("4008");
      expect((await forwardedCall(proxied.base, { "x-forwarded-for": "203.0.113.67" }, auth)).error_code).toBe("0000");
      const access = lines.map((l) => JSON.parse(l) as { msg: string; req?: { remoteAddress: string } }).filter((l) => l.msg === "incoming request");
      expect(access.map((l) => l.req!.remoteAddress)).toEqual(expect.arrayContaining(["203.0.113.9", "2001:db8::1", "192.0.2.44", "203.0.113.66"]));
    } finally {
      await proxied.close();
    }
  });
});

describe("logs", () => {
  it("one request id ties the access lines to the status block and the ledger row", async () => {
    logLines.length = 0;
    const res = await legacyGet(gw.base, "/retail/item_get/", { key: gw.account.key, secret: gw.account.secret, num_iid: demo.retailNumIid });
    const requestId = res.json.request_id as string;
    await gw.runtime.meter.flush();
    const lines = logLines.map((l) => JSON.parse(l) as { requestId?: string; msg: string });
    expect(lines.filter((l) => l.requestId === requestId).map((l) => l.msg)).toEqual(["incoming request", "request completed"]);
    const report = await gw.runtime.meter.query({ account: gw.account.key, rows: 100 });
    expect(report.rows.map((r) => r.requestId)).toContain(requestId);
    // Every line is JSON, and no line quotes the secret.
    expect(logLines.join("\n")).not.toContain(gw.account.secret);
  });
});

describe("the access line of a call says how it ended", () => {
  type Completed = { requestId: string; res: { statusCode: number }; errorCode?: string };
  /** The `request completed` line of the one request `send` makes (written as the answer finishes, maybe after the client has it). */
  const completedOf = async (send: () => Promise<unknown>): Promise<Completed> => {
    logLines.length = 0;
    await send();
    await expect.poll(() => logLines.some((l) => l.includes('"request completed"'))).toBe(true);
    const lines = logLines.filter((l) => l.includes('"request completed"'));
    expect(lines).toHaveLength(1);
    return JSON.parse(lines[0]!) as Completed;
  };
  const key = () => gw.account.key;
  const secret = () => gw.account.secret;

  it("with its four-digit code, which the HTTP status does not say (a legacy answer and a gRPC call are 200 whatever the code)", async () => {
    const legacy = async (path: string, params: Record<string, string>): Promise<[number, string]> => {
      let seen: [number, string] = [0, ""];
      const line = await completedOf(async () => {
        const res = await legacyGet(gw.base, path, params);
        seen = [res.status, res.json.error_code as string];
      });
      expect(line.requestId).toMatch(/./);
      expect([line.res.statusCode, line.errorCode]).toEqual(seen);
      return seen;
    };
    expect(await legacy("/retail/item_get/", { key: key(), secret: secret(), num_iid: demo.retailNumIid })).toEqual([200, "0000"]);
    expect(await legacy("/retail/item_get/", { key: key(), secret: "not-the-secret", num_iid: demo.retailNumIid })).toEqual([200, "4005"]);
    // Refused before any operation: Fastify's route for what names none.
    expect(await legacy("/retail/no_such_api/", { key: key(), secret: secret() })).toEqual([200, "4010"]);

    // gRPC: every call is HTTP 200; the code was only in the trailers.
    const transport = createGrpcTransport({ baseUrl: gw.base });
    let refused: ConnectError | undefined;
    const grpcLine = await completedOf(async () => {
      refused = await createClient(RetailService, transport)
        .itemGet({ numIid: demo.retailNumIid }, { headers: { "x-api-key": "no-such-key", "x-api-secret": "x" } })
        .then(() => undefined, ConnectError.from);
    });
    const status = refused!.findDetails(StatusBlockSchema)[0]!;
    expect([grpcLine.requestId, grpcLine.res.statusCode, grpcLine.errorCode]).toEqual([status.requestId, 200, fourDigits(status.errorCode)]);

    // Refused by connect-node before the core (a body that is not JSON), and a method this server lacks.
    const connect = (path: string, body: string) => () => fetch(`${gw.base}${path}`, { method: "POST", headers: { "content-type": "application/json" }, body }).then((r) => r.text());
    const malformed = await completedOf(connect("/gateway.catalogue.v1.RetailService/ItemGet", "{not json"));
    expect([malformed.res.statusCode, malformed.errorCode]).toEqual([400, "4003"]);
    const unknown = await completedOf(connect("/gateway.catalogue.v1.RetailService/NoSuchMethod", "{}"));
    expect([unknown.res.statusCode, unknown.errorCode]).toEqual([404, "4010"]);

    // A team's read of its own account: a refusal says its code (a failed login is a 4005 wherever it is tried); a read answered has none.
    const account = createClient(AccountService, transport);
    const ownRead = async (secret: string) => {
      let status: number | undefined;
      const line = await completedOf(async () => {
        status = await account.getMyAccount({}, { headers: { "x-api-key": key(), "x-api-secret": secret } }).then(
          () => undefined,
          (e: unknown) => ConnectError.from(e).findDetails(StatusBlockSchema)[0]!.errorCode,
        );
      });
      return [line.res.statusCode, line.errorCode, status === undefined ? undefined : fourDigits(status)];
    };
    expect(await ownRead("not-the-secret")).toEqual([200, "4005", "4005"]);
    expect(await ownRead(secret())).toEqual([200, undefined, undefined]);

    // A request that is not a call has none.
    const options = await completedOf(() => fetch(`${gw.base}/retail/item_get/`, { method: "OPTIONS" }).then((r) => r.text()));
    expect([options.res.statusCode, "errorCode" in options]).toEqual([204, false]);
  });
});

describe("GATEWAY_ACCESS_LOG: which access lines a request gets", () => {
  type Line = { msg: string; requestId?: string; errorCode?: string; rpcCode?: string; req?: { method: string; url: string; remoteAddress: string; traceId?: string }; res?: { statusCode: number } };
  type Told = { errorCode?: string; rpcCode?: string };
  const traceId = "4bf92f3577b34da6a3ce929d0e0e4736";
  const traceparent = `00-${traceId}-00f067aa0ba902b7-01`;

  /**
   * Every kind of request once, each with what its last line must say of it: on each path (the fast paths and
   * Fastify's, legacy, Connect, gRPC, gRPC-Web, connect-node's handlers), served or refused, catalogue calls and
   * the AdminService (whose refusals have an RPC code only, one of them in the middle of a stream).
   */
  const requests = (g: GatewayFixture): [string, () => Promise<unknown>, Told][] => {
    const q = (secret: string) => new URLSearchParams({ key: g.account.key, secret, num_iid: demo.retailNumIid });
    const text = (r: Response) => r.text();
    const rpc = (transport: Parameters<typeof createClient>[1], secret: string, timeoutMs?: number) =>
      createClient(RetailService, transport)
        .itemGet({ numIid: demo.retailNumIid }, { headers: { "x-api-key": g.account.key, "x-api-secret": secret, traceparent }, ...(timeoutMs ? { timeoutMs } : {}) })
        .catch(() => undefined);
    const connect = createConnectTransport({ baseUrl: g.base, httpVersion: "1.1" });
    const grpcTransport = createGrpcTransport({ baseUrl: g.base });
    const grpcWeb = createGrpcWebTransport({ baseUrl: g.base, httpVersion: "1.1" });
    const admin = (token: string) => ({ headers: { authorization: `Bearer ${token}` } });
    const adminClient = createClient(AdminService, grpcTransport);
    const watch = async () => {
      for await (const _ of adminClient.watchCalls({ cursor: "not-a-cursor" }, admin(adminToken))) break;
    };
    const refused = { errorCode: "4005", rpcCode: "unauthenticated" };
    return [
      ["legacy GET, served", () => fetch(`${g.base}/retail/item_get/?${q(g.account.secret)}`, { headers: { traceparent } }).then(text), { errorCode: "0000" }],
      ["legacy GET, a wrong secret", () => fetch(`${g.base}/retail/item_get/?${q("not-the-secret")}`).then(text), { errorCode: "4005" }],
      ["legacy POST, served", () => fetch(`${g.base}/retail/item_get/`, { method: "POST", body: q(g.account.secret) }).then(text), { errorCode: "0000" }],
      ["legacy POST, a wrong secret", () => fetch(`${g.base}/retail/item_get/`, { method: "POST", body: q("not-the-secret") }).then(text), { errorCode: "4005" }],
      ["legacy GET, no such operation", () => fetch(`${g.base}/retail/no_such_api/?${q(g.account.secret)}`).then(text), { errorCode: "4010" }],
      ["Connect, served", () => rpc(connect, g.account.secret), { errorCode: "0000" }],
      ["Connect, a wrong secret", () => rpc(connect, "not-the-secret"), refused],
      ["Connect with a timeout (connect-node's handler), a wrong secret", () => rpc(connect, "not-the-secret", 30_000), refused],
      ["gRPC, served", () => rpc(grpcTransport, g.account.secret), { errorCode: "0000" }],
      ["gRPC, a wrong secret", () => rpc(grpcTransport, "not-the-secret"), refused],
      ["gRPC-Web, a wrong secret", () => rpc(grpcWeb, "not-the-secret"), refused],
      ["AdminService over gRPC, served", () => adminClient.listAccounts({}, admin(adminToken)), {}],
      ["AdminService over gRPC, a wrong token", () => adminClient.listAccounts({}, admin("not-the-token")).catch(() => undefined), { rpcCode: "unauthenticated" }],
      ["AdminService WatchCalls over gRPC, a cursor it never gave (an error inside the stream)", () => watch().catch(() => undefined), { rpcCode: "invalid_argument" }],
      ["OPTIONS", () => fetch(`${g.base}/retail/item_get/`, { method: "OPTIONS" }).then(text), {}],
    ];
  };

  /** The access lines each request got, by its name: sent one at a time, each followed by a refused call whose line shows the lines before it are all written. */
  const accessLines = async (mode: AccessLogMode): Promise<[string, Line[], Told][]> => {
    const lines: string[] = [];
    const g = await startGateway({ logLines: lines, app: { accessLog: mode } });
    try {
      const seen: [string, Line[], Told][] = [];
      const marker = (i: number) => fetch(`${g.base}/marker/${i}/`).then((r) => r.text());
      let i = 0;
      for (const [name, send, told] of requests(g)) {
        lines.length = 0;
        await send();
        await marker(++i);
        if (mode !== "off") await expect.poll(() => lines.some((l) => l.includes(`/marker/${i}/`) && l.includes('"request completed"'))).toBe(true);
        else await new Promise((r) => setTimeout(r, 100));
        const parsed = lines.map((l) => JSON.parse(l) as Line).filter((l) => l.msg === "incoming request" || l.msg === "request completed");
        const markerIds = new Set(parsed.filter((l) => l.req?.url.startsWith("/marker/")).map((l) => l.requestId));
        seen.push([name, parsed.filter((l) => !markerIds.has(l.requestId)), told]);
      }
      return seen;
    } finally {
      await g.close();
    }
  };

  it("completed: one line per request, at its end, naming the request, its codes and its trace", async () => {
    const seen = await accessLines("completed");
    for (const [name, got, told] of seen) {
      expect(got.map((l) => l.msg), name).toEqual(["request completed"]);
      const line = got[0]!;
      expect(line.req?.remoteAddress, `${name}: ${JSON.stringify(line)}`).toBe("127.0.0.1");
      expect({ errorCode: line.errorCode, rpcCode: line.rpcCode }, name).toEqual({ errorCode: told.errorCode, rpcCode: told.rpcCode });
    }
    const line = (name: string) => seen.find(([n]) => n === name)![1][0]!;
    expect(line("legacy GET, served").req).toMatchObject({ method: "GET", traceId });
    expect(line("legacy GET, served").req!.url).toContain("secret=[redacted]");
    expect(line("legacy POST, served").req).toMatchObject({ method: "POST", url: "/retail/item_get/" });
    expect(line("gRPC, served").req).toMatchObject({ method: "POST", url: "/gateway.catalogue.v1.RetailService/ItemGet", traceId });
    expect(line("Connect, a wrong secret").res!.statusCode).toBe(401);
    expect(line("AdminService over gRPC, a wrong token").res!.statusCode).toBe(200);
  });

  it("failures: that line only for a call not served, an RPC that ended in an error, or another request refused", async () => {
    const seen = await accessLines("failures");
    const written = seen.filter(([, got]) => got.length > 0).map(([name, got]) => [name, got.map((l) => [l.msg, l.errorCode, l.rpcCode])]);
    const expected = seen
      .filter(([, , told]) => (told.errorCode !== undefined && told.errorCode !== "0000") || told.rpcCode !== undefined)
      .map(([name, , told]) => [name, [["request completed", told.errorCode, told.rpcCode]]]);
    expect(expected).toHaveLength(9);
    expect(written).toEqual(expected);
  });

  it("a caller that hangs up while its call runs has its last line too, as the call ends: 4017, callerGone, HTTP 499, on every path", async () => {
    // Before, no path wrote one (an answer its caller never took never finishes), and gRPC's was written at the
    // reset, before the call had a code: a hang-up was in the ledger and nowhere in the log, in every mode.
    const upstream = await new FakeUpstream().start();
    upstream.script = () => ({ kind: "normal", delayMs: 400 });
    const ids = demoRecords().filter((r) => r.kind === "item_detail" && r.obtainable && (r.catalogue ?? "retail") === "retail").map((r) => (r.item as { num_iid: string }).num_iid);
    try {
      for (const mode of ["both", "failures"] as const) {
        const lines: string[] = [];
        const g = await startGateway({ logLines: lines, app: { accessLog: mode }, config: { sources: "retail=upstream,wholesale=embedded", upstreamUrl: upstream.url, upstreamKey: "k", upstreamSecret: "upstream-secret-0123456789" } });
        try {
          const auth = { "x-api-key": g.account.key, "x-api-secret": g.account.secret };
          const q = (id: string) => new URLSearchParams({ key: g.account.key, secret: g.account.secret, num_iid: id });
          const rpc = (transport: Parameters<typeof createClient>[1]) => (id: string, signal: AbortSignal) => createClient(RetailService, transport).itemGet({ numIid: id }, { signal, headers: auth });
          const paths: [string, (id: string, signal: AbortSignal) => Promise<unknown>][] = [
            ["legacy GET (its fast path)", (id, signal) => fetch(`${g.base}/retail/item_get/?${q(id)}`, { signal }).then((r) => r.text())],
            ["legacy POST (Fastify's route)", (id, signal) => fetch(`${g.base}/retail/item_get/`, { method: "POST", body: q(id), signal }).then((r) => r.text())],
            ["Connect (its fast path)", rpc(createConnectTransport({ baseUrl: g.base, httpVersion: "1.1" }))],
            ["Connect GET (connect-fastify)", rpc(createConnectTransport({ baseUrl: g.base, httpVersion: "1.1", useHttpGet: true }))],
            ["gRPC-Web (connect-fastify)", rpc(createGrpcWebTransport({ baseUrl: g.base, httpVersion: "1.1" }))],
            ["gRPC (its stream path)", rpc(createGrpcTransport({ baseUrl: g.base }))],
          ];
          const got: string[] = [];
          for (const [i, [name, call]] of paths.entries()) {
            lines.length = 0;
            // An item not yet bought, so the call waits on the provider; its caller gives up 100 ms in.
            await call(ids[10 + i]!, AbortSignal.timeout(100)).catch(() => undefined);
            await expect.poll(() => lines.some((l) => l.includes('"request completed"')), { timeout: 5000 }).toBe(true);
            await new Promise((r) => setTimeout(r, 100));
            const last = lines.map((l) => JSON.parse(l) as Line & { callerGone?: boolean }).filter((l) => l.msg === "request completed");
            got.push(`${name}: ${last.map((l) => `${l.errorCode} ${l.res?.statusCode} ${l.callerGone}`).join(", ")}`);
          }
          expect(got, mode).toEqual(paths.map(([name]) => `${name}: 4017 499 true`));
        } finally {
          await g.close();
        }
      }
    } finally {
      await upstream.stop();
    }
  });

  it("a caller that goes away while its streaming request is still arriving: no error line, and its last line says so, on HTTP/2 and HTTP/1.1", async () => {
    // Before, such a caller left an error line that blamed the gateway ("an RPC failed inside the gateway": Node's
    // "Premature close" over HTTP/2, "aborted" over HTTP/1.1), and over HTTP/2 an access line as if answered whole.
    const lines: string[] = [];
    const g = await startGateway({ logLines: lines });
    // connect-fastify prints what it cannot write to stderr, past the log: "handler for rpc WatchCalls … failed".
    const printed = vi.spyOn(console, "error");
    try {
      const port = Number(new URL(g.base).port);
      // A message that promises 10 bytes and brings 1: the request is still arriving when its caller goes.
      const partial = Buffer.from([0, 0, 0, 0, 10, 8]);
      const methods = ["/gateway.admin.v1.AdminService/WatchCalls", "/grpc.health.v1.Health/Watch", "/gateway.admin.v1.AdminService/ListAccounts"];
      const cases: [string, () => Promise<void>][] = [
        ...methods.map((path): [string, () => Promise<void>] => [
          `gRPC ${path}, its stream reset`,
          async () => {
            const c = rawHttp2(port);
            await c.ready;
            c.headers(1, { ":method": "POST", ":scheme": "http", ":path": path, ":authority": "gateway", "content-type": "application/grpc", te: "trailers", authorization: `Bearer ${adminToken}` });
            c.data(1, partial);
            await new Promise((r) => setTimeout(r, 100));
            c.reset(1, errorCode.cancel);
            await new Promise((r) => setTimeout(r, 100));
            c.destroy();
          },
        ]),
        ...(
          [
            ["gRPC-Web", "application/grpc-web+proto"],
            ["Connect streaming", "application/connect+proto"],
          ] as const
        ).map(([name, type]): [string, () => Promise<void>] => [
          `${name} /gateway.admin.v1.AdminService/WatchCalls, its connection closed`,
          async () => {
            const socket = net.connect(port, "127.0.0.1");
            socket.on("error", () => {});
            socket.write(`POST /gateway.admin.v1.AdminService/WatchCalls HTTP/1.1\r\nhost: gateway\r\ncontent-type: ${type}\r\nauthorization: Bearer ${adminToken}\r\ncontent-length: 15\r\n\r\n`);
            socket.write(partial);
            await new Promise((r) => setTimeout(r, 100));
            socket.destroy();
          },
        ]),
      ];
      const got: string[] = [];
      for (const [name, send] of cases) {
        lines.length = 0;
        await send();
        await expect.poll(() => lines.some((l) => l.includes('"request completed"')), { timeout: 5000 }).toBe(true);
        await new Promise((r) => setTimeout(r, 100));
        const parsed = lines.map((l) => JSON.parse(l) as Line & { level: number; callerGone?: boolean });
        const errors = parsed.filter((l) => l.level >= 50).map((l) => l.msg);
        const last = parsed.filter((l) => l.msg === "request completed").map((l) => `${l.callerGone === true ? "callerGone" : "answered"} ${l.rpcCode ?? ""}`.trim());
        got.push(`${name}: ${[...last, ...errors].join(", ")}`);
      }
      expect(got).toEqual(cases.map(([name]) => `${name}: callerGone`));
      expect(printed.mock.calls.map((c) => String(c[0]))).toEqual([]);
    } finally {
      printed.mockRestore();
      await g.close();
    }
  });

  it("off: none; both (the default) is covered by every other access-line test", async () => {
    const seen = await accessLines("off");
    expect(seen.flatMap(([, got]) => got)).toEqual([]);
  });
});

describe("shutdown", () => {
  it("on SIGTERM readiness turns 503 first while calls are still served, then the gateway drains and exits 0", async () => {
    const { spawn } = await import("node:child_process");
    const { mkdtempSync, rmSync } = await import("node:fs");
    const { tmpdir } = await import("node:os");
    const dataDir = mkdtempSync(join(tmpdir(), "gateway-drain-"));
    const child = spawn(process.execPath, [join(root, "bin", "gateway.js"), "serve", "--demo"], {
      env: { ...process.env, GATEWAY_DATA_DIR: dataDir, GATEWAY_PORT: "0", GATEWAY_DRAIN_DELAY_MS: "1500", GATEWAY_LOG_LEVEL: "warn" },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let output = "";
    child.stdout.on("data", (d: Buffer) => (output += d.toString()));
    child.stderr.on("data", (d: Buffer) => (output += d.toString()));
    const exited = new Promise<number | null>((r) => child.on("exit", r));
    try {
      const until = Date.now() + 20_000;
      while (!/Demo account/.test(output) && Date.now() < until) await new Promise((r) => setTimeout(r, 50));
      const base = /listening on (http:\/\/\S+) /.exec(output)![1]!;
      const [, key, secret] = /Demo account\s+key: (\S+)\s+secret: (\S+)/.exec(output)!;
      expect((await fetch(`${base}/readyz`)).status).toBe(200);
      child.kill("SIGTERM");
      let ready = 200;
      while (ready === 200 && Date.now() < until) {
        await new Promise((r) => setTimeout(r, 50));
        ready = (await fetch(`${base}/readyz`)).status;
      }
      expect(ready).toBe(503);
      // Still serving while load balancers take it out: a fresh connection gets its call answered.
      const call = await legacyGet(base, "/retail/item_get/", { key: key!, secret: secret!, num_iid: demo.retailNumIid });
      expect(call.json.error_code).toBe("0000");
      expect(await exited).toBe(0);
      const lines = output.split("\n").filter((l) => l.startsWith("{")).map((l) => JSON.parse(l) as { msg: string });
      expect(lines.at(-1)!.msg).toBe("stopped");
    } finally {
      child.kill("SIGKILL");
      rmSync(dataDir, { recursive: true, force: true });
    }
  });
});

describe("shutdown, with a call in flight whose caller has hung up", () => {
  it("waits for the call on open stores: it is recorded 4017, nothing is written to a closed store, and the gateway exits 0", async () => {
    // Before, a SIGTERM closed the stores as soon as the last connection closed: a call whose caller had hung up
    // was still buying, and then wrote its row to a closed database ("database is not open", three error lines),
    // so neither the call nor what it sent the provider was in the ledger.
    const { mkdtempSync, rmSync } = await import("node:fs");
    const { tmpdir } = await import("node:os");
    const { DatabaseSync } = await import("node:sqlite");
    const { startServe, withoutSecrets } = await import("./support/gateway-process.ts");
    const dataDir = mkdtempSync(join(tmpdir(), "gateway-drain-gone-"));
    const upstream = await new FakeUpstream().start();
    upstream.script = () => ({ kind: "normal", delayMs: 600 });
    const s = await startServe({ GATEWAY_DATA_DIR: dataDir, GATEWAY_ADMIN_TOKEN: adminToken, GATEWAY_LOG_LEVEL: "info", GATEWAY_SOURCES: "retail=upstream,wholesale=embedded", GATEWAY_UPSTREAM_URL: upstream.url, GATEWAY_UPSTREAM_KEY: "k", GATEWAY_UPSTREAM_SECRET: "upstream-secret-0123456789" });
    const exited = new Promise<number | null>((r) => s.child.once("exit", r));
    try {
      const created = await fetch(`${s.base}/gateway.admin.v1.AdminService/CreateAccount`, { method: "POST", headers: { "content-type": "application/json", authorization: `Bearer ${adminToken}` }, body: JSON.stringify({ name: "drained", dailyMax: 100 }) });
      const { account, secret } = (await created.json()) as { account: { key: string }; secret: string };
      const started = Date.now();
      const call = fetch(`${s.base}/retail/item_get/?${new URLSearchParams({ key: account.key, secret, num_iid: demo.retailNumIid })}`, { signal: AbortSignal.timeout(200) }).then((r) => r.text());
      await new Promise((r) => setTimeout(r, 50));
      s.child.kill("SIGTERM");
      await expect(call).rejects.toThrow();
      expect(await exited).toBe(0);
      // It stopped once the purchase (600 ms) had ended, not when its last connection closed (200 ms).
      expect(Date.now() - started).toBeGreaterThanOrEqual(600);
      const output = withoutSecrets(s.output());
      const lines = output.split("\n").filter((l) => l.startsWith("{")).map((l) => JSON.parse(l) as { level: number; msg: string });
      expect(lines.filter((l) => l.level >= 50), output).toEqual([]);
      expect(lines.at(-1)!.msg).toBe("stopped");
      const db = new DatabaseSync(join(dataDir, "gateway.db"), { readOnly: true });
      try {
        expect(db.prepare("SELECT error_code, charge FROM ledger WHERE account = ?").all(account.key).map((r) => `${String(r.error_code)} ${String(r.charge)}`)).toEqual(["4017 uncharged"]);
      } finally {
        db.close();
      }
    } finally {
      s.child.kill("SIGKILL");
      await upstream.stop();
      rmSync(dataDir, { recursive: true, force: true });
    }
  });
});

describe("install", () => {
  const systemNode = "/usr/bin/node";
  it("bin/gateway.js started by an older system Node hands itself over to the pinned Node 24", async () => {
    let version = "";
    try {
      version = (await run(systemNode, ["--version"])).stdout.trim();
    } catch {
      return; // no system Node here: nothing older to start it with
    }
    if (Number(version.slice(1).split(".")[0]) >= 24) return;
    const { stdout } = await run(systemNode, [join(root, "bin", "gateway.js"), "--help"], { cwd: root });
    expect(stdout).toMatch(/^usage: gateway <command>/);
  });
});
