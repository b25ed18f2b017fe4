// The Connect unary fast path (unary-fast-path.ts) must be indistinguishable
// to clients from connect-node's own path. Two gateways, one with the fast
// path and one without, get the same matrix of requests; status, the headers
// that matter and the decoded bodies must match (the per-call fields of the
// status block aside: request id, times, memory, usage).
import { create, fromBinary, toBinary, type DescMessage } from "@bufbuild/protobuf";
import http from "node:http";
import http2 from "node:http2";
import { brotliDecompressSync, gunzipSync, gzipSync } from "node:zlib";
import { StatusSchema } from "../node_modules/@connectrpc/connect/dist/esm/protocol-grpc/gen/status_pb.js";
import fc from "fast-check";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { StatusBlockSchema } from "../src/gen/gateway/catalogue/v1/status_pb.js";
import { RetryInfoSchema } from "../src/gen/google/rpc/error_details_pb.js";
import { parseRate } from "../src/core/call-rate.ts";
import { operations } from "../src/operations/index.ts";
import { readBody } from "../src/transports/connect/unary-fast-path.ts";
import { fastifyHandlers } from "./support/fastify-handlers.ts";
import { adminToken, demo, legacyGet, startGateway, type GatewayFixture } from "./support/gateway-fixture.ts";
import { grpcFrame } from "./support/grpc-frame.ts";
import { GetMyAccountRequestSchema, GetMyAccountResponseSchema } from "../src/gen/gateway/account/v1/account_pb.js";
import { AdminService, GetAccountRequestSchema, GetAccountResponseSchema, WatchCallsRequestSchema, WatchCallsResponseSchema } from "../src/gen/gateway/admin/v1/admin_pb.js";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { HealthCheckRequestSchema, HealthCheckResponseSchema } from "../src/gen/grpc/health/v1/health_pb.js";
import { steadyQuota } from "./support/quota-headers.ts";

let fast: GatewayFixture;
let slow: GatewayFixture;
const maxBody = 4096;

beforeAll(async () => {
  fast = await startGateway({ app: { maxBodyBytes: maxBody } });
  slow = await startGateway({ app: { maxBodyBytes: maxBody, rpcFastPath: false } });
});
afterAll(async () => {
  await fast?.close();
  await slow?.close();
});

// Per call, and per cache entry (each gateway stored the item at its own second).
// translateTime too: a call with cache=no in another language is translated afresh, and timed.
const perCall = ["requestId", "serverTime", "executionTime", "serverMemory", "apiInfo", "secache", "secacheTime", "secacheDate", "translateTime"];
const defaults: Record<string, unknown> = { requestId: "", serverTime: "", executionTime: 0, serverMemory: "", apiInfo: "", secache: "", secacheTime: 0n, secacheDate: "", translateTime: 0 };
/** A refusal for the rate says how long to wait, to the ms: the same wait within a second on both gateways. */
const steadyWait = (text: string) => text.replace(/admitted(%20| )in(%20| )\d+(%20| )ms/, "admitted in … ms");
/** Leaves the per-call fields out of a JSON status block. */
function steadyStatus(status: Record<string, unknown> | undefined): void {
  if (status) for (const k of perCall) delete status[k];
  if (typeof status?.reason === "string") status.reason = steadyWait(status.reason);
}
/** Sets the per-call fields of a status block message to their defaults (a message keeps every field). */
function steadyMessage(status: Record<string, unknown> | undefined): void {
  if (status) for (const k of perCall) status[k] = defaults[k];
  if (typeof status?.reason === "string") status.reason = steadyWait(status.reason);
}
/** A RetryInfo detail's delay, in whole seconds rounded up (the matrix's rate-limited account waits about an hour). */
function steadyRetryInfo(value: Uint8Array): string {
  const delay = fromBinary(RetryInfoSchema, value).retryDelay!;
  return `RetryInfo ${Math.ceil(Number(delay.seconds) + delay.nanos / 1e9)} s`;
}
/**
 * The account a case calls with on each gateway: the matrix's own, or for a case over the rate a new one of
 * 1/h (each call after its first is refused for an hour less the moments since: the same whole seconds on both).
 */
async function caseAccounts(auth: Case["auth"]): Promise<Map<GatewayFixture, { key: string; secret: string }>> {
  if (auth !== "over-rate") return new Map([[fast, fast.account], [slow, slow.account]]);
  const plan = { name: "over-rate", rate: parseRate("1/h") };
  return new Map([[fast, await fast.newAccount(plan)], [slow, await slow.newAccount(plan)]]);
}

/** The answer as a client sees it, with the per-call fields left out. */
function decoded(output: DescMessage, res: { status: number; headers: Headers; body: Buffer }): unknown {
  let body = res.body;
  const encoding = res.headers.get("content-encoding");
  if (encoding === "gzip") body = gunzipSync(body);
  if (encoding === "br") body = brotliDecompressSync(body);
  const type = res.headers.get("content-type") ?? "";
  if (type === "application/proto") {
    const m = fromBinary(output, body) as unknown as { status?: Record<string, unknown> };
    steadyMessage(m.status);
    return { proto: toBinary(output, m as never) };
  }
  if (type.startsWith("application/json")) {
    const json = JSON.parse(body.toString()) as { status?: Record<string, unknown>; details?: { type: string; value: string; debug?: unknown }[]; message?: string };
    steadyStatus(json.status);
    for (const d of json.details ?? []) {
      if (d.type === RetryInfoSchema.typeName) {
        d.value = steadyRetryInfo(Buffer.from(d.value, "base64"));
        delete d.debug;
      }
      if (d.type !== StatusBlockSchema.typeName) continue;
      const s = fromBinary(StatusBlockSchema, Buffer.from(d.value, "base64")) as unknown as Record<string, unknown>;
      steadyMessage(s);
      d.value = Buffer.from(toBinary(StatusBlockSchema, s as never)).toString("base64");
      steadyStatus(d.debug as Record<string, unknown> | undefined);
    }
    if (json.message) json.message = steadyWait(json.message.replace(/request id \S+/, "request id …"));
    return json;
  }
  return body.toString("base64");
}

