// The gateway's own spans (src/core/tracing.ts), sent to an OpenTelemetry collector over OTLP
// (src/exporters/otlp-traces.ts). The collectors are real servers on loopback that keep what they are sent (or,
// on purpose, do not answer): OTLP/HTTP binary by default, OTLP/gRPC on grpc-js below; the provider is the fake
// upstream, which records the traceparent of each purchase. The exporter's encodings, retries and TLS are in
// otlp-export.test.ts.
import { Code, ConnectError, createClient, createRouterTransport } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport, createGrpcWebTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Tracer, type SpanData } from "../src/core/tracing.ts";
import type { CatalogueSource } from "../src/core/catalogue-source.ts";
import { operations } from "../src/operations/index.ts";
import { catalogueRoutes } from "../src/transports/connect/catalogue-services.ts";
import { OtlpTraceExporter } from "../src/exporters/otlp-traces.ts";
import { RetailService } from "../src/gen/gateway/catalogue/v1/retail_pb.js";
import { FakeUpstream } from "./support/fake-upstream.ts";
import { demo, startGateway, type GatewayFixture } from "./support/gateway-fixture.ts";
import { attributesOf as attr, GrpcCollector, HttpCollector } from "./support/otlp-collectors.ts";

const traceId = "4bf92f3577b34da6a3ce929d0e0e4736";
const callerSpan = "00f067aa0ba902b7";

