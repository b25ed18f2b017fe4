// A caller's W3C Trace Context (src/core/trace-context.ts): read from every transport, handed on to the (fake)
// upstream provider with the purchase it causes, and named in the access line.
import { createClient } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { traceContextOf } from "../src/core/trace-context.ts";
import { RetailService } from "../src/gen/gateway/catalogue/v1/retail_pb.js";
import { FakeUpstream } from "./support/fake-upstream.ts";
import { demo, startGateway, type GatewayFixture } from "./support/gateway-fixture.ts";

const traceId = "4bf92f3577b34da6a3ce929d0e0e4736";
const parentId = "00f067aa0ba902b7";
const traceparent = `00-${traceId}-${parentId}-01`;

describe("a traceparent the gateway continues", () => {
  it("is the spec's version 00, lowercase, with ids that are not all zeros; a later version is read for its first four fields", () => {
    expect(traceContextOf(traceparent, "congo=t61rcWkgMzE")).toEqual({ traceparent, tracestate: "congo=t61rcWkgMzE", traceId });
    for (const bad of [
      traceparent.toUpperCase().replace(/^00/, "00"),
      `00-${"0".repeat(32)}-${parentId}-01`,
      `00-${traceId}-${"0".repeat(16)}-01`,
      `ff-${traceId}-${parentId}-01`,
      `00-${traceId}-${parentId}-01-extra`,
      `00-${traceId}-${parentId}-1`,
      `00_${traceId}-${parentId}-01`,
      `${traceparent}, ${traceparent}`, // two headers, joined
      "",
      "garbage",
    ]) {
      expect(traceContextOf(bad, undefined), bad).toBeUndefined();
    }
    // A later version: its first four fields, forwarded as version 00; what follows is dropped.
    expect(traceContextOf(`cc-${traceId}-${parentId}-01-what-the-future-will-be-like`, undefined)?.traceparent).toBe(traceparent);
    expect(traceContextOf(`cc-${traceId}-${parentId}-01x`, undefined)).toBeUndefined();
    // A tracestate too long for the spec, or that could not be sent as a header, is dropped; the trace goes on.
    expect(traceContextOf(traceparent, `a=${"x".repeat(511)}`)?.tracestate).toBeUndefined();
    expect(traceContextOf(traceparent, "a=1\r\nx-injected: 1")).toEqual({ traceparent, tracestate: undefined, traceId });
  });
});

describe("the caller's trace, handed on to the upstream provider", () => {
  let upstream: FakeUpstream;
  let gw: GatewayFixture;
  const lines: string[] = [];
  beforeAll(async () => {
    upstream = await new FakeUpstream().start();
    gw = await startGateway({ logLines: lines, config: { upstreamUrl: upstream.url, upstreamKey: "up-key", upstreamSecret: "up-secret-0123456789" } });
  });
  afterAll(async () => {
    await gw.close();
    await upstream.stop();
  });

  const headers = (a: { key: string; secret: string }, extra: Record<string, string>) => ({ "x-api-key": a.key, "x-api-secret": a.secret, ...extra });
  /** The trace headers of the upstream request each call caused (the call bypasses the cache: `cache=no`). */
  /** A GET takes the fast path before Fastify; a POST (a form body), Fastify's route. */
  const legacy = async (extra: Record<string, string>, method: "GET" | "POST" = "GET") => {
    const before = upstream.requests.length;
    const q = new URLSearchParams({ key: gw.account.key, secret: gw.account.secret, num_iid: demo.retailNumIid, cache: "no" });
    const res = method === "GET" ? await fetch(`${gw.base}/retail/item_get/?${q}`, { headers: extra }) : await fetch(`${gw.base}/retail/item_get/`, { method, headers: extra, body: q });
    expect(((await res.json()) as { error_code: string }).error_code).toBe("0000");
    return upstream.requests.slice(before).map((r) => [r.headers.traceparent, r.headers.tracestate]);
  };

  it("over legacy (the fast path and Fastify's route), Connect and gRPC, as the caller sent it", async () => {
    const state = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE";
    expect(await legacy({ traceparent, tracestate: state })).toEqual([[traceparent, state]]);
    // A POST: Fastify's route, not the fast path (which takes a GET with or without the trailing slash).
    expect(await legacy({ traceparent }, "POST")).toEqual([[traceparent, undefined]]);
    for (const transport of [createConnectTransport({ baseUrl: gw.base, httpVersion: "1.1" }), createGrpcTransport({ baseUrl: gw.base })]) {
      const before = upstream.requests.length;
      await createClient(RetailService, transport).itemGet({ numIid: demo.retailNumIid, cache: 2 }, { headers: headers(gw.account, { traceparent, tracestate: state }) });
      expect(upstream.requests.slice(before).map((r) => [r.headers.traceparent, r.headers.tracestate])).toEqual([[traceparent, state]]);
    }
  });

  it("sends none when the caller sent none, or one the spec does not let it continue", async () => {
    expect(await legacy({})).toEqual([[undefined, undefined]]);
    expect(await legacy({ traceparent: `00-${"0".repeat(32)}-${parentId}-01`, tracestate: "a=1" })).toEqual([[undefined, undefined]]);
  });

  it("names the trace in the call's access line, on every path", async () => {
    lines.length = 0;
    await legacy({ traceparent });
    await legacy({ traceparent }, "POST");
    await createClient(RetailService, createGrpcTransport({ baseUrl: gw.base })).itemGet({ numIid: demo.retailNumIid }, { headers: headers(gw.account, { traceparent }) });
    await legacy({});
    const incoming = lines.map((l) => JSON.parse(l) as { msg: string; req?: { url: string; traceId?: string } }).filter((l) => l.msg === "incoming request");
    expect(incoming.map((l) => l.req!.traceId)).toEqual([traceId, traceId, traceId, undefined]);
    // Nothing else of the headers is written.
    expect(lines.join("\n")).not.toContain(parentId);
  });
});

describe("a page of an allowed origin that traces its calls", () => {
  let gw: GatewayFixture;
  beforeAll(async () => {
    gw = await startGateway({ app: { corsOrigins: ["https://shop.example"] } });
  });
  afterAll(() => gw.close());

  it("may send traceparent and tracestate: the preflight allows them (browser tracing adds both to a cross-origin call it is told to trace)", async () => {
    const preflight = await fetch(`${gw.base}/gateway.catalogue.v1.RetailService/ItemGet`, {
      method: "OPTIONS",
      headers: { origin: "https://shop.example", "access-control-request-method": "POST", "access-control-request-headers": "content-type,x-api-key,x-api-secret,traceparent,tracestate" },
    });
    expect(preflight.status).toBe(204);
    expect(preflight.headers.get("access-control-allow-headers")!.toLowerCase().split(/,\s*/)).toEqual(expect.arrayContaining(["traceparent", "tracestate"]));
  });
});
