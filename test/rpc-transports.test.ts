import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient, createRouterTransport, type Transport } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport, createGrpcWebTransport } from "@connectrpc/connect-node";
import { errorFromJsonBytes } from "@connectrpc/connect/protocol-connect";
import { findTrailerError } from "@connectrpc/connect/protocol-grpc";
import { trailerParse } from "@connectrpc/connect/protocol-grpc-web";
import { createConnectTransport as createWebTransport } from "@connectrpc/connect-web";
import * as grpc from "@grpc/grpc-js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { CatalogueSource } from "../src/core/catalogue-source.ts";
import { ItemGetRequestSchema, ItemGetResponseSchema, RetailService, type ItemGetResponse } from "../src/gen/gateway/catalogue/v1/retail_pb.js";
import { ErrorCode, StatusBlockSchema, type StatusBlock } from "../src/gen/gateway/catalogue/v1/status_pb.js";
import { WholesaleService } from "../src/gen/gateway/catalogue/v1/wholesale_pb.js";
import { operations } from "../src/operations/index.ts";
import { catalogueRoutes } from "../src/transports/connect/catalogue-services.ts";
import { adminToken, demo, legacyGet, startGateway, type GatewayFixture } from "./support/gateway-fixture.ts";

let gw: GatewayFixture;
let headers: Record<string, string>;
// Methods as they went on the wire, seen by the fetch a browser client uses.
const methods: string[] = [];
const recordingFetch: typeof fetch = (input, init) => {
  methods.push(init?.method ?? "GET");
  return fetch(input, init);
};

beforeAll(async () => {
  gw = await startGateway({ config: { metricsToken: "" } });
  headers = { "x-api-key": gw.account.key, "x-api-secret": gw.account.secret };
});
afterAll(() => gw.close());

const transports: [string, () => Transport][] = [
  ["Connect JSON", () => createConnectTransport({ baseUrl: gw.base, httpVersion: "1.1" })],
  ["Connect binary", () => createConnectTransport({ baseUrl: gw.base, httpVersion: "1.1", useBinaryFormat: true })],
  ["Connect GET", () => createWebTransport({ baseUrl: gw.base, useHttpGet: true, fetch: recordingFetch })],
  ["Connect over HTTP/2", () => createConnectTransport({ baseUrl: gw.base, httpVersion: "2" })],
  ["gRPC-Web", () => createGrpcWebTransport({ baseUrl: gw.base, httpVersion: "1.1" })],
  ["Connect-Web (fetch, as in a browser)", () => createWebTransport({ baseUrl: gw.base })],
  ["gRPC (HTTP/2 prior knowledge)", () => createGrpcTransport({ baseUrl: gw.base })],
];