describe("the gateway's own spans, to an OTLP collector", () => {
  let collector: HttpCollector;
  let upstream: FakeUpstream;
  let gw: GatewayFixture;
  beforeAll(async () => {
    collector = await new HttpCollector().start();
    upstream = await new FakeUpstream().start();
    gw = await startGateway({
      config: {
        upstreamUrl: upstream.url,
        upstreamKey: "up-key",
        upstreamSecret: "up-secret-0123456789",
        otlpTracesUrl: collector.url,
        // A hosted collector's token, as OpenTelemetry writes it.
        otlpHeaders: "authorization=Bearer%20collector-token-123, x-scope-orgid=shop",
        serviceName: "gateway-under-test",
        // Every call with no traceparent is a trace of its own here (OpenTelemetry's sampler setting; below, the per-mille one).
        tracesSampler: "parentbased_always_on",
      },
    });
  });
  afterAll(async () => {
    await gw.close();
    await upstream.stop();
    await collector.stop();
  });

  const legacy = async (extra: Record<string, string>, params: Record<string, string> = {}) => {
    const q = new URLSearchParams({ key: gw.account.key, secret: gw.account.secret, num_iid: demo.retailNumIid, cache: "no", ...params });
    const res = await fetch(`${gw.base}/retail/item_get/?${q}`, { headers: extra });
    return (await res.json()) as { error_code: string; request_id: string };
  };

  it("make a call a server span under the caller's, and its purchase a client span under it, whose id the provider gets as its parent", async () => {
    const before = upstream.requests.length;
    const answer = await legacy({ traceparent: `00-${traceId}-${callerSpan}-01`, tracestate: "vendor=abc" });
    expect(answer.error_code).toBe("0000");
    const server = await collector.next((s) => attr(s)["gateway.request_id"] === answer.request_id);
    // Sampled (0x01), its parent's being remote known (0x100) and true (0x200): the caller's.
    expect([server.traceId, server.parentSpanId, server.kind, server.name, server.traceState, server.status, server.flags]).toEqual([traceId, callerSpan, 2, "/retail/item_get/", "vendor=abc", { code: 0 }, 0x301]);
    expect(attr(server)).toEqual({
      "gateway.operation": "retail/item_get",
      "gateway.transport": "legacy",
      "gateway.error_code": "0000",
      "gateway.charge": "charged",
      "gateway.cache_hit": false,
      "gateway.request_id": answer.request_id,
      "client.address": "127.0.0.1",
      "http.route": "/retail/item_get/",
    });
    expect(server.resource).toMatchObject({ "service.name": "gateway-under-test", "service.instance.id": "gw-1" });
    expect(BigInt(server.endTimeUnixNano)).toBeGreaterThan(BigInt(server.startTimeUnixNano));
    // The purchase: beneath the call's span; the provider was told it is the parent.
    const purchase = await collector.next((s) => s.parentSpanId === server.spanId);
    expect([purchase.traceId, purchase.kind, attr(purchase)["gateway.found"], attr(purchase)["gateway.source"], purchase.name, purchase.flags]).toEqual([traceId, 3, true, "upstream", "upstream retail/item_get", 0x101]);
    expect(attr(purchase)["gateway.upstream_requests"]).toBe("1");
    const sent = upstream.requests.slice(before).map((r) => [r.headers.traceparent, r.headers.tracestate]);
    expect(sent).toEqual([[`00-${traceId}-${purchase.spanId}-01`, "vendor=abc"]]);
    expect(server.scope).toEqual({ name: "gateway-under-test", version: server.resource["service.version"] });
    // Spans never carry a credential, and go as OTLP's binary encoding (OpenTelemetry's default) to the URL as written.
    expect(JSON.stringify(collector.spans)).not.toContain(gw.account.secret);
    expect(JSON.stringify(collector.spans)).not.toContain(gw.account.key);
    expect(new Set(collector.received.map((r) => r.contentType))).toEqual(new Set(["application/x-protobuf"]));
    expect(new Set(collector.paths)).toEqual(new Set(["/v1/traces"]));
    // Each batch carries the collector's headers.
    expect(collector.received.every((r) => r.headers.authorization === "Bearer collector-token-123" && r.headers["x-scope-orgid"] === "shop")).toBe(true);
  });

  it("record nothing for a caller that did not sample its trace, whose context goes on to the provider as it came", async () => {
    const before = upstream.requests.length;
    const spans = collector.spans.length;
    const answer = await legacy({ traceparent: `00-${traceId}-${callerSpan}-00` });
    expect(answer.error_code).toBe("0000");
    expect(upstream.requests.slice(before).map((r) => r.headers.traceparent)).toEqual([`00-${traceId}-${callerSpan}-00`]);
    // A later call's span comes: the unsampled one sent none before it.
    const marker = await legacy({ traceparent: `00-${"1".repeat(32)}-${callerSpan}-01` });
    await collector.next((s) => attr(s)["gateway.request_id"] === marker.request_id);
    expect(collector.spans.slice(spans).filter((s) => attr(s)["gateway.request_id"] === answer.request_id)).toEqual([]);
  });

  it("make a call that sent no traceparent a trace of its own at the configured ratio, and name an RPC by its method", async () => {
    const before = upstream.requests.length;
    const r = await createClient(RetailService, createGrpcTransport({ baseUrl: gw.base })).itemGet(
      { numIid: demo.retailNumIid, cache: 2 /* no */ },
      { headers: { "x-api-key": gw.account.key, "x-api-secret": gw.account.secret } },
    );
    const server = await collector.next((s) => attr(s)["gateway.request_id"] === r.status!.requestId);
    // A root: its parent's being remote is known, and false.
    expect([server.parentSpanId, server.name, server.kind, server.flags]).toEqual([undefined, "gateway.catalogue.v1.RetailService/ItemGet", 2, 0x101]);
    expect(server.traceId).toMatch(/^[0-9a-f]{32}$/);
    expect(attr(server)).toMatchObject({ "rpc.system": "grpc", "rpc.service": "gateway.catalogue.v1.RetailService", "rpc.method": "ItemGet", "gateway.transport": "grpc" });
    // The provider joins the gateway's trace.
    const purchase = await collector.next((s) => s.parentSpanId === server.spanId);
    expect(upstream.requests.slice(before).map((r) => r.headers.traceparent)).toEqual([`00-${server.traceId}-${purchase.spanId}-01`]);
  });

  it("mark a fault of the source as the span's error, and a refusal of the caller's request as none", async () => {
    const refused = await legacy({}, { num_iid: "not-a-number" });
    expect(refused.error_code).toBe("4003");
    const span = await collector.next((s) => attr(s)["gateway.request_id"] === refused.request_id);
    expect([attr(span)["gateway.error_code"], attr(span)["gateway.charge"], span.status]).toEqual(["4003", "ignored", { code: 0 }]);
    upstream.script = () => ({ kind: "status", status: 502 });
    const failed = await legacy({}, { num_iid: "1234567" }).finally(() => (upstream.script = () => ({ kind: "normal" })));
    expect(failed.error_code).toBe("4002");
    const failedSpan = await collector.next((s) => attr(s)["gateway.request_id"] === failed.request_id);
    expect([attr(failedSpan)["gateway.charge"], failedSpan.status.code]).toEqual(["uncharged", 2]);
    expect(failedSpan.status.message).toMatch(/./);
  });
});