/** A POST with exactly these headers (fetch would add Accept-Encoding and undo the encoding). */
function raw(port: number, path: string, headers: Record<string, string>, body: Uint8Array | string): Promise<{ status: number; headers: Headers; body: Buffer; order: string[] }> {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: "127.0.0.1", port, path, method: "POST", headers }, (res) => {
      const chunks: Buffer[] = [];
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("end", () => {
        const h = new Headers();
        for (const [k, v] of Object.entries(res.headers)) if (v !== undefined) h.set(k, Array.isArray(v) ? v.join(", ") : v);
        // Every header in the order it came, the date and the length aside (the per-call fields' lengths vary).
        const order: string[] = [];
        for (let i = 0; i < res.rawHeaders.length; i += 2) {
          const name = res.rawHeaders[i]!;
          const value = name.toLowerCase() === "ratelimit" ? steadyQuota(res.rawHeaders[i + 1]!) : res.rawHeaders[i + 1];
          if (name !== "Date") order.push(name.toLowerCase() === "content-length" ? name : `${name}: ${value}`);
        }
        resolve({ status: res.statusCode!, headers: h, body: Buffer.concat(chunks), order });
      });
      res.on("error", reject);
    });
    req.on("error", reject);
    req.end(body);
  });
}

interface Case {
  readonly name: string;
  readonly contentType: string;
  readonly headers?: Record<string, string>;
  readonly body: (gw: GatewayFixture) => Uint8Array | string;
  readonly auth?: "ok" | "wrong-secret" | "none" | "over-rate";
}

describe.each(operations.map((op) => [op.id, op] as const))("%s", (id, op) => {
  const path = `/${op.service.typeName}/${op.method.name}`;
  const input = op.method.input;
  const args: Record<string, string> = id === "wholesale/item_search_peerbuy" ? { numIid: demo.wholesaleNumIid, sid: demo.wholesaleSid } : { numIid: id.startsWith("retail") ? demo.retailNumIid : demo.wholesaleNumIid };
  const proto = (a: Record<string, unknown>) => toBinary(input, create(input, a as never));
  const withUnknownField = () => Buffer.concat([proto(args), Buffer.from([0xf8, 0x3f, 0x01])]); // field 1023, varint 1
  const cases: Case[] = [
    { name: "proto", contentType: "application/proto", body: () => proto(args) },
    { name: "json", contentType: "application/json", body: () => JSON.stringify(args) },
    { name: "json with charset (declined)", contentType: "application/json; charset=utf-8", body: () => JSON.stringify(args) },
    { name: "proto, gzip accepted", contentType: "application/proto", headers: { "accept-encoding": "gzip" }, body: () => proto(args) },
    { name: "json, br then gzip accepted", contentType: "application/json", headers: { "accept-encoding": "br, gzip" }, body: () => JSON.stringify(args) },
    { name: "json, only an unknown encoding accepted", contentType: "application/json", headers: { "accept-encoding": "zstd" }, body: () => JSON.stringify(args) },
    { name: "connect-protocol-version 1", contentType: "application/proto", headers: { "connect-protocol-version": "1" }, body: () => proto(args) },
    { name: "connect-protocol-version 2 (declined)", contentType: "application/proto", headers: { "connect-protocol-version": "2" }, body: () => proto(args) },
    { name: "connect-timeout-ms (declined)", contentType: "application/json", headers: { "connect-timeout-ms": "5000" }, body: () => JSON.stringify(args) },
    { name: "proto with an unknown field", contentType: "application/proto", body: withUnknownField },
    { name: "json with an unknown field", contentType: "application/json", body: () => JSON.stringify({ ...args, notAField: 1 }) },
    { name: "malformed json", contentType: "application/json", body: () => "{not json" },
    { name: "malformed proto", contentType: "application/proto", body: () => Buffer.from([0x0a, 0xff, 0xff, 0xff]) },
    { name: "empty proto body (every argument missing)", contentType: "application/proto", body: () => new Uint8Array(0) },
    { name: "empty json body", contentType: "application/json", body: () => "" },
    { name: "oversized body", contentType: "application/json", body: () => JSON.stringify({ ...args, numIid: "1".repeat(maxBody + 10) }) },
    { name: "argument out of form (4003)", contentType: "application/json", body: () => JSON.stringify({ ...args, numIid: "abc" }) },
    { name: "no such item (2000)", contentType: "application/proto", body: () => proto({ ...args, numIid: "999999999999" }) },
    { name: "wrong secret (4005)", contentType: "application/json", body: () => JSON.stringify(args), auth: "wrong-secret" },
    { name: "no key (4014)", contentType: "application/proto", body: () => proto(args), auth: "none" },
    { name: "over the account's rate (4008, Retry-After)", contentType: "application/json", body: () => JSON.stringify(args), auth: "over-rate" },
    { name: "over the account's rate, gzip accepted", contentType: "application/proto", headers: { "accept-encoding": "gzip" }, body: () => proto(args), auth: "over-rate" },
    { name: "over the account's rate, from a browser", contentType: "application/json", headers: { origin: "https://app.example" }, body: () => JSON.stringify(args), auth: "over-rate" },
    { name: "over the account's rate, with a timeout (declined)", contentType: "application/json", headers: { "connect-timeout-ms": "5000" }, body: () => JSON.stringify(args), auth: "over-rate" },
    { name: "text/plain (415)", contentType: "text/plain", body: () => JSON.stringify(args) },
    { name: "from a browser (Origin: the fast path inside Fastify)", contentType: "application/json", headers: { origin: "https://app.example" }, body: () => JSON.stringify(args) },
    { name: "from a browser, binary", contentType: "application/proto", headers: { origin: "https://app.example", "accept-encoding": "gzip" }, body: () => proto(args) },
  ];

  it.each(cases.map((c) => [c.name, c] as const))("%s", async (_name, c) => {
    const accounts = await caseAccounts(c.auth);
    const send = async (gw: GatewayFixture) => {
      const account = accounts.get(gw)!;
      const auth: Record<string, string> = c.auth === "none" ? {} : { "x-api-key": account.key, "x-api-secret": c.auth === "wrong-secret" ? "wrong" : account.secret };
      return raw(gw.port, path, { "content-type": c.contentType, ...auth, ...c.headers }, c.body(gw));
    };
    // Each twice, so the second is a cache hit on both.
    await send(fast);
    await send(slow);
    const a = await send(fast);
    const b = await send(slow);
    expect(a.status).toBe(b.status);
    if (c.auth === "over-rate") expect([a.status, a.headers.get("retry-after")]).toEqual([429, "3600"]);
    for (const h of ["content-type", "content-encoding", "connect-content-encoding", "accept-encoding", "connect-accept-encoding", "vary", "access-control-allow-origin", "access-control-expose-headers", "retry-after"]) {
      expect(a.headers.get(h), h).toBe(b.headers.get(h));
    }
    expect(a.order).toEqual(b.order);
    expect(decoded(op.method.output, a)).toEqual(decoded(op.method.output, b));
  });
});

