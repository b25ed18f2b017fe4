// The binary answers of a cached item send the item's bytes encoded once per
// cache entry (catalogue-services.ts). Differential: what a client receives
// must be the message a plain connect-node handler sends, over every binary
// protocol and every operation.
import { create, fromBinary, fromJson, toBinary, type DescMessage, type Message } from "@bufbuild/protobuf";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import * as grpc from "@grpc/grpc-js";
import http from "node:http";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { StatusBlockSchema } from "../src/gen/gateway/catalogue/v1/status_pb.js";
import { operations } from "../src/operations/index.ts";
import { demo, startGateway, type GatewayFixture } from "./support/gateway-fixture.ts";
import { grpcFrame } from "./support/grpc-frame.ts";

let gw: GatewayFixture;
let bare: http.Server;
let bareBase: string;
/** What the bare handler answers next: the gateway's own last answer, decoded. */
let nextAnswer: Message | undefined;

beforeAll(async () => {
  gw = await startGateway();
  // A plain connect-node server of the same services, returning whatever message it is handed.
  bare = http.createServer(connectNodeAdapter({ routes: (r) => { for (const op of operations) r.rpc(op.method as never, (async () => nextAnswer) as never); } }));
  await new Promise<void>((r) => bare.listen(0, "127.0.0.1", r));
  bareBase = `http://127.0.0.1:${(bare.address() as { port: number }).port}`;
});
afterAll(async () => {
  await gw?.close();
  await new Promise((r) => bare?.close(r));
});

const args: Record<string, Record<string, string>> = {
  "retail/item_get": { numIid: demo.retailNumIid, isPromotion: "1" },
  "wholesale/item_get": { numIid: demo.wholesaleNumIid },
  "wholesale/item_search_peerbuy": { numIid: demo.wholesaleNumIid, sid: demo.wholesaleSid },
};

/** The per-call fields of a status block, made equal so two answers can be compared. */
function steady(message: Message): Message {
  const m = message as Message & { status?: Record<string, unknown> };
  if (m.status) Object.assign(m.status, { requestId: "", serverTime: "", executionTime: 0, serverMemory: "", apiInfo: "", cache: false });
  return m;
}

const auth = () => ({ "x-api-key": gw.account.key, "x-api-secret": gw.account.secret });

async function post(base: string, path: string, contentType: string, body: Uint8Array, headers: Record<string, string> = {}) {
  const res = await fetch(`${base}${path}`, { method: "POST", headers: { "content-type": contentType, ...headers }, body });
  return { status: res.status, headers: res.headers, bytes: new Uint8Array(await res.arrayBuffer()) };
}

function unframe(bytes: Uint8Array): Uint8Array {
  expect(bytes[0]).toBe(0);
  const n = new DataView(bytes.buffer, bytes.byteOffset).getUint32(1);
  return bytes.subarray(5, 5 + n);
}

describe.each(operations.map((op) => [op.id, op] as const))("%s", (id, op) => {
  const path = `/${op.service.typeName}/${op.method.name}`;
  const input = op.method.input as DescMessage;
  const output = op.method.output as DescMessage;
  const request = () => toBinary(input, create(input, args[id] as never));

  it("Connect binary: the same message, status and headers a plain connect-node handler sends", async () => {
    // Three times: the embedded catalogue's answer is kept from its second request on; the third is a hit, sent from the entry's bytes.
    await post(gw.base, path, "application/proto", request(), auth());
    await post(gw.base, path, "application/proto", request(), auth());
    const got = await post(gw.base, path, "application/proto", request(), auth());
    expect(got.status).toBe(200);
    const decoded = fromBinary(output, got.bytes);
    expect(decoded.$unknown ?? []).toEqual([]);
    // Sent from the entry's bytes: the item (field 1) follows the status block (field 2) on the wire.
    expect(got.bytes[0]).toBe((2 << 3) | 2);
    expect((decoded as unknown as { status: { cache: boolean } }).status.cache).toBe(true);
    // The JSON path encodes the item each time, as connect-node alone would: the same item.
    const json = await fetch(`${gw.base}${path}`, { method: "POST", headers: { "content-type": "application/json", ...auth() }, body: JSON.stringify(args[id]) });
    const viaJson = fromJson(output, (await json.json()) as never);
    expect(toBinary(output, steady(decoded) as never)).toEqual(toBinary(output, steady(viaJson) as never));
    // A plain connect-node server handed the same message: same status, same content type, same decoded bytes.
    nextAnswer = fromBinary(output, got.bytes); // as received, before steady() changed `decoded`
    const plain = await post(bareBase, path, "application/proto", request());
    expect(plain.status).toBe(got.status);
    for (const h of ["content-type", "content-encoding", "connect-content-encoding"]) expect(got.headers.get(h), h).toBe(plain.headers.get(h));
    expect(toBinary(output, fromBinary(output, got.bytes))).toEqual(toBinary(output, fromBinary(output, plain.bytes)));
  });

  it("Connect GET with encoding=proto, and gRPC-Web: the same message", async () => {
    const q = new URLSearchParams({ connect: "v1", encoding: "proto", base64: "1", message: Buffer.from(request()).toString("base64url") });
    const get = await fetch(`${gw.base}${path}?${q}`, { headers: auth() });
    expect(get.status).toBe(200);
    const viaGet = fromBinary(output, new Uint8Array(await get.arrayBuffer()));
    const web = await post(gw.base, path, "application/grpc-web+proto", grpcFrame(request()), auth());
    expect(web.status).toBe(200);
    const viaWeb = fromBinary(output, unframe(web.bytes));
    const json = await fetch(`${gw.base}${path}`, { method: "POST", headers: { "content-type": "application/json", ...auth() }, body: JSON.stringify(args[id]) });
    const viaJson = steady(fromJson(output, (await json.json()) as never));
    expect(toBinary(output, steady(viaGet) as never)).toEqual(toBinary(output, viaJson as never));
    expect(toBinary(output, steady(viaWeb) as never)).toEqual(toBinary(output, viaJson as never));
  });

  it("gRPC (grpc-js): the same message", async () => {
    const client = new grpc.Client(`127.0.0.1:${gw.port}`, grpc.credentials.createInsecure());
    const metadata = new grpc.Metadata();
    for (const [k, v] of Object.entries(auth())) metadata.set(k, v);
    const viaGrpc = await new Promise<Message>((resolve, reject) =>
      client.makeUnaryRequest(path, (m: Uint8Array) => Buffer.from(m), (b: Buffer) => fromBinary(output, b), request(), metadata, (e, r) => (e ? reject(e) : resolve(r!))),
    );
    client.close();
    const json = await fetch(`${gw.base}${path}`, { method: "POST", headers: { "content-type": "application/json", ...auth() }, body: JSON.stringify(args[id]) });
    expect(toBinary(output, steady(viaGrpc) as never)).toEqual(toBinary(output, steady(fromJson(output, (await json.json()) as never)) as never));
    expect(StatusBlockSchema.typeName).toBe("gateway.catalogue.v1.StatusBlock");
  });
});