describe("log lines that lead to the call's span", () => {
  let collector: HttpCollector;
  let gw: GatewayFixture;
  const lines: string[] = [];
  beforeAll(async () => {
    collector = await new HttpCollector().start();
    // An allowed origin: a browser's call goes by Fastify's route, not the fast paths before it.
    gw = await startGateway({ logLines: lines, app: { corsOrigins: ["https://shop.example"] }, config: { otlpTracesUrl: collector.url, tracesSampler: "parentbased_always_on" } });
  });
  afterAll(async () => {
    await gw.close();
    await collector.stop();
  });

  type Line = { msg: string; requestId?: string; traceId?: string; spanId?: string; errorCode?: string; req?: { traceId?: string }; res?: { statusCode: number } };
  const parsed = () => lines.map((l) => JSON.parse(l) as Line);
  /** A request's line with `msg`, once written (the last is written as the answer finishes, which may be after the client has it). */
  const lineOf = async (requestId: string, msg: string): Promise<Line> => {
    await expect.poll(() => parsed().some((l) => l.requestId === requestId && l.msg === msg)).toBe(true);
    return parsed().find((l) => l.requestId === requestId && l.msg === msg)!;
  };
  const auth = (extra: Record<string, string> = {}) => ({ "x-api-key": gw.account.key, "x-api-secret": gw.account.secret, ...extra });
  const sampled = `00-${traceId}-${callerSpan}-01`;

  /** A legacy call: a GET takes the fast path before Fastify, a POST (a form body) Fastify's route. */
  const legacy = async (method: "GET" | "POST", traceparent?: string): Promise<string> => {
    const q = new URLSearchParams({ key: gw.account.key, secret: gw.account.secret, num_iid: demo.retailNumIid });
    const headers = traceparent === undefined ? {} : { traceparent };
    const res = method === "GET" ? await fetch(`${gw.base}/retail/item_get/?${q}`, { headers }) : await fetch(`${gw.base}/retail/item_get/`, { method, headers, body: q });
    return ((await res.json()) as { request_id: string }).request_id;
  };
  const rpc = async (transport: Parameters<typeof createClient>[1], callOptions: { timeoutMs?: number } = {}): Promise<string> => {
    const r = await createClient(RetailService, transport).itemGet({ numIid: demo.retailNumIid }, { headers: auth({ traceparent: sampled }), ...callOptions });
    return r.status!.requestId;
  };
  const browser = async (): Promise<string> => {
    const res = await fetch(`${gw.base}/gateway.catalogue.v1.RetailService/ItemGet`, {
      method: "POST",
      headers: auth({ origin: "https://shop.example", "content-type": "application/json", traceparent: sampled }),
      body: JSON.stringify({ numIid: demo.retailNumIid }),
    });
    return ((await res.json()) as { status: { requestId: string } }).status.requestId;
  };

  it("name the gateway's span (traceId, spanId) and the call's code on the request completed line, on every path a call can take", async () => {
    const paths: [string, () => Promise<string>][] = [
      ["legacy GET, the fast path", () => legacy("GET", sampled)],
      ["legacy POST, Fastify's route", () => legacy("POST", sampled)],
      ["Connect JSON, fast path before Fastify", () => rpc(createConnectTransport({ baseUrl: gw.base, httpVersion: "1.1" }))],
      ["Connect binary, fast path before Fastify", () => rpc(createConnectTransport({ baseUrl: gw.base, httpVersion: "1.1", useBinaryFormat: true }))],
      ["Connect with a timeout, connect-node's handler on Fastify", () => rpc(createConnectTransport({ baseUrl: gw.base, httpVersion: "1.1" }), { timeoutMs: 30_000 })],
      ["Connect from a page, Fastify's route", browser],
      ["gRPC, the stream path", () => rpc(createGrpcTransport({ baseUrl: gw.base }))],
      ["gRPC with a deadline, handed to connect-node", () => rpc(createGrpcTransport({ baseUrl: gw.base }), { timeoutMs: 30_000 })],
      ["gRPC-Web, connect-node's handler on Fastify", () => rpc(createGrpcWebTransport({ baseUrl: gw.base, httpVersion: "1.1" }))],
    ];
    for (const [name, call] of paths) {
      const requestId = await call();
      const span = await collector.next((s) => attr(s)["gateway.request_id"] === requestId);
      const completed = await lineOf(requestId, "request completed");
      expect([completed.traceId, completed.spanId, completed.errorCode], name).toEqual([traceId, span.spanId, "0000"]);
      expect(span.parentSpanId, name).toBe(callerSpan);
      expect((await lineOf(requestId, "incoming request")).req?.traceId, name).toBe(traceId);
    }
  });

  it("name the trace the gateway started for a call that sent none, and nothing for a call it did not record", async () => {
    const root = await legacy("GET");
    const span = await collector.next((s) => attr(s)["gateway.request_id"] === root);
    expect(span.parentSpanId).toBeUndefined();
    const completed = await lineOf(root, "request completed");
    expect([completed.traceId, completed.spanId]).toEqual([span.traceId, span.spanId]);
    // Before the call the trace did not exist: the first line cannot name it.
    expect((await lineOf(root, "incoming request")).req?.traceId).toBeUndefined();

    const unsampled = await legacy("POST", `00-${traceId}-${callerSpan}-00`);
    const line = await lineOf(unsampled, "request completed");
    expect([line.res?.statusCode, line.errorCode]).toEqual([200, "0000"]);
    expect("spanId" in line || "traceId" in line).toBe(false);
    // The caller's trace id is still on its first line; its parent id is on none.
    expect((await lineOf(unsampled, "incoming request")).req?.traceId).toBe(traceId);
    expect(lines.join("\n")).not.toContain(callerSpan);
  });

  it("name the span on the error line of a call that failed inside the gateway", async () => {
    const spans: SpanData[] = [];
    const logged: Record<string, unknown>[] = [];
    const failing: CatalogueSource = { label: "broken", fetch: () => Promise.reject(new Error("disk on fire")) };
    const core = gw.gatewayWith(new Map([["retail", failing]]), { error: (obj) => logged.push(obj as Record<string, unknown>) }, new Tracer({ add: (s) => spans.push(s) }, 1));
    const client = createClient(RetailService, createRouterTransport(catalogueRoutes(core, operations)));
    const err = await client.itemGet({ numIid: demo.retailNumIid }, { headers: auth({ traceparent: sampled }) }).then(() => undefined, ConnectError.from);
    expect(err?.code).toBe(Code.Internal);
    const span = spans.find((s) => s.kind === "server")!;
    expect(logged).toEqual([expect.objectContaining({ requestId: span.attributes["gateway.request_id"], traceId, spanId: span.spanId })]);
  });
});

