// The gateway's own spans (src/core/tracing.ts), sent to an OpenTelemetry collector over OTLP/HTTP
// (src/exporters/otlp-traces.ts). The collector is a real HTTP server on loopback that keeps what it is sent
// (or, on purpose, does not answer); the provider is the fake upstream, which records the traceparent of each
// purchase.
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Tracer } from "../src/core/tracing.ts";
import { OtlpTraceExporter } from "../src/exporters/otlp-traces.ts";
import { RetailService } from "../src/gen/gateway/catalogue/v1/retail_pb.js";
import { FakeUpstream } from "./support/fake-upstream.ts";
import { demo, startGateway, type GatewayFixture } from "./support/gateway-fixture.ts";

interface OtlpSpan {
  traceId: string;
  spanId: string;
  parentSpanId?: string;
  traceState?: string;
  name: string;
  kind: number;
  startTimeUnixNano: string;
  endTimeUnixNano: string;
  attributes: { key: string; value: Record<string, unknown> }[];
  status: { code: number; message?: string };
}

/** An OTLP/HTTP collector on loopback: keeps each request's spans, with the resource they came with. */
class Collector {
  readonly spans: (OtlpSpan & { resource: Record<string, unknown> })[] = [];
  readonly contentTypes: string[] = [];
  readonly headers: http.IncomingHttpHeaders[] = [];
  /** While set, requests are held unanswered. */
  silent = false;
  private readonly server = http.createServer((req, res) => {
    let body = "";
    req.on("data", (d: Buffer) => (body += d.toString()));
    req.on("end", () => {
      if (this.silent) return;
      this.contentTypes.push(String(req.headers["content-type"]));
      this.headers.push(req.headers);
      const doc = JSON.parse(body) as { resourceSpans: { resource: { attributes: OtlpSpan["attributes"] }; scopeSpans: { spans: OtlpSpan[] }[] }[] };
      for (const rs of doc.resourceSpans) {
        const resource = Object.fromEntries(rs.resource.attributes.map((a) => [a.key, Object.values(a.value)[0]]));
        for (const ss of rs.scopeSpans) for (const s of ss.spans) this.spans.push({ ...s, resource });
      }
      res.writeHead(200, { "content-type": "application/json" }).end("{}");
    });
  });
  url = "";
  async start(): Promise<this> {
    await new Promise<void>((r) => this.server.listen(0, "127.0.0.1", r));
    this.url = `http://127.0.0.1:${(this.server.address() as AddressInfo).port}/v1/traces`;
    return this;
  }
  stop(): Promise<void> {
    this.server.closeAllConnections();
    return new Promise((r) => this.server.close(() => r()));
  }
  /** Waits (up to 5 s) until a span matching `match` has come. */
  async next(match: (s: OtlpSpan) => boolean): Promise<OtlpSpan & { resource: Record<string, unknown> }> {
    for (let i = 0; i < 200; i++) {
      const found = this.spans.find(match);
      if (found !== undefined) return found;
      await new Promise((r) => setTimeout(r, 25));
    }
    throw new Error("no such span came");
  }
}

const attr = (s: OtlpSpan) => Object.fromEntries(s.attributes.map((a) => [a.key, Object.values(a.value)[0]]));
const traceId = "4bf92f3577b34da6a3ce929d0e0e4736";
const callerSpan = "00f067aa0ba902b7";

describe("the gateway's own spans, to an OTLP collector", () => {
  let collector: Collector;
  let upstream: FakeUpstream;
  let gw: GatewayFixture;
  beforeAll(async () => {
    collector = await new Collector().start();
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
        // Every call with no traceparent is a trace of its own here.
        traceSamplePerMille: 1000,
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
    expect([server.traceId, server.parentSpanId, server.kind, server.name, server.traceState, server.status]).toEqual([traceId, callerSpan, 2, "/retail/item_get/", "vendor=abc", { code: 0 }]);
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
    expect([purchase.traceId, purchase.kind, attr(purchase)["gateway.found"], attr(purchase)["gateway.source"], purchase.name]).toEqual([traceId, 3, true, "upstream", "upstream retail/item_get"]);
    expect(attr(purchase)["gateway.upstream_requests"]).toBe("1");
    const sent = upstream.requests.slice(before).map((r) => [r.headers.traceparent, r.headers.tracestate]);
    expect(sent).toEqual([[`00-${traceId}-${purchase.spanId}-01`, "vendor=abc"]]);
    // Spans never carry a credential, and go as OTLP's JSON.
    expect(JSON.stringify(collector.spans)).not.toContain(gw.account.secret);
    expect(JSON.stringify(collector.spans)).not.toContain(gw.account.key);
    expect(new Set(collector.contentTypes)).toEqual(new Set(["application/json"]));
    // Each batch carries the collector's headers.
    expect(collector.headers.every((h) => h.authorization === "Bearer collector-token-123" && h["x-scope-orgid"] === "shop")).toBe(true);
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
    expect([server.parentSpanId, server.name, server.kind]).toEqual([undefined, "gateway.catalogue.v1.RetailService/ItemGet", 2]);
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

describe("a collector that is away or does not answer", () => {
  it("holds no call up: its spans are dropped and counted, and calls go on", async () => {
    const collector = await new Collector().start();
    collector.silent = true;
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