/**
 * A gRPC call over HTTP/2 with exactly these headers and body bytes: response headers, the DATA bytes, the
 * trailers, and whether the answer was Trailers-Only (its one HEADERS frame ended the stream).
 */
function grpcRaw(port: number, path: string, headers: Record<string, string>, body: Uint8Array): Promise<{ headers: Record<string, unknown>; body: Buffer; trailers: Record<string, unknown>; trailersOnly: boolean }> {
  return new Promise((resolve, reject) => {
    const session = http2.connect(`http://127.0.0.1:${port}`);
    session.on("error", reject);
    const stream = session.request({ ":method": "POST", ":path": path, te: "trailers", ...headers });
    let head: Record<string, unknown> = {};
    let trailers: Record<string, unknown> = {};
    let trailersOnly = false;
    const chunks: Buffer[] = [];
    stream.on("response", (h, flags) => {
      head = { ...h };
      trailersOnly = (flags & http2.constants.NGHTTP2_FLAG_END_STREAM) !== 0;
    });
    stream.on("trailers", (t) => (trailers = { ...t }));
    stream.on("data", (c: Buffer) => chunks.push(c));
    stream.on("end", () => {
      session.close();
      resolve({ headers: head, body: Buffer.concat(chunks), trailers, trailersOnly });
    });
    stream.on("error", reject);
    stream.end(body);
  });
}


/** A gRPC answer as a client sees it, with the per-call fields left out: headers and trailers that matter, the messages decoded. */
function decodedGrpc(output: DescMessage, res: { headers: Record<string, unknown>; body: Buffer; trailers: Record<string, unknown>; trailersOnly: boolean }): unknown {
  const messages: unknown[] = [];
  for (let at = 0; at + 5 <= res.body.length; ) {
    const length = res.body.readUInt32BE(at + 1);
    let data = res.body.subarray(at + 5, at + 5 + length);
    if (res.body[at] === 1) data = res.headers["grpc-encoding"] === "br" ? brotliDecompressSync(data) : gunzipSync(data);
    if (res.headers["content-type"] === "application/grpc+json") {
      const json = JSON.parse(Buffer.from(data).toString()) as { status?: Record<string, unknown> };
      steadyStatus(json.status);
      messages.push({ flags: res.body[at], json });
    } else {
      const m = fromBinary(output, data) as unknown as { status?: Record<string, unknown> };
      steadyMessage(m.status);
      messages.push({ flags: res.body[at], proto: toBinary(output, m as never) });
    }
    at += 5 + length;
  }
  // A Trailers-Only answer's status is in its headers: read as trailers, so both forms compare alike field by field.
  const fromHead = res.trailersOnly ? Object.fromEntries(Object.entries(res.headers).filter(([k]) => k.startsWith("grpc-") && k !== "grpc-encoding")) : {};
  const trailers = { ...res.trailers, ...fromHead };
  if (typeof trailers["grpc-message"] === "string") trailers["grpc-message"] = steadyWait(trailers["grpc-message"].replace(/request%20id%20\S+/, "request id …"));
  // The rate's wait to the ms: about an hour on both.
  const pushback = trailers["grpc-retry-pushback-ms"];
  if (typeof pushback === "string") trailers["grpc-retry-pushback-ms"] = `${Math.ceil(Number(pushback) / 1000)} s`;
  const details = trailers["grpc-status-details-bin"];
  if (typeof details === "string") {
    const status = fromBinary(StatusSchema, Buffer.from(details, "base64"));
    for (const d of status.details) {
      if (d.typeUrl === `type.googleapis.com/${RetryInfoSchema.typeName}`) d.value = Buffer.from(steadyRetryInfo(d.value));
      if (d.typeUrl !== `type.googleapis.com/${StatusBlockSchema.typeName}`) continue;
      const s = fromBinary(StatusBlockSchema, d.value) as unknown as Record<string, unknown>;
      steadyMessage(s);
      d.value = toBinary(StatusBlockSchema, s as never);
    }
    status.message = steadyWait(status.message.replace(/request id \S+/, "request id …"));
    trailers["grpc-status-details-bin"] = Buffer.from(toBinary(StatusSchema, status)).toString("base64");
  }
  const headers = Object.fromEntries(Object.entries(res.headers).filter(([k]) => k !== "date" && !(k in fromHead)));
  for (const fields of [headers, trailers]) if (typeof fields.ratelimit === "string") fields.ratelimit = steadyQuota(fields.ratelimit);
  return { trailersOnly: res.trailersOnly, headers, messages, trailers };
}