describe("the other ways OpenTelemetry sends spans", () => {
  const call = async (gw: GatewayFixture, traceparent: string) => {
    const q = new URLSearchParams({ key: gw.account.key, secret: gw.account.secret, num_iid: demo.retailNumIid });
    return (await (await fetch(`${gw.base}/retail/item_get/?${q}`, { headers: { traceparent } })).json()) as { error_code: string; request_id: string };
  };

  it("send OTLP/gRPC, gzip-compressed, with the collector's headers as metadata, to a grpc-js collector", async () => {
    const collector = await new GrpcCollector().start();
    const gw = await startGateway({ config: { otlpTracesUrl: collector.url, otlpProtocol: "grpc", otlpCompression: "gzip", otlpHeaders: "authorization=Bearer%20grpc-token-456" } });
    try {
      const answer = await call(gw, `00-${traceId}-${callerSpan}-01`);
      expect(answer.error_code).toBe("0000");
      const span = await collector.next((s) => attr(s)["gateway.request_id"] === answer.request_id);
      expect([span.traceId, span.parentSpanId, span.kind, span.flags, attr(span)["gateway.transport"]]).toEqual([traceId, callerSpan, 2, 0x301, "legacy"]);
      // grpc-js decompressed it (it hides grpc-encoding; otlp-export.test.ts reads the frames themselves).
      expect(collector.received.every((r) => r.headers.authorization === "Bearer grpc-token-456")).toBe(true);
    } finally {
      await gw.close();
      await collector.stop();
    }
  });

  it("send OTLP/HTTP JSON to a base endpoint's /v1/traces", async () => {
    const collector = await new HttpCollector().start();
    const base = collector.url.replace(/\/v1\/traces$/, "/");
    const gw = await startGateway({ config: { otlpEndpoint: base, otlpProtocol: "http/json" } });
    try {
      const answer = await call(gw, `00-${traceId}-${callerSpan}-01`);
      const span = await collector.next((s) => attr(s)["gateway.request_id"] === answer.request_id);
      expect([span.traceId, span.flags, collector.paths[0], collector.received[0]!.contentType]).toEqual([traceId, 0x301, "/v1/traces", "application/json"]);
    } finally {
      await gw.close();
      await collector.stop();
    }
  });
});