describe.each(transports)("%s", (_name, makeTransport) => {
  it("ItemGet returns the item and status the legacy path returns", async () => {
    const res = await createClient(RetailService, makeTransport()).itemGet({ numIid: demo.retailNumIid, isPromotion: "1" }, { headers });
    const legacy = await legacyGet(gw.base, "/retail/item_get/", { key: gw.account.key, secret: gw.account.secret, num_iid: demo.retailNumIid, is_promotion: "1" });
    const item = legacy.json.item as Record<string, unknown>;
    expect(res.item?.numIid).toBe(item.num_iid);
    expect(res.item?.title).toBe(item.title);
    expect(res.item?.price).toBe(item.price);
    expect(res.item?.skus?.sku.length).toBe((item.skus as { sku: unknown[] }).sku.length);
    expect(res.item?.propsList).toEqual(item.props_list);
    expect(res.item?.brandId).toBe(item.brandId);
    expect(res.item?.promoType).toBeUndefined();
    expect(res.status?.errorCode).toBe(ErrorCode.SUCCESS);
    expect(res.status?.apiType).toBe("retail");
    expect(res.status?.secache).toBe(legacy.json.secache);
    expect(res.status?.callArgs).toEqual({ num_iid: demo.retailNumIid, is_promotion: "1" });
    expect(res.status?.requestId).toMatch(/^gw-1\.[0-9a-f]{13}$/);
    expect(res.status?.requestId).not.toBe(legacy.json.request_id);
  });

  it("ItemSearchPeerbuy returns the peer-viewed items", async () => {
    const res = await createClient(WholesaleService, makeTransport()).itemSearchPeerbuy({ numIid: demo.wholesaleNumIid, sid: demo.wholesaleSid }, { headers });
    const legacy = await legacyGet(gw.base, "/wholesale/item_search_peerbuy/", { key: gw.account.key, secret: gw.account.secret, num_iid: demo.wholesaleNumIid, sid: demo.wholesaleSid });
    expect(res.item.map((i) => i.numIid)).toEqual((legacy.json.item as { num_iid: string }[]).map((i) => i.num_iid));
    expect(res.status?.ddf).toBe("embedded");
    expect(res.status?.lastId).toBe(legacy.json.last_id);
  });

  it("WholesaleService.ItemGet returns the wholesale detail the legacy path returns, and its sid opens ItemSearchPeerbuy", async () => {
    const client = createClient(WholesaleService, makeTransport());
    const res = await client.itemGet({ numIid: demo.wholesaleNumIid }, { headers });
    const legacy = await legacyGet(gw.base, "/wholesale/item_get/", { key: gw.account.key, secret: gw.account.secret, num_iid: demo.wholesaleNumIid });
    const item = legacy.json.item as Record<string, unknown>;
    expect(res.item?.numIid).toBe(demo.wholesaleNumIid);
    expect(res.item?.title).toBe(item.title);
    expect(res.item?.price).toBe(item.price);
    expect(res.status?.apiType).toBe("wholesale");
    expect(res.status?.lastId).toBe("0");
    expect(res.status?.secache).toBe(legacy.json.secache);
    const sid = res.item!.sellerInfo!.sid;
    expect(sid).toBe((item.seller_info as { sid: string }).sid);
    const peers = await client.itemSearchPeerbuy({ numIid: demo.wholesaleNumIid, sid }, { headers });
    expect(peers.status?.errorCode).toBe(ErrorCode.SUCCESS);
    expect(peers.item.length).toBeGreaterThan(0);
  });

  it("an error carries its code and status block", async () => {
    const err = await createClient(RetailService, makeTransport())
      .itemGet({ numIid: "123" }, { headers })
      .then(() => undefined, ConnectError.from);
    expect(err?.code).toBe(Code.NotFound);
    expect(err?.findDetails(StatusBlockSchema)[0]?.errorCode).toBe(ErrorCode.NO_RESULT);
  });
});

it("Connect GET really used GET", () => {
  expect(methods.length).toBeGreaterThan(0);
  expect(new Set(methods)).toEqual(new Set(["GET"]));
});

describe("@grpc/grpc-js, an independent gRPC implementation", () => {
  function itemGet(numIid: string, secret: string): Promise<ItemGetResponse> {
    const client = new grpc.Client(`127.0.0.1:${gw.port}`, grpc.credentials.createInsecure());
    const metadata = new grpc.Metadata();
    metadata.set("x-api-key", gw.account.key);
    metadata.set("x-api-secret", secret);
    return new Promise<ItemGetResponse>((resolve, reject) => {
      client.makeUnaryRequest(
        "/gateway.catalogue.v1.RetailService/ItemGet",
        (req: { numIid: string }) => Buffer.from(toBinary(ItemGetRequestSchema, create(ItemGetRequestSchema, req))),
        (buf: Buffer) => fromBinary(ItemGetResponseSchema, buf),
        { numIid },
        metadata,
        (err, res) => {
          client.close();
          if (err) reject(err);
          else resolve(res!);
        },
      );
    });
  }

  it("calls ItemGet over HTTP/2 on the legacy port", async () => {
    const res = await itemGet(demo.retailNumIid, gw.account.secret);
    expect(res.item?.numIid).toBe(demo.retailNumIid);
    expect(res.status?.errorCode).toBe(ErrorCode.SUCCESS);
  });

  it("sees UNAUTHENTICATED with the four-digit code for a wrong secret", async () => {
    const err = (await itemGet(demo.retailNumIid, "wrong").catch((e: unknown) => e)) as grpc.ServiceError;
    expect(err.code).toBe(grpc.status.UNAUTHENTICATED);
    expect(err.details).toContain("4005");
    expect(err.metadata.get("grpc-status-details-bin").length).toBe(1);
  });
});

