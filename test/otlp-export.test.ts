// The exporter of the gateway's own spans (src/exporters/otlp-traces.ts) against collectors on loopback
// (test/support/otlp-collectors.ts): every encoding OpenTelemetry's exporters speak, held to what OpenTelemetry's
// own SDK sends for the same spans; a collector that throttles, refuses, takes part of a batch, falls silent or
// asks for a client certificate. The gateway end to end is in tracing.test.ts; the settings in config.test.ts.
import { X509Certificate } from "node:crypto";
import { fromBinary } from "@bufbuild/protobuf";
import { ROOT_CONTEXT, SpanKind, SpanStatusCode, trace, type HrTime } from "@opentelemetry/api";
import { TraceState } from "@opentelemetry/core";
import { JsonTraceSerializer, ProtobufTraceSerializer } from "@opentelemetry/otlp-transformer";
import { resourceFromAttributes } from "@opentelemetry/resources";
import { InMemorySpanExporter, SimpleSpanProcessor, TracerProvider, type ReadableSpan } from "@opentelemetry/sdk-trace";
import * as grpc from "@grpc/grpc-js";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { gunzipSync } from "node:zlib";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import type { SpanData } from "../src/core/tracing.ts";
import { OtlpTraceExporter, type OtlpTracesOptions, type SpanOutcome } from "../src/exporters/otlp-traces.ts";
import { ExportTraceServiceRequestSchema } from "../src/gen/opentelemetry/proto/collector/trace/v1/trace_service_pb.js";
import { makeCertificate } from "./support/certificates.ts";
import { decodeBinary, decodeJson, GrpcCollector, HttpCollector, type ReceivedSpan } from "./support/otlp-collectors.ts";

const traceId = "4bf92f3577b34da6a3ce929d0e0e4736";
const t0 = 1_764_000_000_123_456_789n;

/** A call's span under a caller's, the purchase beneath it (a fault), and a call that began a trace of its own. */
const spans: SpanData[] = [
  {
    traceId,
    spanId: "00000000000000a1",
    parentSpanId: "00f067aa0ba902b7",
    remoteParent: true,
    traceState: "vendor=abc,other=1",
    name: "/retail/item_get/",
    kind: "server",
    startNs: t0,
    endNs: t0 + 2_500_000n,
    attributes: { "gateway.operation": "retail/item_get", "gateway.error_code": "0000", "gateway.cache_hit": false, "gateway.found": true, "gateway.upstream_requests": 3, "gateway.delta": -7, "gateway.share": 0.25, "gateway.title": "价格 ✓ \"quoted\"\n" },
    error: undefined,
  },
  {
    traceId,
    spanId: "00000000000000a2",
    parentSpanId: "00000000000000a1",
    remoteParent: false,
    traceState: "vendor=abc,other=1",
    name: "upstream retail/item_get",
    kind: "client",
    startNs: t0 + 100_000n,
    endNs: t0 + 2_000_000n,
    attributes: { "gateway.source": "upstream" },
    error: "the provider answered HTTP 502",
  },
  {
    traceId: "0af7651916cd43dd8448eb211c80319c",
    spanId: "b7ad6b7169203331",
    parentSpanId: undefined,
    remoteParent: false,
    traceState: undefined,
    name: "gateway.catalogue.v1.RetailService/ItemGet",
    kind: "server",
    startNs: t0 + 5_000_000_000n,
    endNs: t0 + 5_000_900_001n,
    attributes: { "rpc.system": "grpc" },
    error: undefined,
  },
];

const service = { serviceName: "gateway-under-test", instanceId: "gw-7", serviceVersion: "1.2.3" };
const resource = { "service.name": "gateway-under-test", "service.instance.id": "gw-7", "service.version": "1.2.3" };
const quick = { attempts: 3, firstDelayMs: 20, maxDelayMs: 50, longestHintMs: 2000, longestPauseMs: 60_000 };