describe.each(operations.map((op) => [op.id, op] as const))("%s over gRPC (HTTP/2)", (id, op) => {
  const path = `/${op.service.typeName}/${op.method.name}`;
  const input = op.method.input;
  const args: Record<string, string> = id === "wholesale/item_search_peerbuy" ? { numIid: demo.wholesaleNumIid, sid: demo.wholesaleSid } : { numIid: id.startsWith("retail") ? demo.retailNumIid : demo.wholesaleNumIid };
  const proto = (a: Record<string, unknown>) => toBinary(input, create(input, a as never));
  const cases: (Omit<Case, "body" | "contentType"> & { contentType?: string; body: () => Uint8Array })[] = [
    { name: "application/grpc", body: () => grpcFrame(proto(args)) },
    { name: "application/grpc+proto", contentType: "application/grpc+proto", body: () => grpcFrame(proto(args)) },
    { name: "application/grpc+json (declined)", contentType: "application/grpc+json", body: () => grpcFrame(Buffer.from(JSON.stringify(args))) },
    { name: "gzip and deflate accepted, as grpc-js asks", headers: { "grpc-accept-encoding": "identity,deflate,gzip" }, body: () => grpcFrame(proto(args)) },
    { name: "br accepted first", headers: { "grpc-accept-encoding": "br,gzip" }, body: () => grpcFrame(proto(args)) },
    { name: "only an unknown encoding accepted", headers: { "grpc-accept-encoding": "snappy" }, body: () => grpcFrame(proto(args)) },
    { name: "grpc-encoding identity", headers: { "grpc-encoding": "identity" }, body: () => grpcFrame(proto(args)) },
    { name: "gzip-compressed request (declined)", headers: { "grpc-encoding": "gzip" }, body: () => grpcFrame(Buffer.from(gzipSync(proto(args))), 1) },
    { name: "grpc-timeout (declined)", headers: { "grpc-timeout": "5S" }, body: () => grpcFrame(proto(args)) },
    { name: "with an Origin (declined: CORS answers it)", headers: { origin: "https://app.example" }, body: () => grpcFrame(proto(args)) },
    { name: "an unknown field", body: () => grpcFrame(Buffer.concat([proto(args), Buffer.from([0xf8, 0x3f, 0x01])])) },
    { name: "malformed message", body: () => grpcFrame(Buffer.from([0x0a, 0xff, 0xff, 0xff])) },
    { name: "compressed flag without grpc-encoding", body: () => grpcFrame(proto(args), 1) },
    { name: "frame shorter than its prefix says", body: () => grpcFrame(proto(args)).subarray(0, 8) },
    { name: "two messages in a unary call", body: () => Buffer.concat([grpcFrame(proto(args)), grpcFrame(proto(args))]) },
    { name: "no message at all", body: () => new Uint8Array(0) },
    { name: "empty message (every argument missing)", body: () => grpcFrame(new Uint8Array(0)) },
    { name: "oversized message", body: () => grpcFrame(proto({ ...args, numIid: "1".repeat(maxBody + 10) })) },
    { name: "argument out of form (4003)", body: () => grpcFrame(proto({ ...args, numIid: "abc" })) },
    { name: "no such item (2000)", body: () => grpcFrame(proto({ ...args, numIid: "999999999999" })) },
    { name: "wrong secret (4005)", body: () => grpcFrame(proto(args)), auth: "wrong-secret" },
    { name: "no key (4014)", body: () => grpcFrame(proto(args)), auth: "none" },
    { name: "over the account's rate (4008, grpc-retry-pushback-ms)", body: () => grpcFrame(proto(args)), auth: "over-rate" },
    { name: "over the account's rate, with a timeout (declined)", headers: { "grpc-timeout": "5S" }, body: () => grpcFrame(proto(args)), auth: "over-rate" },
  ];

  it.each(cases.map((c) => [c.name, c] as const))("%s", async (_name, c) => {
    const accounts = await caseAccounts(c.auth);
    const send = async (gw: GatewayFixture) => {
      const account = accounts.get(gw)!;
      const auth: Record<string, string> = c.auth === "none" ? {} : { "x-api-key": account.key, "x-api-secret": c.auth === "wrong-secret" ? "wrong" : account.secret };
      return grpcRaw(gw.port, path, { "content-type": c.contentType ?? "application/grpc", ...auth, ...c.headers }, c.body());
    };
    await send(fast);
    await send(slow);
    const a = await send(fast);
    const b = await send(slow);
    // An error answers Trailers-Only (a retry policy may retry nothing else), a message with headers and trailers.
    expect(a.trailersOnly).toBe(a.body.length === 0);
    if (c.auth === "over-rate") expect([a.trailersOnly, a.headers["grpc-status"], a.headers["grpc-retry-pushback-ms"]]).toEqual([true, "8", expect.stringMatching(/^3[56]\d{5}$/)]);
    expect(decodedGrpc(op.method.output, a)).toEqual(decodedGrpc(op.method.output, b));
  });
});

describe("the other services' gRPC unary calls, served on the stream path by their own handlers", () => {
  // Against the gateway without the fast paths, where connect-fastify answers them: the same answers, but an error
  // Trailers-Only (a retry policy may retry nothing else), where connect-fastify sends its headers first.
  const me = (gw: GatewayFixture) => ({ "x-api-key": gw.account.key, "x-api-secret": gw.account.secret });
  const account = { input: GetMyAccountRequestSchema, output: GetMyAccountResponseSchema, path: "/gateway.account.v1.AccountService/GetMyAccount" };
  const admin = { input: GetAccountRequestSchema, output: GetAccountResponseSchema, path: "/gateway.admin.v1.AdminService/GetAccount" };
  const health = { input: HealthCheckRequestSchema, output: HealthCheckResponseSchema, path: "/grpc.health.v1.Health/Check" };
  type Method = typeof account | typeof admin | typeof health;
  const empty = () => grpcFrame(new Uint8Array(0));
  const cases: { name: string; method: Method; headers: (gw: GatewayFixture) => Record<string, string>; body: (gw: GatewayFixture) => Uint8Array }[] = [
    { name: "GetMyAccount", method: account, headers: me, body: empty },
    { name: "GetMyAccount, application/grpc+json", method: account, headers: (gw) => ({ ...me(gw), "content-type": "application/grpc+json" }), body: () => grpcFrame(Buffer.from("{}")) },
    { name: "GetMyAccount with grpc-timeout", method: account, headers: (gw) => ({ ...me(gw), "grpc-timeout": "5S" }), body: empty },
    { name: "GetMyAccount, gzip-compressed request", method: account, headers: (gw) => ({ ...me(gw), "grpc-encoding": "gzip" }), body: () => grpcFrame(Buffer.from(gzipSync(new Uint8Array(0))), 1) },
    { name: "GetMyAccount with an Origin (not taken)", method: account, headers: (gw) => ({ ...me(gw), origin: "https://app.example" }), body: empty },
    { name: "GetMyAccount, wrong secret (4005)", method: account, headers: (gw) => ({ ...me(gw), "x-api-secret": "wrong" }), body: empty },
    { name: "GetMyAccount, no key (4014)", method: account, headers: () => ({}), body: empty },
    { name: "GetMyAccount, malformed message", method: account, headers: me, body: () => grpcFrame(Buffer.from([0x0a, 0xff, 0xff, 0xff])) },
    { name: "GetMyAccount, two messages", method: account, headers: me, body: () => Buffer.concat([empty(), empty()]) },
    { name: "GetMyAccount, oversized message", method: account, headers: me, body: () => grpcFrame(Buffer.concat([Buffer.from([0xfa, 0x3f]), Buffer.from([0x80, 0x40]), Buffer.alloc(8192)])) },
    { name: "GetAccount without an admin token", method: admin, headers: () => ({}), body: (gw) => grpcFrame(toBinary(GetAccountRequestSchema, create(GetAccountRequestSchema, { key: gw.account.key }))) },
    { name: "GetAccount", method: admin, headers: () => ({ authorization: `Bearer ${adminToken}` }), body: (gw) => grpcFrame(toBinary(GetAccountRequestSchema, create(GetAccountRequestSchema, { key: gw.account.key }))) },
    { name: "health of the AccountService", method: health, headers: () => ({}), body: () => grpcFrame(toBinary(HealthCheckRequestSchema, create(HealthCheckRequestSchema, { service: "gateway.account.v1.AccountService" }))) },
    { name: "health of no such service", method: health, headers: () => ({}), body: () => grpcFrame(toBinary(HealthCheckRequestSchema, create(HealthCheckRequestSchema, { service: "no.such.Service" }))) },
  ];

  /** The answer with what differs between two gateways by nature left out: the account's key and times, the request id. */
  const steady = (method: Method, res: Awaited<ReturnType<typeof grpcRaw>>) => {
    const messages: unknown[] = [];
    for (let at = 0; at + 5 <= res.body.length; at += 5 + res.body.readUInt32BE(at + 1)) {
      const data = res.body.subarray(at + 5, at + 5 + res.body.readUInt32BE(at + 1));
      const message = (res.headers["content-type"] === "application/grpc+json" ? JSON.parse(data.toString()) : fromBinary(method.output, data)) as Record<string, unknown>;
      const inner = (message.account ?? message) as Record<string, unknown>;
      for (const k of ["key", "requestId", "createdAtMs"]) if (k in inner) inner[k] = "";
      messages.push({ flags: res.body[at], message });
    }
    // Headers and trailers as decodedGrpc reads them (a Trailers-Only status from the headers), the messages apart.
    const decoded = decodedGrpc(method.output, { ...res, body: Buffer.alloc(0) }) as { trailersOnly?: boolean; trailers: Record<string, unknown> };
    delete decoded.trailersOnly;
    return { ...decoded, trailers: Object.fromEntries(Object.entries(decoded.trailers)), messages };
  };

  it.each(cases.map((c) => [c.name, c] as const))("%s", async (_name, c) => {
    const send = (gw: GatewayFixture) => grpcRaw(gw.port, c.method.path, { "content-type": "application/grpc", ...c.headers(gw) }, c.body(gw));
    const a = await send(fast);
    const b = await send(slow);
    expect(a.trailersOnly).toBe(a.body.length === 0);
    expect(steady(c.method, a)).toEqual(steady(c.method, b));
  });
});