describe("handlers alone (in-memory router transport)", () => {
  it("a source that throws answers 4000 Internal without leaking the cause", async () => {
    const failing: CatalogueSource = {
      label: "broken",
      fetch: () => Promise.reject(new Error("disk on fire at /var/secret/path")),
    };
    const logged: unknown[] = [];
    const core = gw.gatewayWith(new Map([["retail", failing], ["wholesale", failing]]), { error: (obj) => logged.push(obj) });
    const client = createClient(RetailService, createRouterTransport(catalogueRoutes(core, operations)));
    const err = await client.itemGet({ numIid: "1" }, { headers }).then(() => undefined, ConnectError.from);
    expect(err?.code).toBe(Code.Internal);
    const status = err?.findDetails(StatusBlockSchema)[0];
    expect(status?.errorCode).toBe(ErrorCode.SERVER_INTERNAL_ERROR);
    expect(status?.reason).not.toContain("disk");
    expect(status?.reason).toContain(status!.requestId);
    expect(logged).toHaveLength(1);
  });
});

/** The count of answers with `code` on `transport` that reached no operation, from the gateway's own metrics. */
async function refusalsCounted(code: string, transport: string): Promise<number> {
  const text = await (await fetch(`${gw.base}/metrics`)).text();
  const line = text.split("\n").find((l) => l.startsWith(`gateway_calls_total{operation="",code="${code}",transport="${transport}"}`));
  return line === undefined ? 0 : Number(line.split(" ").pop());
}

/** A gRPC call on a raw HTTP/2 stream: the status it ended with, as a client reads it (trailers, or a trailers-only answer's headers). */
async function rawGrpc(path: string, body: Uint8Array, extra: Record<string, string> = {}, base = gw.base): Promise<ConnectError | undefined> {
  const http2 = await import("node:http2");
  const session = http2.connect(base);
  try {
    const ended = await new Promise<Record<string, unknown>>((resolve, reject) => {
      const stream = session.request({ ":method": "POST", ":path": path, "content-type": "application/grpc", te: "trailers", ...extra });
      stream.on("trailers", resolve);
      stream.on("response", (h) => h["grpc-status"] !== undefined && resolve(h));
      stream.on("error", reject);
      stream.resume();
      stream.end(body);
    });
    return findTrailerError(new Headers(Object.entries(ended).filter(([k]) => !k.startsWith(":")).map(([k, v]) => [k, String(v)] as [string, string])));
  } finally {
    session.close();
  }
}

/** The status a gRPC-Web answer ends with, read from its trailer frame. */
async function grpcWebError(res: Response): Promise<ConnectError | undefined> {
  const bytes = new Uint8Array(await res.arrayBuffer());
  let at = 0;
  while (at + 5 <= bytes.length) {
    const size = new DataView(bytes.buffer, bytes.byteOffset + at + 1, 4).getUint32(0);
    if (bytes[at] === 0x80) return findTrailerError(trailerParse(bytes.subarray(at + 5, at + 5 + size)));
    at += 5 + size;
  }
  return undefined;
}

/** A refusal as every RPC caller must get it: its code, the four digits leading the message, and the status block as detail. */
function expectRefusal(err: ConnectError | undefined, code: Code, digits: ErrorCode, apiType: string): StatusBlock {
  expect(err?.code).toBe(code);
  const status = err!.findDetails(StatusBlockSchema)[0];
  expect(status?.errorCode).toBe(digits);
  expect(err!.rawMessage.startsWith(`${String(digits).padStart(4, "0")} `)).toBe(true);
  expect(status?.apiType).toBe(apiType);
  expect(status?.requestId).toMatch(/^gw-1\.[0-9a-f]{13}$/);
  expect(status?.reason.length).toBeGreaterThan(0);
  expect(err!.rawMessage).toContain(status!.reason);
  return status!;
}