/** An exporter that sends each batch of `spans.length` at once, and what it reported. */
function exporterTo(url: string, extra: Partial<OtlpTracesOptions> = {}) {
  const outcomes: Record<SpanOutcome, number> = { exported: 0, rejected: 0, dropped: 0 };
  const errors: string[] = [];
  const exporter = new OtlpTraceExporter({
    url,
    ...service,
    batchSpans: spans.length,
    intervalMs: 60_000,
    retry: quick,
    onSpans: (o, n) => (outcomes[o] += n),
    onError: (e) => errors.push((e as Error).message),
    ...extra,
  });
  return {
    exporter,
    outcomes,
    errors,
    /** Adds the spans, and waits (up to 10 s) until every one is told of. */
    async send(): Promise<void> {
      const before = outcomes.exported + outcomes.rejected + outcomes.dropped;
      for (const s of spans) exporter.add(s);
      for (let i = 0; i < 400 && outcomes.exported + outcomes.rejected + outcomes.dropped < before + spans.length; i++) await new Promise((r) => setTimeout(r, 25));
    },
  };
}

/** The spans as they must arrive, in OTLP JSON's shape. */
const expected: ReceivedSpan[] = spans.map((s) => ({
  traceId: s.traceId,
  spanId: s.spanId,
  ...(s.parentSpanId !== undefined ? { parentSpanId: s.parentSpanId } : {}),
  ...(s.traceState !== undefined ? { traceState: s.traceState } : {}),
  flags: 0x101 | (s.remoteParent ? 0x200 : 0),
  name: s.name,
  kind: s.kind === "server" ? 2 : 3,
  startTimeUnixNano: String(s.startNs),
  endTimeUnixNano: String(s.endNs),
  attributes: Object.entries(s.attributes).map(([key, v]) => ({
    key,
    value: typeof v === "string" ? { stringValue: v } : typeof v === "boolean" ? { boolValue: v } : Number.isInteger(v) ? { intValue: String(v) } : { doubleValue: v },
  })),
  status: s.error !== undefined ? { code: 2, message: s.error } : { code: 0 },
  resource,
  scope: { name: service.serviceName, version: service.serviceVersion },
}));

describe("the spans, in every encoding OpenTelemetry's exporters speak", () => {
  for (const [protocol, gzip] of [["http/protobuf", false], ["http/protobuf", true], ["http/json", false], ["http/json", true]] as const) {
    it(`arrive whole over ${protocol}${gzip ? ", gzip-compressed" : ""}`, async () => {
      const collector = await new HttpCollector().start();
      const x = exporterTo(collector.url, { protocol, gzip, headers: { authorization: "Bearer t-1" } });
      try {
        await x.send();
        expect(x.outcomes).toEqual({ exported: 3, rejected: 0, dropped: 0 });
        expect(collector.spans).toEqual(expected);
        const r = collector.received[0]!;
        expect([r.contentType, r.contentEncoding, r.headers.authorization]).toEqual([protocol === "http/json" ? "application/json" : "application/x-protobuf", gzip ? "gzip" : undefined, "Bearer t-1"]);
      } finally {
        await x.exporter.flush();
        await collector.stop();
      }
    });
  }

  it("arrive whole over gRPC, at a grpc-js collector, with the headers as metadata", async () => {
    const collector = await new GrpcCollector().start();
    const x = exporterTo(collector.url, { protocol: "grpc", gzip: true, headers: { authorization: "Bearer t-2" } });
    try {
      await x.send();
      expect(x.outcomes).toEqual({ exported: 3, rejected: 0, dropped: 0 });
      expect(collector.spans).toEqual(expected);
      expect(collector.received[0]!.headers.authorization).toBe("Bearer t-2");
    } finally {
      await x.exporter.flush();
      await collector.stop();
    }
  });

  it("go over gRPC as gzip-compressed frames when asked, and plain ones when not", async () => {
    // grpc-js hides a message's encoding; this collector reads the HTTP/2 stream itself.
    const seen: { encoding: unknown; flag: number; spans: ReceivedSpan[]; path: unknown }[] = [];
    const server = http2.createServer();
    server.on("stream", (stream, headers) => {
      const chunks: Buffer[] = [];
      stream.on("data", (c: Buffer) => chunks.push(c));
      stream.on("end", () => {
        const body = Buffer.concat(chunks);
        const flag = body[0]!;
        const message = body.subarray(5, 5 + body.readUInt32BE(1));
        seen.push({ encoding: headers["grpc-encoding"], flag, spans: decodeBinary(flag === 1 ? gunzipSync(message) : message), path: headers[":path"] });
        stream.respond({ ":status": 200, "content-type": "application/grpc" }, { waitForTrailers: true });
        stream.on("wantTrailers", () => stream.sendTrailers({ "grpc-status": "0" }));
        stream.end(Buffer.from([0, 0, 0, 0, 0]));
      });
    });
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
    const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    try {
      for (const gzip of [true, false]) {
        const x = exporterTo(url, { protocol: "grpc", gzip });
        await x.send();
        expect(x.outcomes.exported).toBe(3);
        await x.exporter.flush();
      }
      expect(seen.map((s) => [s.encoding, s.flag, s.path])).toEqual([
        ["gzip", 1, "/opentelemetry.proto.collector.trace.v1.TraceService/Export"],
        [undefined, 0, "/opentelemetry.proto.collector.trace.v1.TraceService/Export"],
      ]);
      expect(seen.map((s) => s.spans)).toEqual([expected, expected]);
    } finally {
      await new Promise((r) => server.close(r));
    }
  });
});

