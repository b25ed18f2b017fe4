// The Connect unary fast path (unary-fast-path.ts) must be indistinguishable
// to clients from connect-node's own path. Two gateways, one with the fast
// path and one without, get the same matrix of requests; status, the headers
// that matter and the decoded bodies must match (the per-call fields of the
// status block aside: request id, times, memory, usage).
import { create, fromBinary, toBinary, type DescMessage } from "@bufbuild/protobuf";
import http from "node:http";
import { gunzipSync, brotliDecompressSync } from "node:zlib";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { StatusBlockSchema } from "../src/gen/gateway/catalogue/v1/status_pb.js";
import { operations } from "../src/operations/index.ts";
import { demo, startGateway, type GatewayFixture } from "./support/gateway-fixture.ts";

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
const perCall = ["requestId", "serverTime", "executionTime", "serverMemory", "apiInfo", "secache", "secacheTime", "secacheDate"];
const defaults: Record<string, unknown> = { requestId: "", serverTime: "", executionTime: 0, serverMemory: "", apiInfo: "", secache: "", secacheTime: 0n, secacheDate: "" };
/** Leaves the per-call fields out of a JSON status block. */
function steadyStatus(status: Record<string, unknown> | undefined): void {
  if (status) for (const k of perCall) delete status[k];
}
/** Sets the per-call fields of a status block message to their defaults (a message keeps every field). */
function steadyMessage(status: Record<string, unknown> | undefined): void {
  if (status) for (const k of perCall) status[k] = defaults[k];
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
      if (d.type !== StatusBlockSchema.typeName) continue;
      const s = fromBinary(StatusBlockSchema, Buffer.from(d.value, "base64")) as unknown as Record<string, unknown>;
      steadyMessage(s);
      d.value = Buffer.from(toBinary(StatusBlockSchema, s as never)).toString("base64");
      steadyStatus(d.debug as Record<string, unknown> | undefined);
    }
    if (json.message) json.message = json.message.replace(/request id \S+/, "request id …");
    return json;
  }
  return body.toString("base64");
}

/** A POST with exactly these headers (fetch would add Accept-Encoding and undo the encoding). */
function raw(port: number, path: string, headers: Record<string, string>, body: Uint8Array | string): Promise<{ status: number; headers: Headers; body: Buffer }> {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: "127.0.0.1", port, path, method: "POST", headers }, (res) => {
      const chunks: Buffer[] = [];
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("end", () => {
        const h = new Headers();
        for (const [k, v] of Object.entries(res.headers)) if (v !== undefined) h.set(k, Array.isArray(v) ? v.join(", ") : v);
        resolve({ status: res.statusCode!, headers: h, body: Buffer.concat(chunks) });
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
  readonly auth?: "ok" | "wrong-secret" | "none";
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
    { name: "text/plain (415)", contentType: "text/plain", body: () => JSON.stringify(args) },
  ];

  it.each(cases.map((c) => [c.name, c] as const))("%s", async (_name, c) => {
    const send = async (gw: GatewayFixture) => {
      const auth: Record<string, string> = c.auth === "none" ? {} : { "x-api-key": gw.account.key, "x-api-secret": c.auth === "wrong-secret" ? "wrong" : gw.account.secret };
      return raw(gw.port, path, { "content-type": c.contentType, ...auth, ...c.headers }, c.body(gw));
    };
    // Each twice, so the second is a cache hit on both.
    await send(fast);
    await send(slow);
    const a = await send(fast);
    const b = await send(slow);
    expect(a.status).toBe(b.status);
    for (const h of ["content-type", "content-encoding", "connect-content-encoding", "accept-encoding", "connect-accept-encoding", "vary", "access-control-allow-origin", "access-control-expose-headers"]) {
      expect(a.headers.get(h), h).toBe(b.headers.get(h));
    }
    expect(decoded(op.method.output, a)).toEqual(decoded(op.method.output, b));
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