/** The error a Connect stream ends with: its end-stream message (flag 0x02), JSON. */
async function connectStreamError(res: Response): Promise<ConnectError | undefined> {
  const bytes = new Uint8Array(await res.arrayBuffer());
  for (let at = 0; at + 5 <= bytes.length; ) {
    const size = new DataView(bytes.buffer, bytes.byteOffset + at + 1, 4).getUint32(0);
    if ((bytes[at]! & 0x02) !== 0) {
      const end = JSON.parse(Buffer.from(bytes.subarray(at + 5, at + 5 + size)).toString("utf8")) as { error?: unknown };
      return end.error === undefined ? undefined : errorFromJsonBytes(Buffer.from(JSON.stringify(end.error)), undefined, new ConnectError("", Code.Unknown));
    }
    at += 5 + size;
  }
  return undefined;
}

describe("a request the gateway cannot read whole: no error line for the caller's doing", () => {
  // connect-es decodes a stream's request as the method reads it, past the point where a unary request's
  // refusal is made, and codes a failed decode `internal`: it was answered "internal error; quote request id"
  // with an error line and its stack, for any caller to fill the log with.
  const lines: string[] = [];
  let own: GatewayFixture;
  beforeAll(async () => {
    own = await startGateway({ logLines: lines });
  });
  afterAll(() => own.close());
  const bad = Buffer.from([0xff, 0xff, 0x07]);
  const framed = Buffer.concat([Buffer.from([0, 0, 0, 0, bad.length]), bad]);
  const methods: [string, Record<string, string>][] = [
    ["/grpc.health.v1.Health/Watch", {}],
    ["/gateway.admin.v1.AdminService/WatchCalls", { authorization: `Bearer ${adminToken}` }],
  ];
  /** The error a stream's request ends with on Connect, gRPC-Web and gRPC, in that order. */
  const streamErrors = async (path: string, auth: Record<string, string>, body: Buffer) => [
    await connectStreamError(await fetch(`${own.base}${path}`, { method: "POST", headers: { ...auth, "content-type": "application/connect+proto" }, body })),
    await grpcWebError(await fetch(`${own.base}${path}`, { method: "POST", headers: { ...auth, "content-type": "application/grpc-web+proto" }, body })),
    await rawGrpc(path, body, auth, own.base),
  ];

  it.each(methods)("%s answers invalid_argument with the decoder's words on Connect, gRPC-Web and gRPC, and logs no error", async (path, auth) => {
    for (const err of await streamErrors(path, auth, framed)) {
      expect(err?.code).toBe(Code.InvalidArgument);
      expect(err?.rawMessage).toMatch(/^parse binary:/);
    }
    // The log is read (the calls' access lines are in it), and holds no error line.
    expect(lines.some((l) => l.includes(`"url":"${path}"`))).toBe(true);
    expect(lines.filter((l) => (JSON.parse(l) as { level: number }).level >= 50)).toEqual([]);
    // Each call's last access line says how it ended.
    expect(lines.filter((l) => l.includes('"rpcCode":"invalid_argument"')).length).toBeGreaterThanOrEqual(3);
  });

  it("a Connect call over HTTP/2 its caller resets part way through its body writes no error line", async () => {
    // Fastify's route reads such a call's body; Node's compatibility request is not `destroyed` when its stream is
    // reset, and the cut body was logged as the gateway's fault, one error line a reset.
    const http2 = await import("node:http2");
    const session = http2.connect(own.base);
    session.on("error", () => undefined);
    try {
      for (const [type, wait] of [["application/proto", 0], ["application/json", 0], ["application/proto", 5], ["application/json", 5], ["application/proto", 50]] as const) {
        const stream = session.request({ ":method": "POST", ":path": "/gateway.catalogue.v1.RetailService/ItemGet", "content-type": type, "x-api-key": own.account.key, "x-api-secret": own.account.secret });
        stream.on("error", () => undefined);
        stream.write(type === "application/json" ? '{"numIid":"6' : Buffer.from([0x0a, 0x0c, 0x36]));
        await new Promise((r) => setTimeout(r, wait));
        await new Promise<void>((r) => stream.close(http2.constants.NGHTTP2_CANCEL, () => r()));
      }
    } finally {
      session.close();
    }
    await new Promise((r) => setTimeout(r, 200));
    expect(lines.filter((l) => (JSON.parse(l) as { level: number }).level >= 50)).toEqual([]);
  });

  it.each(methods)("%s keeps gRPC's internal, in connect-es's words, for a message flagged compressed with no encoding, and logs no error", async (path, auth) => {
    const message = Buffer.from([0x0a, 0x00]);
    const flagged = Buffer.concat([Buffer.from([1, 0, 0, 0, message.length]), message]);
    for (const err of await streamErrors(path, auth, flagged)) {
      expect(err?.code).toBe(Code.Internal);
      expect(err?.rawMessage).toBe("received compressed envelope, but do not know how to decompress");
    }
    expect(lines.filter((l) => (JSON.parse(l) as { level: number }).level >= 50)).toEqual([]);
  });
});