describe("the spans are what OpenTelemetry's own SDK sends", () => {
  const hr = (ns: bigint): HrTime => [Number(ns / 1_000_000_000n), Number(ns % 1_000_000_000n)];

  /** The same spans made by OpenTelemetry's SDK (its ids, times, parents, flags, status), as its exporters get them. */
  function sdkSpans(): ReadableSpan[] {
    const memory = new InMemorySpanExporter();
    let next = spans[0]!;
    const provider = new TracerProvider({
      resource: resourceFromAttributes(resource),
      idGenerator: { generateTraceId: () => next.traceId, generateSpanId: () => next.spanId },
      spanProcessors: [new SimpleSpanProcessor({ exporter: memory })],
    });
    const tracer = provider.getTracer(service.serviceName, service.serviceVersion);
    for (const s of spans) {
      next = s;
      const parent =
        s.parentSpanId === undefined
          ? ROOT_CONTEXT
          : trace.setSpanContext(ROOT_CONTEXT, { traceId: s.traceId, spanId: s.parentSpanId, traceFlags: 1, isRemote: s.remoteParent, ...(s.traceState !== undefined ? { traceState: new TraceState(s.traceState) } : {}) });
      const span = tracer.startSpan(s.name, { kind: s.kind === "server" ? SpanKind.SERVER : SpanKind.CLIENT, startTime: hr(s.startNs), attributes: s.attributes }, parent);
      if (s.error !== undefined) span.setStatus({ code: SpanStatusCode.ERROR, message: s.error });
      span.end(hr(s.endNs));
    }
    return memory.getFinishedSpans();
  }

  it("read with the gateway's OTLP schema, the SDK's binary request holds no field the schema lacks, and the same spans as the gateway's", async () => {
    const theirs = ProtobufTraceSerializer.serializeRequest(sdkSpans())!;
    // Every field OpenTelemetry writes (dropped counts, events, links and flags too) is one the schema knows, at the same number.
    expect(decodeBinary(theirs)).toEqual(expected);
    const collector = await new HttpCollector().start();
    const x = exporterTo(collector.url, { protocol: "http/protobuf" });
    try {
      await x.send();
      expect(collector.spans).toEqual(decodeBinary(theirs));
      // And the gateway's whole request, read back, equals the SDK's, field for field (the SDK writes zeros the gateway leaves out).
      const ours = fromBinary(ExportTraceServiceRequestSchema, new Uint8Array(collector.bodies[0]!));
      const sdk = fromBinary(ExportTraceServiceRequestSchema, theirs);
      expect(ours.resourceSpans[0]!.scopeSpans[0]!.spans).toEqual(sdk.resourceSpans[0]!.scopeSpans[0]!.spans);
    } finally {
      await x.exporter.flush();
      await collector.stop();
    }
  });

  it("the SDK's JSON request and the gateway's read the same", async () => {
    const theirs = new TextDecoder().decode(JsonTraceSerializer.serializeRequest(sdkSpans()));
    const collector = await new HttpCollector().start();
    const x = exporterTo(collector.url, { protocol: "http/json" });
    try {
      await x.send();
      // The SDK writes `flags` only in its binary form, 64-bit integers as JSON numbers (OTLP's JSON says strings;
      // receivers take both), and its empty lists and zero counts; otherwise the two agree.
      const strip = (list: ReceivedSpan[]) =>
        list.map((s) => ({
          ...Object.fromEntries(Object.entries(s).filter(([k]) => !["flags", "droppedAttributesCount", "droppedEventsCount", "droppedLinksCount", "events", "links"].includes(k))),
          attributes: s.attributes.map((a) => ({ key: a.key, value: "intValue" in a.value ? { intValue: String(a.value.intValue) } : a.value })),
        }));
      expect(strip(collector.spans)).toEqual(strip(decodeJson(theirs)));
    } finally {
      await x.exporter.flush();
      await collector.stop();
    }
  });
});