describe("the other services' gRPC server-streaming calls, served on the stream path by their own handlers", () => {
  // A stream refused before its first message (a missing token, a cursor that is not one) is an immediate error: Trailers-Only,
  // so a client's retry policy may retry it (gRFC A6 retries a stream only while nothing of its answer has come).
  const watch = "/gateway.admin.v1.AdminService/WatchCalls";
  const token = { authorization: `Bearer ${adminToken}` };
  const frame = (cursor: string) => grpcFrame(toBinary(WatchCallsRequestSchema, create(WatchCallsRequestSchema, { cursor })));
  const cases: { name: string; headers: Record<string, string>; body: Uint8Array }[] = [
    { name: "WatchCalls without an admin token", headers: {}, body: frame("") },
    { name: "WatchCalls with a wrong admin token", headers: { authorization: "Bearer wrong" }, body: frame("") },
    { name: "WatchCalls from a cursor that is not one", headers: token, body: frame("not-a-cursor") },
    { name: "WatchCalls, malformed message", headers: token, body: grpcFrame(Buffer.from([0x0a, 0xff, 0xff, 0xff])) },
    { name: "WatchCalls, two messages", headers: token, body: Buffer.concat([frame(""), frame("")]) },
    { name: "WatchCalls, gzip-compressed request from a bad cursor", headers: { ...token, "grpc-encoding": "gzip" }, body: grpcFrame(Buffer.from(gzipSync(toBinary(WatchCallsRequestSchema, create(WatchCallsRequestSchema, { cursor: "x" })))), 1) },
  ];
  it.each(cases.map((c) => [c.name, c] as const))("%s: Trailers-Only, with connect-fastify's status and message", async (_name, c) => {
    const send = (gw: GatewayFixture) => grpcRaw(gw.port, watch, { "content-type": "application/grpc", ...c.headers }, c.body);
    const a = await send(fast);
    const b = await send(slow);
    expect([a.trailersOnly, a.body.length]).toEqual([true, 0]);
    expect(a.headers["grpc-status"]).not.toBe("0");
    // The same status, message and details as connect-fastify's, which sends its headers first.
    const steady = (res: typeof a) => {
      const decoded = decodedGrpc(WatchCallsResponseSchema, res) as { trailers: Record<string, unknown> };
      return { ...decoded, trailers: Object.fromEntries(Object.entries(decoded.trailers)), trailersOnly: undefined };
    };
    expect(b.trailersOnly).toBe(false);
    expect(steady(a)).toEqual(steady(b));
  });

  it("a watch that runs is served there too: its messages as calls commit, and its end when the caller cancels", async () => {
    const admin = createClient(AdminService, createGrpcTransport({ baseUrl: fast.base }));
    const abort = new AbortController();
    const { result: handled, handled: byFastify } = await fastifyHandlers(async () => {
      const it = admin.watchCalls({ cursor: (await admin.followCalls({ pageSize: 10_000 }, { headers: token })).cursor }, { headers: token, signal: abort.signal })[Symbol.asyncIterator]();
      // The first message at once, with what committed since the cursor: nothing.
      const first = await it.next();
      expect(first.value?.calls).toEqual([]);
      // A call committed now reaches the stream.
      const call = await legacyGet(fast.base, "/retail/item_get/", { key: fast.account.key, secret: fast.account.secret, num_iid: demo.retailNumIid });
      let seen: string[] = [];
      while (seen.length === 0) seen = ((await it.next()).value?.calls ?? []).map((r: { requestId: string }) => r.requestId);
      expect(seen).toEqual([call.json.request_id]);
      abort.abort();
      await it.next().catch(() => undefined);
      return seen.length;
    });
    // No Fastify route ran: not the watch's, nor FollowCalls' (the stream path), nor the legacy call's (its fast path).
    expect([handled, byFastify]).toEqual([1, 0]);
    // The caller gone, its stream is closed on the server: none left open.
    const open = async () => (await admin.getConnections({}, { headers: token })).http2Streams;
    let streams = await open();
    for (let tries = 0; tries < 100 && streams > 1n; tries++) streams = await new Promise((r) => setTimeout(r, 20)).then(open);
    expect(streams).toBe(1n); // GetConnections' own
  });
});