describe("a catalogue request connect-node refuses before the call: the status block as detail, and recorded", () => {
  const path = "/gateway.catalogue.v1.RetailService/ItemGet";
  const bad = Buffer.from([0xff, 0xff, 0x07]);
  const framed = Buffer.concat([Buffer.from([0, 0, 0, 0, bad.length]), bad]);
  const oversized = { numIid: demo.retailNumIid, isPromotion: "1".repeat(1_100_000) };

  it("bytes that do not decode: invalid_argument (connect-es alone would say internal) and 4003 on Connect", async () => {
    const before = await refusalsCounted("4003", "connect");
    const res = await fetch(`${gw.base}${path}`, { method: "POST", headers: { "content-type": "application/proto" }, body: bad });
    expect(res.status).toBe(400);
    const err = errorFromJsonBytes(new Uint8Array(await res.arrayBuffer()), undefined, new ConnectError("not an error", Code.Unknown));
    expect(expectRefusal(err, Code.InvalidArgument, ErrorCode.PARAM_ERROR, "retail").reason).toMatch(/^parse binary:/);
    expect(await refusalsCounted("4003", "connect")).toBe(before + 1);
  });

  it("JSON that does not parse, over Connect GET and POST", async () => {
    const post = await fetch(`${gw.base}${path}`, { method: "POST", headers: { "content-type": "application/json" }, body: '{"numIid":' });
    expect(post.status).toBe(400);
    expectRefusal(errorFromJsonBytes(new Uint8Array(await post.arrayBuffer()), undefined, new ConnectError("", Code.Unknown)), Code.InvalidArgument, ErrorCode.PARAM_ERROR, "retail");
    const get = await fetch(`${gw.base}/gateway.catalogue.v1.WholesaleService/ItemSearchPeerbuy?connect=v1&encoding=json&message=${encodeURIComponent("{nope")}`);
    expect(get.status).toBe(400);
    expectRefusal(errorFromJsonBytes(new Uint8Array(await get.arrayBuffer()), undefined, new ConnectError("", Code.Unknown)), Code.InvalidArgument, ErrorCode.PARAM_ERROR, "wholesale");
  });

  it("bytes that do not decode on gRPC-Web and gRPC", async () => {
    const beforeWeb = await refusalsCounted("4003", "grpc-web");
    const res = await fetch(`${gw.base}${path}`, { method: "POST", headers: { "content-type": "application/grpc-web+proto" }, body: framed });
    expectRefusal(await grpcWebError(res), Code.InvalidArgument, ErrorCode.PARAM_ERROR, "retail");
    expect(await refusalsCounted("4003", "grpc-web")).toBe(beforeWeb + 1);
    const before = await refusalsCounted("4003", "grpc");
    expectRefusal(await rawGrpc(path, framed), Code.InvalidArgument, ErrorCode.PARAM_ERROR, "retail");
    expectRefusal(await rawGrpc(path, Buffer.concat([framed, framed])), Code.InvalidArgument, ErrorCode.PARAM_ERROR, "retail");
    expect(await refusalsCounted("4003", "grpc")).toBe(before + 2);
  });

  it("a gRPC message flagged compressed without an encoding keeps gRPC's code (internal), with 4003: the caller's fault, counted as such", async () => {
    const before = await refusalsCounted("4003", "grpc");
    const internalBefore = await refusalsCounted("4000", "grpc");
    expectRefusal(await rawGrpc(path, Buffer.concat([Buffer.from([1]), framed.subarray(1)])), Code.Internal, ErrorCode.PARAM_ERROR, "retail");
    expect(await refusalsCounted("4003", "grpc")).toBe(before + 1);
    expect(await refusalsCounted("4000", "grpc")).toBe(internalBefore);
  });

  it("a compression the server does not speak keeps its protocol's code (unimplemented), with 4003", async () => {
    const res = await fetch(`${gw.base}${path}`, { method: "POST", headers: { "content-type": "application/json", "content-encoding": "zstd" }, body: "{}" });
    expectRefusal(errorFromJsonBytes(new Uint8Array(await res.arrayBuffer()), undefined, new ConnectError("", Code.Unknown)), Code.Unimplemented, ErrorCode.PARAM_ERROR, "retail");
    expectRefusal(await rawGrpc(path, framed, { "grpc-encoding": "zstd" }), Code.Unimplemented, ErrorCode.PARAM_ERROR, "retail");
  });

  it.each(transports.filter(([name]) => !name.includes("GET") && !name.includes("Connect-Web")))("a message over the size limit from a real %s client: resource_exhausted, with 4003", async (_name, makeTransport) => {
    const err = await createClient(RetailService, makeTransport()).itemGet(oversized, { headers }).then(() => undefined, ConnectError.from);
    expectRefusal(err, Code.ResourceExhausted, ErrorCode.PARAM_ERROR, "retail");
  });

  it("grpc-js, an independent client, gets the status block in grpc-status-details-bin", async () => {
    const client = new grpc.Client(`127.0.0.1:${gw.port}`, grpc.credentials.createInsecure());
    try {
      const err = await new Promise<grpc.ServiceError>((resolve) =>
        client.makeUnaryRequest(path, (b: Buffer) => b, (b: Buffer) => b, bad, new grpc.Metadata(), (e) => resolve(e!)),
      );
      expect(err.code).toBe(grpc.status.INVALID_ARGUMENT);
      const details = err.metadata.get("grpc-status-details-bin")[0] as Buffer;
      const headers = new Headers({ "grpc-status": "3", "grpc-message": encodeURIComponent(err.details), "grpc-status-details-bin": details.toString("base64") });
      expectRefusal(findTrailerError(headers), Code.InvalidArgument, ErrorCode.PARAM_ERROR, "retail");
    } finally {
      client.close();
    }
  });

  it("an error from inside the call is not refused twice: it keeps its one status block", async () => {
    const before = await refusalsCounted("4003", "connect");
    const err = await createClient(RetailService, createConnectTransport({ baseUrl: gw.base, httpVersion: "1.1" }))
      .itemGet({ numIid: "abc" }, { headers })
      .then(() => undefined, ConnectError.from);
    expect(err?.findDetails(StatusBlockSchema)).toHaveLength(1);
    expect(err?.findDetails(StatusBlockSchema)[0]?.callArgs).toEqual({ num_iid: "abc" });
    expect(await refusalsCounted("4003", "connect")).toBe(before);
  });

  it("an unknown method: unimplemented with the 4010 status block, on Connect, gRPC-Web and gRPC", async () => {
    const unknown = "/gateway.catalogue.v1.RetailService/ItemFly";
    const connect = await fetch(`${gw.base}${unknown}`, { method: "POST", headers: { "content-type": "application/json" }, body: "{}" });
    expect(connect.status).toBe(404);
    expectRefusal(errorFromJsonBytes(new Uint8Array(await connect.arrayBuffer()), undefined, new ConnectError("", Code.Unknown)), Code.Unimplemented, ErrorCode.API_NOT_FOUND, "");
    const web = await fetch(`${gw.base}${unknown}`, { method: "POST", headers: { "content-type": "application/grpc-web+proto" }, body: framed });
    expect(web.headers.get("grpc-status")).toBe("12");
    expectRefusal(findTrailerError(web.headers), Code.Unimplemented, ErrorCode.API_NOT_FOUND, "");
    expectRefusal(await rawGrpc(unknown, framed), Code.Unimplemented, ErrorCode.API_NOT_FOUND, "");
  });
});