describe("a collector that cannot take a batch now", () => {
  let collector: HttpCollector;
  beforeAll(async () => {
    collector = await new HttpCollector().start();
  });
  afterAll(() => collector.stop());
  const fresh = () => {
    collector.received.length = 0;
    collector.arrivals.length = 0;
    collector.bodies.length = 0;
  };

  it("is asked again after 503, 502 and 504, whose Retry-After is kept, until it takes the batch", async () => {
    fresh();
    collector.answer = (n) => (n === 1 ? { kind: "status", status: 503, retryAfter: "0" } : n === 2 ? { kind: "status", status: 502 } : n === 3 ? { kind: "status", status: 504 } : { kind: "ok" });
    const x = exporterTo(collector.url, { retry: { ...quick, attempts: 4 } });
    await x.send();
    expect([x.outcomes, collector.received.length, x.errors]).toEqual([{ exported: 3, rejected: 0, dropped: 0 }, 4, []]);
    expect(collector.received.every((r) => r.spans.length === 3)).toBe(true);
    await x.exporter.flush();
  });

  it("waits out a 429's Retry-After before asking again", async () => {
    fresh();
    collector.answer = (n) => (n === 1 ? { kind: "status", status: 429, retryAfter: "1" } : { kind: "ok" });
    const x = exporterTo(collector.url);
    await x.send();
    expect(x.outcomes.exported).toBe(3);
    expect(collector.arrivals[1]! - collector.arrivals[0]!).toBeGreaterThanOrEqual(950);
    await x.exporter.flush();
  });

  it("drops a batch it refuses (400) at once, with the collector's reason, and tries no more", async () => {
    fresh();
    collector.answer = () => ({ kind: "status", status: 400, message: "span name\ntoo long" });
    const x = exporterTo(collector.url);
    await x.send();
    expect([x.outcomes, collector.received.length, x.errors]).toEqual([{ exported: 0, rejected: 0, dropped: 3 }, 1, ["the collector answered HTTP 400: span name too long"]]);
    await x.exporter.flush();
  });

  it("drops a batch after its last try, saying how many", async () => {
    fresh();
    collector.answer = () => ({ kind: "status", status: 503 });
    const x = exporterTo(collector.url);
    await x.send();
    expect([x.outcomes.dropped, collector.received.length, x.errors]).toEqual([3, 3, ["the collector answered HTTP 503 (tried 3 times)"]]);
    await x.exporter.flush();
  });

  it("drops a batch whose Retry-After is past the longest wait, sends nothing until then, and sends what waited on stopping", async () => {
    fresh();
    collector.answer = (n) => (n === 1 ? { kind: "status", status: 503, retryAfter: "120" } : { kind: "ok" });
    const x = exporterTo(collector.url);
    await x.send();
    expect([x.outcomes.dropped, collector.received.length]).toEqual([3, 1]);
    // A full batch now waits: the collector asked for two minutes.
    for (const s of spans) x.exporter.add(s);
    await new Promise((r) => setTimeout(r, 500));
    expect(collector.received.length).toBe(1);
    await x.exporter.flush();
    expect([x.outcomes.exported, collector.received.length]).toEqual([3, 2]);
  });

  it("holds a collector's pause to the longest it keeps, whatever Retry-After says", async () => {
    fresh();
    collector.answer = (n) => (n === 1 ? { kind: "status", status: 503, retryAfter: "99999999" } : { kind: "ok" });
    const x = exporterTo(collector.url, { retry: { ...quick, longestPauseMs: 600 } });
    await x.send();
    expect([x.outcomes.dropped, collector.received.length]).toEqual([3, 1]);
    await x.send();
    expect([x.outcomes.exported, collector.received.length]).toEqual([3, 2]);
    expect(collector.arrivals[1]! - collector.arrivals[0]!).toBeGreaterThanOrEqual(550);
    await x.exporter.flush();
  });

  it("times a collector's pause on a clock that does not step: the wall clock stepping back an hour does not stretch it", async () => {
    fresh();
    collector.answer = (n) => (n === 1 ? { kind: "status", status: 503, retryAfter: "99999999" } : { kind: "ok" });
    const x = exporterTo(collector.url, { retry: { ...quick, longestPauseMs: 600 } });
    await x.send();
    expect([x.outcomes.dropped, collector.received.length]).toEqual([3, 1]);
    vi.useFakeTimers({ toFake: ["Date"] });
    try {
      vi.setSystemTime(Date.now() - 3_600_000);
      await x.send();
    } finally {
      vi.useRealTimers();
    }
    expect([x.outcomes.exported, collector.received.length]).toEqual([3, 2]);
    expect(collector.arrivals[1]! - collector.arrivals[0]!).toBeLessThan(3000);
    await x.exporter.flush();
  });

  it("counts the spans a partial success refused, and says why, in both encodings", async () => {
    for (const protocol of ["http/protobuf", "http/json"] as const) {
      fresh();
      collector.answer = () => ({ kind: "ok", rejected: 2, message: "attribute value too long" });
      const x = exporterTo(collector.url, { protocol });
      await x.send();
      expect([x.outcomes, x.errors]).toEqual([{ exported: 1, rejected: 2, dropped: 0 }, ["the collector refused 2 of 3 spans: attribute value too long"]]);
      await x.exporter.flush();
    }
  });

  it("tries a collector that is not there as often as the policy says, then drops the batch", async () => {
    const gone = await new HttpCollector().start();
    const url = gone.url;
    await gone.stop();
    const x = exporterTo(url);
    await x.send();
    expect([x.outcomes.dropped, x.errors]).toEqual([3, ["the collector could not be reached (ECONNREFUSED) (tried 3 times)"]]);
    await x.exporter.flush();
  });

  it("stops within one request's limit when the collector never answers, counting what was lost", async () => {
    fresh();
    collector.answer = () => ({ kind: "never" });
    const x = exporterTo(collector.url, { timeoutMs: 300, batchSpans: 100 });
    for (const s of spans) x.exporter.add(s);
    const started = performance.now();
    await x.exporter.flush();
    expect(performance.now() - started).toBeLessThan(3000);
    expect([x.outcomes, x.errors]).toEqual([{ exported: 0, rejected: 0, dropped: 3 }, ["the collector did not answer in 300 ms"]]);
  });
});