describe("the fast path is the one answering", () => {
  it("a cached binary answer comes from the fast path: its ledger row says connect and its bytes follow the entry's layout", async () => {
    const op = operations.find((o) => o.id === "retail/item_get")!;
    const path = `/${op.service.typeName}/${op.method.name}`;
    const body = toBinary(op.method.input, create(op.method.input, { numIid: demo.retailNumIid } as never));
    const headers = { "content-type": "application/proto", "x-api-key": fast.account.key, "x-api-secret": fast.account.secret };
    await fetch(`${fast.base}${path}`, { method: "POST", headers, body });
    const res = await fetch(`${fast.base}${path}`, { method: "POST", headers, body });
    const bytes = new Uint8Array(await res.arrayBuffer());
    expect(bytes[0]).toBe((2 << 3) | 2); // status first, then the cached item bytes
    await fast.runtime.meter.flush();
    const rows = (await fast.runtime.meter.query({ account: fast.account.key, rows: 1000 })).rows;
    expect(rows.some((r) => r.transport === "connect" && r.cacheHit)).toBe(true);
  });
});

/** An access line with what differs from call to call left out. */
function steadyLine(line: string): Record<string, unknown> {
  const { time: _t, pid: _p, hostname: _h, requestId, responseTime, ...rest } = JSON.parse(line) as Record<string, unknown>;
  return { ...rest, requestId: typeof requestId, responseTime: typeof responseTime };
}

describe("the gRPC fast path, beside Fastify's", () => {
  // A second pair, with what the stream path must take from the app: CORS with a list of origins
  // (Vary, no Allow-Origin without Origin), a trusted proxy's forwarded address, the access log.
  const fastLines: string[] = [];
  const slowLines: string[] = [];
  let fastApp: GatewayFixture;
  let slowApp: GatewayFixture;
  const app = { maxBodyBytes: maxBody, corsOrigins: ["https://app.example"], trustedProxies: ["127.0.0.1"] };
  beforeAll(async () => {
    fastApp = await startGateway({ app, logLines: fastLines });
    slowApp = await startGateway({ app: { ...app, rpcFastPath: false }, logLines: slowLines });
  });
  afterAll(async () => {
    await fastApp?.close();
    await slowApp?.close();
  });
  const op = operations.find((o) => o.id === "retail/item_get")!;
  const path = `/${op.service.typeName}/${op.method.name}`;
  const request = grpcFrame(toBinary(op.method.input, create(op.method.input, { numIid: demo.retailNumIid } as never)));
  const call = (gw: GatewayFixture, headers: Record<string, string> = {}, body: Uint8Array = request) =>
    grpcRaw(gw.port, path, { "content-type": "application/grpc", "x-api-key": gw.account.key, "x-api-secret": gw.account.secret, ...headers }, body);

  it("answers on the stream itself: no Fastify handler runs for a call it serves, one does for a call it declines", async () => {
    const handlers = async (gw: GatewayFixture, headers: Record<string, string> = {}) => {
      const { result, handled } = await fastifyHandlers(() => call(gw, headers));
      expect(result.trailers["grpc-status"]).toBe("0");
      return handled;
    };
    expect(await handlers(fast)).toBe(0);
    expect(await handlers(slow)).toBe(1);
    expect(await handlers(fast, { "grpc-timeout": "5S" })).toBe(1);
    expect(await handlers(fast, { origin: "https://app.example" })).toBe(1);
    // An operator's switch: GATEWAY_RPC_FAST_PATH=off sends every call through Fastify and connect-node.
    const off = await startGateway({ config: { rpcFastPath: "off" } });
    try {
      expect(await handlers(off)).toBe(1);
    } finally {
      await off.close();
    }
  });

  it("sends the headers CORS adds with a list of origins, and the same answers otherwise", async () => {
    for (const [headers, body] of [
      [{}, request],
      [{ "grpc-accept-encoding": "gzip" }, request],
      [{}, grpcFrame(Buffer.from([0x0a, 0xff, 0xff, 0xff]))],
      [{ origin: "https://app.example" }, request],
    ] as const) {
      await call(fastApp, headers, body);
      await call(slowApp, headers, body);
      const a = await call(fastApp, headers, body);
      const b = await call(slowApp, headers, body);
      expect(a.headers.vary).toBe("Origin");
      expect(decodedGrpc(op.method.output, a)).toEqual(decodedGrpc(op.method.output, b));
    }
  });

  it("writes the same access lines, with the request id the ledger row has and the forwarded address", async () => {
    const forwarded = { "x-forwarded-for": "203.0.113.9" };
    const lines = async (gw: GatewayFixture, out: string[]) => {
      out.length = 0;
      await call(gw, forwarded);
      // The completion line follows the stream's close, a moment after the client has its answer.
      await expect.poll(() => out.filter((l) => l.includes('"request completed"')).length).toBe(1);
      return out.filter((l) => l.includes('"incoming request"') || l.includes('"request completed"'));
    };
    const a = await lines(fastApp, fastLines);
    const b = await lines(slowApp, slowLines);
    expect(a.map(steadyLine)).toEqual(b.map(steadyLine));
    expect(a.map(steadyLine)[0]).toMatchObject({ req: { method: "POST", url: path, remoteAddress: "203.0.113.9" }, msg: "incoming request" });
    const requestId = (JSON.parse(a[0]!) as { requestId: string }).requestId;
    expect((JSON.parse(a[1]!) as { requestId: string }).requestId).toBe(requestId);
    await fastApp.runtime.meter.flush();
    const rows = (await fastApp.runtime.meter.query({ account: fastApp.account.key, rows: 1000 })).rows;
    expect(rows.find((r) => r.requestId === requestId)).toMatchObject({ transport: "grpc" });
  });

  const connectCall = (gw: GatewayFixture, headers: Record<string, string> = {}) =>
    raw(gw.port, path, { "content-type": "application/proto", "x-api-key": gw.account.key, "x-api-secret": gw.account.secret, ...headers }, toBinary(op.method.input, create(op.method.input, { numIid: demo.retailNumIid } as never)));

  it("serves Connect unary calls without Origin before Fastify, and the rest through it", async () => {
    const handlers = async (gw: GatewayFixture, headers: Record<string, string> = {}) => {
      const { result, handled } = await fastifyHandlers(() => connectCall(gw, headers));
      expect(result.status).toBe(200);
      return handled;
    };
    expect(await handlers(fastApp)).toBe(0);
    expect(await handlers(slowApp)).toBe(1);
    expect(await handlers(fastApp, { origin: "https://app.example" })).toBe(1);
    expect(await handlers(fastApp, { "connect-timeout-ms": "5000" })).toBe(1);
  });

  it("writes the same Connect answers and access lines, with the forwarded address and the CORS headers of a list of origins", async () => {
    const forwarded = { "x-forwarded-for": "203.0.113.9", "accept-encoding": "gzip" };
    const lines = async (gw: GatewayFixture, out: string[]) => {
      out.length = 0;
      const res = await connectCall(gw, forwarded);
      await expect.poll(() => out.filter((l) => l.includes('"request completed"')).length).toBe(1);
      return { res, lines: out.filter((l) => l.includes('"incoming request"') || l.includes('"request completed"')) };
    };
    const a = await lines(fastApp, fastLines);
    const b = await lines(slowApp, slowLines);
    expect(a.res.order).toEqual(b.res.order);
    expect(a.res.headers.get("vary")).toBe("Origin");
    expect(decoded(op.method.output, a.res)).toEqual(decoded(op.method.output, b.res));
    expect(a.lines.map(steadyLine)).toEqual(b.lines.map(steadyLine));
    expect(a.lines.map(steadyLine)[0]).toMatchObject({ req: { method: "POST", url: path, remoteAddress: "203.0.113.9" }, msg: "incoming request" });
    const requestId = (JSON.parse(a.lines[0]!) as { requestId: string }).requestId;
    await fastApp.runtime.meter.flush();
    const rows = (await fastApp.runtime.meter.query({ account: fastApp.account.key, rows: 1000 })).rows;
    expect(rows.find((r) => r.requestId === requestId)).toMatchObject({ transport: "connect" });
  });

  it("a Connect caller that hangs up before its body ends costs nothing and breaks nothing", async () => {
    const socket = (await import("node:net")).connect(fast.port, "127.0.0.1");
    await new Promise((resolve) => socket.once("connect", resolve));
    socket.write(`POST ${path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/proto\r\ncontent-length: 100\r\nx-api-key: ${fast.account.key}\r\n\r\nab`);
    await new Promise((resolve) => setTimeout(resolve, 50));
    socket.destroy();
    const res = await connectCall(fast);
    expect(res.status).toBe(200);
  });

  it("a Connect call over HTTP/2 (through Fastify) reset before its body ends costs nothing and breaks nothing", async () => {
    await fast.runtime.meter.flush();
    const rows = async () => (await fast.runtime.meter.query({ account: fast.account.key, rows: 100_000 })).rows.length;
    const before = await rows();
    const session = http2.connect(`http://127.0.0.1:${fast.port}`);
    await new Promise((resolve) => session.once("connect", resolve));
    const body = toBinary(op.method.input, create(op.method.input, { numIid: demo.retailNumIid } as never));
    const stream = session.request({ ":method": "POST", ":path": path, "content-type": "application/proto", "content-length": String(body.length), "x-api-key": fast.account.key, "x-api-secret": fast.account.secret });
    stream.on("error", () => {});
    stream.write(body.subarray(0, 3));
    await new Promise((resolve) => setTimeout(resolve, 50));
    stream.close(http2.constants.NGHTTP2_CANCEL);
    await new Promise((resolve) => stream.once("close", resolve));
    // And one reset as soon as it is sent: its head and its reset come in one read, before Fastify
    // hands the request to the route.
    const early = session.request({ ":method": "POST", ":path": path, "content-type": "application/proto", "content-length": String(body.length), "x-api-key": fast.account.key, "x-api-secret": fast.account.secret });
    early.on("error", () => {});
    early.close(http2.constants.NGHTTP2_CANCEL);
    await new Promise((resolve) => early.once("close", resolve));
    await new Promise((resolve) => setTimeout(resolve, 100));
    session.close();
    // Whole, the same call is answered and charged once.
    const res = await connectCall(fast);
    expect(res.status).toBe(200);
    await fast.runtime.meter.flush();
    expect(await rows()).toBe(before + 1);
  });

  it("a stream the caller resets before its body ends costs nothing and breaks nothing", async () => {
    const session = http2.connect(`http://127.0.0.1:${fast.port}`);
    await new Promise((resolve) => session.once("connect", resolve));
    const stream = session.request({ ":method": "POST", ":path": path, "content-type": "application/grpc", te: "trailers", "x-api-key": fast.account.key, "x-api-secret": fast.account.secret });
    stream.on("error", () => {});
    stream.write(request.subarray(0, 3));
    await new Promise((resolve) => setTimeout(resolve, 50));
    stream.close(http2.constants.NGHTTP2_CANCEL);
    await new Promise((resolve) => stream.once("close", resolve));
    session.close();
    const res = await call(fast);
    expect(res.trailers["grpc-status"]).toBe("0");
  });
});

