import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient, createRouterTransport, type Transport } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport, createGrpcWebTransport } from "@connectrpc/connect-node";
import { createConnectTransport as createWebTransport } from "@connectrpc/connect-web";
import * as grpc from "@grpc/grpc-js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { CatalogueSource } from "../src/core/catalogue-source.ts";
import { ItemGetRequestSchema, ItemGetResponseSchema, RetailService, type ItemGetResponse } from "../src/gen/gateway/catalogue/v1/retail_pb.js";
import { ErrorCode, StatusBlockSchema } from "../src/gen/gateway/catalogue/v1/status_pb.js";
import { WholesaleService } from "../src/gen/gateway/catalogue/v1/wholesale_pb.js";
import { operations } from "../src/operations/index.ts";
import { catalogueRoutes } from "../src/transports/connect/catalogue-services.ts";
import { demo, legacyGet, startGateway, type GatewayFixture } from "./support/gateway-fixture.ts";

let gw: GatewayFixture;
let headers: Record<string, string>;
// Methods as they went on the wire, seen by the fetch a browser client uses.
const methods: string[] = [];
const recordingFetch: typeof fetch = (input, init) => {
  methods.push(init?.method ?? "GET");
  return fetch(input, init);
};

beforeAll(async () => {
  gw = await startGateway();
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

describe("a request whose protobuf bytes do not decode", () => {
  const bad = Buffer.from([0xff, 0xff, 0x07]);
  const framed = Buffer.concat([Buffer.from([0, 0, 0, 0, bad.length]), bad]);

  it("is invalid_argument on Connect (connect-es alone would say internal)", async () => {
    const res = await fetch(`${gw.base}/gateway.catalogue.v1.RetailService/ItemGet`, { method: "POST", headers: { "content-type": "application/proto" }, body: bad });
    expect(res.status).toBe(400);
    expect(((await res.json()) as { code: string }).code).toBe("invalid_argument");
  });

  it("is invalid_argument on gRPC-Web", async () => {
    const res = await fetch(`${gw.base}/gateway.catalogue.v1.RetailService/ItemGet`, { method: "POST", headers: { "content-type": "application/grpc-web+proto" }, body: framed });
    expect(Buffer.from(await res.arrayBuffer()).toString("latin1")).toMatch(/grpc-status: 3\r\n/);
  });

  it("is INVALID_ARGUMENT on gRPC", async () => {
    const http2 = await import("node:http2");
    const session = http2.connect(gw.base);
    const status = await new Promise<string>((resolve) => {
      const stream = session.request({ ":method": "POST", ":path": "/gateway.catalogue.v1.RetailService/ItemGet", "content-type": "application/grpc", te: "trailers" });
      stream.on("trailers", (t) => resolve(String(t["grpc-status"])));
      stream.on("response", (h) => h["grpc-status"] !== undefined && resolve(String(h["grpc-status"])));
      stream.resume();
      stream.end(framed);
    });
    session.close();
    expect(status).toBe("3");
  });
});