describe("a gRPC collector that cannot take a batch now", () => {
  let collector: GrpcCollector;
  beforeAll(async () => {
    collector = await new GrpcCollector().start();
  });
  afterAll(() => collector.stop());

  it("is asked again after UNAVAILABLE, and after RESOURCE_EXHAUSTED only when it says when (RetryInfo)", async () => {
    collector.received.length = 0;
    collector.arrivals.length = 0;
    collector.answer = (n) => (n === 1 ? { kind: "error", code: grpc.status.UNAVAILABLE } : n === 2 ? { kind: "error", code: grpc.status.RESOURCE_EXHAUSTED, retryDelayMs: 300 } : { kind: "ok" });
    const x = exporterTo(collector.url, { protocol: "grpc" });
    await x.send();
    expect([x.outcomes, collector.received.length]).toEqual([{ exported: 3, rejected: 0, dropped: 0 }, 3]);
    expect(collector.arrivals[2]! - collector.arrivals[1]!).toBeGreaterThanOrEqual(250);
    await x.exporter.flush();
  });

  it("drops a batch at once on RESOURCE_EXHAUSTED without RetryInfo, and on INVALID_ARGUMENT", async () => {
    for (const code of [grpc.status.RESOURCE_EXHAUSTED, grpc.status.INVALID_ARGUMENT]) {
      collector.received.length = 0;
      collector.answer = () => ({ kind: "error", code });
      const x = exporterTo(collector.url, { protocol: "grpc" });
      await x.send();
      expect([x.outcomes.dropped, collector.received.length, x.errors]).toEqual([3, 1, [`the collector answered ${code === grpc.status.INVALID_ARGUMENT ? "InvalidArgument" : "ResourceExhausted"}: slow down`]]);
      await x.exporter.flush();
    }
  });

  it("drops a batch sent to a port that does not speak HTTP/2 (an OTLP/HTTP 4318 for a 4317), and stops without an uncaught error", async () => {
    const http1 = await new HttpCollector().start();
    const x = exporterTo(http1.url.replace("/v1/traces", ""), { protocol: "grpc", retry: { ...quick, attempts: 1 } });
    try {
      await x.send();
      expect([x.outcomes.dropped, x.errors]).toEqual([3, ["the collector answered Internal: Protocol error"]]);
      // A stop aborts the failed session; its late `error` must not reach the process.
      await x.exporter.flush();
      await new Promise((r) => setTimeout(r, 300));
      expect(await exporterTo(http1.url.replace("/v1/traces", ""), { protocol: "grpc" }).exporter.probe()).toBe("the collector answered Internal: Protocol error");
      await new Promise((r) => setTimeout(r, 300));
    } finally {
      await http1.stop();
    }
  });

  it("counts a partial success's refused spans", async () => {
    collector.received.length = 0;
    collector.answer = () => ({ kind: "ok", rejected: 1, message: "too old" });
    const x = exporterTo(collector.url, { protocol: "grpc" });
    await x.send();
    expect([x.outcomes, x.errors]).toEqual([{ exported: 2, rejected: 1, dropped: 0 }, ["the collector refused 1 of 3 spans: too old"]]);
    await x.exporter.flush();
  });
});