const seed = Number(process.env.FUZZ_SEED ?? Date.now() % 2_147_483_647);

describe(`random gRPC calls, answered on the stream and by connect-node alike (fast-check seed ${seed}; rerun with FUZZ_SEED=${seed})`, () => {
  const op = operations.find((o) => o.id === "retail/item_get")!;
  const path = `/${op.service.typeName}/${op.method.name}`;
  const message = fc
    .record({ numIid: fc.oneof(fc.constant(demo.retailNumIid), fc.stringMatching(/^[0-9]{0,13}$/), fc.string({ maxLength: 14 })), isPromotion: fc.constantFrom("", "0", "1", "yes"), cache: fc.integer({ min: -1, max: 4 }), lang: fc.integer({ min: -1, max: 5 }) })
    .map((m) => Buffer.from(toBinary(op.method.input, create(op.method.input, { ...m, numIid: m.numIid.toWellFormed() } as never))));
  /** A body: one frame of a message, or of random bytes; a frame whose flag or length lies; two frames; or bytes with no framing at all. */
  const body = fc.oneof(
    { weight: 4, arbitrary: message.map((m) => grpcFrame(m)) },
    { weight: 1, arbitrary: fc.uint8Array({ maxLength: 40 }).map((b) => grpcFrame(b)) },
    { weight: 1, arbitrary: fc.tuple(message, fc.integer({ min: 0, max: 3 }), fc.integer({ min: -3, max: 3 })).map(([m, flags, skew]) => {
      const f = grpcFrame(m, flags);
      f.writeUInt32BE(Math.max(0, m.length + skew), 1);
      return f;
    }) },
    { weight: 1, arbitrary: fc.tuple(message, message).map(([a, b]) => Buffer.concat([grpcFrame(a), grpcFrame(b)])) },
    { weight: 1, arbitrary: fc.uint8Array({ maxLength: 12 }).map((b) => Buffer.from(b)) },
  );
  const call = fc.record({
    body,
    contentType: fc.constantFrom("application/grpc", "application/grpc+proto"),
    encoding: fc.constantFrom(undefined, "identity"),
    accept: fc.constantFrom(undefined, "gzip", "identity,deflate,gzip", "br", "snappy"),
    auth: fc.constantFrom("ok", "ok", "ok", "none"),
  });

  it("gives the same headers, messages and trailers for 60 generated calls", async () => {
    // Accounts of their own, so the quota of the matrix's account is not this test's concern.
    const accounts = new Map([[fast, await fast.newAccount({ name: "fuzz" })], [slow, await slow.newAccount({ name: "fuzz" })]]);
    for (const c of fc.sample(call, { numRuns: 60, seed })) {
      const send = (gw: GatewayFixture) => {
        const account = accounts.get(gw)!;
        const headers: Record<string, string> = { "content-type": c.contentType };
        if (c.auth === "ok") Object.assign(headers, { "x-api-key": account.key, "x-api-secret": account.secret });
        if (c.encoding !== undefined) headers["grpc-encoding"] = c.encoding;
        if (c.accept !== undefined) headers["grpc-accept-encoding"] = c.accept;
        return grpcRaw(gw.port, path, headers, c.body);
      };
      // Twice each, so both answer the second from their caches.
      await send(fast);
      await send(slow);
      const a = await send(fast);
      const b = await send(slow);
      expect(decodedGrpc(op.method.output, a), JSON.stringify({ ...c, body: Buffer.from(c.body).toString("hex") })).toEqual(decodedGrpc(op.method.output, b));
    }
  }, 60_000);
});