describe("a collector that is away or does not answer", () => {
  it("holds no call up: its spans are dropped and counted, and calls go on", async () => {
    const collector = await new HttpCollector().start();
    collector.answer = () => ({ kind: "never" });
    const gw = await startGateway({ config: { otlpTracesUrl: collector.url, traceSamplePerMille: 1000 } });
    try {
      const started = performance.now();
      for (let i = 0; i < 5; i++) {
        const r = await fetch(`${gw.base}/retail/item_get/?${new URLSearchParams({ key: gw.account.key, secret: gw.account.secret, num_iid: demo.retailNumIid })}`);
        expect(((await r.json()) as { error_code: string }).error_code).toBe("0000");
      }
      expect(performance.now() - started).toBeLessThan(4000);
    } finally {
      await collector.stop();
    }
    // The batch in flight fails once the collector is gone; close sends what is left (and loses it too) without hanging.
    await gw.close();
    const metric = (await gw.runtime.metrics.registry.getSingleMetric("gateway_spans_total")!.get()) as { values: { labels: Record<string, string>; value: number }[] };
    // Five calls' spans, and the two reads of the embedded catalogue beneath the first two (a local answer is kept from its second ask).
    expect(metric.values.find((v) => v.labels.outcome === "dropped")?.value).toBe(7);
  });

  it("drops new spans past its queue, counting each", () => {
    const dropped: number[] = [];
    const exporter = new OtlpTraceExporter({ url: "http://127.0.0.1:9/v1/traces", serviceName: "s", instanceId: "i", serviceVersion: "v", maxQueued: 3, batchSpans: 100, intervalMs: 60_000, onSpans: (o, n) => o === "dropped" && dropped.push(n) });
    const tracer = new Tracer(exporter, 1);
    for (let i = 0; i < 5; i++) tracer.startCall(undefined, "x")!.end({});
    expect(dropped).toEqual([1, 1]);
  });
});