describe("a collector over TLS that asks for the gateway's certificate", () => {
  let dir: string;
  let pem: (name: string) => string;
  beforeAll(() => {
    dir = mkdtempSync(join(tmpdir(), "otlp-tls-"));
    makeCertificate(dir, "collector");
    makeCertificate(dir, "client");
    // Another lifetime than the client's: the validity told after a renewal is the renewed certificate's.
    makeCertificate(dir, "stranger", 90);
    pem = (name) => readFileSync(join(dir, name), "utf8");
  });
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it("uses a renewed client certificate once its files are read again, and keeps the one before when the new files are not a pair", async () => {
    const files = { cert: join(dir, "renewed.cert.pem"), key: join(dir, "renewed.key.pem") };
    const use = (name: string, keyOf = name) => (writeFileSync(files.cert, pem(`${name}.cert.pem`)), writeFileSync(files.key, pem(`${keyOf}.key.pem`)));
    use("client");
    const clientCa = pem("client.cert.pem") + pem("stranger.cert.pem");
    const http1 = await new HttpCollector({ cert: pem("collector.cert.pem"), key: pem("collector.key.pem"), clientCa }).start();
    // gRPC's collector knows only the renewed one: before the renewal it refuses the gateway.
    const grpcOnly = await new GrpcCollector({ cert: pem("collector.cert.pem"), key: pem("collector.key.pem"), clientCa: pem("stranger.cert.pem") }).start();
    const renewals: string[] = [];
    const validity: string[] = [];
    const make = (url: string, protocol: "http/protobuf" | "grpc") =>
      exporterTo(url, {
        protocol,
        retry: { ...quick, attempts: 1 },
        tls: { ca: pem("collector.cert.pem"), cert: readFileSync(files.cert, "utf8"), key: readFileSync(files.key, "utf8") },
        tlsFiles: files,
        onTlsRenewal: (o) => renewals.push(o),
        onClientCertificate: (v) => validity.push(`${v.notBefore.toISOString()}..${v.notAfter.toISOString()}`),
      });
    const validityOf = (name: string) => {
      const x509 = new X509Certificate(pem(`${name}.cert.pem`));
      return `${x509.validFromDate.toISOString()}..${x509.validToDate.toISOString()}`;
    };
    const overHttp = make(http1.url, "http/protobuf");
    const overGrpc = make(grpcOnly.url, "grpc");
    try {
      await overHttp.send();
      await overGrpc.send();
      expect([http1.peers, overGrpc.outcomes.dropped]).toEqual([["gateway-client"], 3]);
      // The same files: nothing to do.
      expect(overHttp.exporter.renewTls()).toBe("unchanged");
      use("stranger");
      expect([overHttp.exporter.renewTls(), overGrpc.exporter.renewTls()]).toEqual(["renewed", "renewed"]);
      await overHttp.send();
      await overGrpc.send();
      expect([http1.peers, overGrpc.outcomes.exported]).toEqual([["gateway-client", "gateway-stranger"], 3]);
      // Half copied (a certificate with another's key): refused, the renewed pair still used.
      use("client", "stranger");
      expect(overHttp.exporter.renewTls()).toBe("refused");
      await overHttp.send();
      expect(http1.peers.at(-1)).toBe("gateway-stranger");
      expect(renewals).toEqual(["renewed", "renewed", "refused"]);
      // What the metrics are told (gateway_otlp_client_certificate_*): each exporter's certificate at its start and after its renewal; nothing for a refused one.
      expect(validity).toEqual([validityOf("client"), validityOf("client"), validityOf("stranger"), validityOf("stranger")]);
    } finally {
      await overHttp.exporter.flush();
      await overGrpc.exporter.flush();
      await http1.stop();
      await grpcOnly.stop();
    }
  });

  for (const protocol of ["http/protobuf", "grpc"] as const) {
    it(`takes spans over ${protocol} from a gateway that trusts its authority and shows the certificate it knows, and no others`, async () => {
      const tls = { cert: pem("collector.cert.pem"), key: pem("collector.key.pem"), clientCa: pem("client.cert.pem") };
      const collector = await (protocol === "grpc" ? new GrpcCollector(tls) : new HttpCollector(tls)).start();
      try {
        const outcome = async (t: OtlpTracesOptions["tls"]) => {
          const x = exporterTo(collector.url, { protocol, tls: t, retry: { ...quick, attempts: 1 } });
          await x.send();
          await x.exporter.flush();
          return x.outcomes.exported > 0 ? "exported" : "dropped";
        };
        const ca = pem("collector.cert.pem");
        expect(await outcome({ ca, cert: pem("client.cert.pem"), key: pem("client.key.pem") })).toBe("exported");
        // No client certificate, one the collector does not know, or a collector the gateway does not trust.
        expect(await outcome({ ca })).toBe("dropped");
        expect(await outcome({ ca, cert: pem("stranger.cert.pem"), key: pem("stranger.key.pem") })).toBe("dropped");
        expect(await outcome({ cert: pem("client.cert.pem"), key: pem("client.key.pem") })).toBe("dropped");
        expect(collector.spans).toEqual(expected);
      } finally {
        await collector.stop();
      }
    });
  }
});