describe("the request body as the fast paths read it (readBody), on a real node:http server", () => {
  type Seen = { bytes?: string; over?: string; error?: string; dataListeners: number };
  let server: http.Server;
  let port: number;
  const seen: Seen[] = [];
  /** Told when the server has a request's head (its 'request' event), so the rest can be sent after it, in a read of its own. */
  let headArrived: () => void = () => {};
  beforeAll(async () => {
    server = http.createServer((req, res) => {
      headArrived();
      // Count the 'data' listeners readBody adds: none when it takes a whole body at once.
      let dataListeners = 0;
      const on = req.on.bind(req);
      req.on = ((event: string, listener: (...a: unknown[]) => void) => {
        if (event === "data") dataListeners++;
        return on(event, listener);
      }) as typeof req.on;
      readBody(req, 16).then(
        async (r) => {
          let over: string | undefined;
          if ("over" in r) {
            over = "";
            for await (const chunk of r.over) over += Buffer.from(chunk).toString();
          }
          seen.push({ ...("bytes" in r ? { bytes: Buffer.from(r.bytes).toString() } : { over }), dataListeners });
          res.end("ok");
        },
        (e: Error) => seen.push({ error: e.message, dataListeners }),
      );
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    port = (server.address() as { port: number }).port;
  });
  afterAll(() => new Promise<void>((resolve) => server.close(() => resolve())));

  /**
   * Writes the first part on a raw connection and each later one once the server has the head (so
   * never in the head's read), then waits for the answer's status line; with `hangUp`, closes the
   * connection after the last part instead, once the server has the head.
   */
  const send = async (parts: string[], hangUp = false) => {
    const socket = (await import("node:net")).connect(port, "127.0.0.1");
    await new Promise((resolve) => socket.once("connect", resolve));
    const head = new Promise<void>((resolve) => (headArrived = resolve));
    const answer = new Promise<string>((resolve) => {
      let text = "";
      socket.on("data", (d: Buffer) => {
        text += d.toString();
        if (text.includes("\r\n")) resolve(text.split("\r\n")[0]!);
      });
      socket.on("close", () => resolve(""));
    });
    socket.write(parts[0]!);
    await head;
    for (const part of parts.slice(1)) socket.write(part);
    if (hangUp) socket.destroy();
    const line = await answer;
    socket.destroy();
    return line;
  };
  const head = (headers: string) => `POST / HTTP/1.1\r\nhost: x\r\n${headers}\r\n`;

  it("takes a body that came with its head at once, with no listeners", async () => {
    seen.length = 0;
    expect(await send([`${head("content-length: 11\r\n")}hello world`])).toBe("HTTP/1.1 200 OK");
    expect(await send([`${head("content-length: 0\r\n")}`])).toBe("HTTP/1.1 200 OK");
    expect(seen).toEqual([
      { bytes: "hello world", dataListeners: 0 },
      { bytes: "", dataListeners: 0 },
    ]);
  });

  it("waits for a body still on its way, whole or chunked, and passes on one over the limit with its rest", async () => {
    seen.length = 0;
    expect(await send([head("content-length: 11\r\n"), "hello", " world"])).toBe("HTTP/1.1 200 OK");
    expect(await send([head("transfer-encoding: chunked\r\n"), "5\r\nhello\r\n", "6\r\n world\r\n", "0\r\n\r\n"])).toBe("HTTP/1.1 200 OK");
    expect(await send([`${head("content-length: 26\r\n")}abcdefghijklmnopqrstuvwxyz`])).toBe("HTTP/1.1 200 OK");
    expect(await send([`${head("content-length: 26\r\n")}abcdefghijklm`, "nopqrstuvwxyz"])).toBe("HTTP/1.1 200 OK");
    expect(seen).toEqual([
      { bytes: "hello world", dataListeners: 1 },
      { bytes: "hello world", dataListeners: 1 },
      { over: "abcdefghijklmnopqrstuvwxyz", dataListeners: 1 },
      { over: "abcdefghijklmnopqrstuvwxyz", dataListeners: 1 },
    ]);
  });

  it("says so when the caller hangs up before its body ends, whether the head came alone or with part of the body", async () => {
    seen.length = 0;
    expect(await send([head("content-length: 11\r\n")], true)).toBe("");
    expect(await send([`${head("content-length: 11\r\n")}hello`], true)).toBe("");
    await expect.poll(() => seen.length).toBe(2);
    // Node's own error ("aborted"), as before the body was taken at once.
    expect(seen).toEqual([
      { error: "aborted", dataListeners: 1 },
      { error: "aborted", dataListeners: 1 },
    ]);
  });
});
