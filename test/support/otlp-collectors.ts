// OpenTelemetry collectors on loopback, for the gateway's own spans: one OTLP/HTTP (binary, JSON, gzip, over
// plain HTTP or TLS with a client certificate), one OTLP/gRPC on grpc-js (another gRPC implementation than the
// gateway's connect-node client). Each keeps what it is sent, decoded into one shape whatever the encoding, and
// answers as `answer` says, so a test can make it refuse, throttle, take part of a batch or fall silent on purpose.
import { create, fromBinary, toBinary, type MessageInitShape } from "@bufbuild/protobuf";
import { anyPack } from "@bufbuild/protobuf/wkt";
import * as grpc from "@grpc/grpc-js";
import http from "node:http";
import https from "node:https";
import type { AddressInfo } from "node:net";
import { gunzipSync } from "node:zlib";
import { RetryInfoSchema } from "../../src/gen/google/rpc/error_details_pb.js";
import { StatusSchema } from "../../src/gen/google/rpc/status_pb.js";
import { ExportTraceServiceRequestSchema, ExportTraceServiceResponseSchema } from "../../src/gen/opentelemetry/proto/collector/trace/v1/trace_service_pb.js";
import type { AnyValue, KeyValue } from "../../src/gen/opentelemetry/proto/common/v1/common_pb.js";

/** A span as OTLP's JSON writes it (ids in hex, times and 64-bit integers as decimal text, enums as numbers). */
export interface OtlpSpan {
  traceId: string;
  spanId: string;
  parentSpanId?: string;
  traceState?: string;
  flags?: number;
  name: string;
  kind: number;
  startTimeUnixNano: string;
  endTimeUnixNano: string;
  attributes: { key: string; value: Record<string, unknown> }[];
  status: { code: number; message?: string };
}

/** A span as received, with its resource's attributes and its scope. */
export type ReceivedSpan = OtlpSpan & { resource: Record<string, unknown>; scope: { name?: string; version?: string } };

/** One export request as it arrived. */
export interface Received {
  readonly contentType: string;
  readonly contentEncoding: string | undefined;
  readonly headers: Record<string, string | string[] | undefined>;
  readonly spans: ReceivedSpan[];
}

const hex = (b: Uint8Array) => Buffer.from(b).toString("hex");

function valueOf(v: AnyValue | undefined): Record<string, unknown> {
  const c = v?.value;
  if (c === undefined || c.case === undefined) return {};
  if (c.case === "intValue") return { intValue: String(c.value) };
  if (c.case === "stringValue" || c.case === "boolValue" || c.case === "doubleValue") return { [c.case]: c.value };
  throw new Error(`the gateway sends no ${c.case}`);
}

const attrs = (list: KeyValue[]) => list.map((a) => ({ key: a.key, value: valueOf(a.value) }));

/** An OTLP binary export request, in OTLP JSON's shape; throws on any field this schema does not know. */
export function decodeBinary(bytes: Uint8Array): ReceivedSpan[] {
  const request = fromBinary(ExportTraceServiceRequestSchema, bytes);
  const unknown = JSON.stringify(request, (k, v: unknown) => (k === "$unknown" && Array.isArray(v) && v.length > 0 ? "UNKNOWN" : typeof v === "bigint" ? String(v) : v));
  if (unknown.includes('"UNKNOWN"')) throw new Error("the request holds fields the OTLP schema does not know");
  const out: ReceivedSpan[] = [];
  for (const rs of request.resourceSpans) {
    const resource = Object.fromEntries(attrs(rs.resource?.attributes ?? []).map((a) => [a.key, Object.values(a.value)[0]]));
    for (const ss of rs.scopeSpans) {
      for (const s of ss.spans) {
        out.push({
          traceId: hex(s.traceId),
          spanId: hex(s.spanId),
          ...(s.parentSpanId.length > 0 ? { parentSpanId: hex(s.parentSpanId) } : {}),
          ...(s.traceState !== "" ? { traceState: s.traceState } : {}),
          flags: s.flags,
          name: s.name,
          kind: s.kind,
          startTimeUnixNano: String(s.startTimeUnixNano),
          endTimeUnixNano: String(s.endTimeUnixNano),
          attributes: attrs(s.attributes),
          status: { code: s.status?.code ?? 0, ...(s.status?.message ? { message: s.status.message } : {}) },
          resource,
          scope: { name: ss.scope?.name, version: ss.scope?.version },
        });
      }
    }
  }
  return out;
}

/** An OTLP JSON export request, in the same shape. */
export function decodeJson(text: string): ReceivedSpan[] {
  const doc = JSON.parse(text) as { resourceSpans: { resource: { attributes: OtlpSpan["attributes"] }; scopeSpans: { scope: { name?: string; version?: string }; spans: OtlpSpan[] }[] }[] };
  const out: ReceivedSpan[] = [];
  for (const rs of doc.resourceSpans) {
    const resource = Object.fromEntries(rs.resource.attributes.map((a) => [a.key, Object.values(a.value)[0]]));
    for (const ss of rs.scopeSpans) for (const s of ss.spans) out.push({ ...s, resource, scope: { name: ss.scope.name, version: ss.scope.version } });
  }
  return out;
}

/** How a collector answers one request: taken (with a partial success, maybe), refused with a status, or never. */
export type HttpAnswer =
  | { readonly kind: "ok"; readonly rejected?: number; readonly message?: string }
  | { readonly kind: "status"; readonly status: number; readonly retryAfter?: string; readonly message?: string }
  | { readonly kind: "never" };

abstract class Collector {
  readonly received: Received[] = [];
  /** When each request came (performance.now()). */
  readonly arrivals: number[] = [];
  /** Every span received, in order. */
  get spans(): ReceivedSpan[] {
    return this.received.flatMap((r) => r.spans);
  }
  /** Waits (up to 5 s) until a span matching `match` has come. */
  async next(match: (s: ReceivedSpan) => boolean): Promise<ReceivedSpan> {
    for (let i = 0; i < 200; i++) {
      const found = this.spans.find(match);
      if (found !== undefined) return found;
      await new Promise((r) => setTimeout(r, 25));
    }
    throw new Error("no such span came");
  }
  /** Waits (up to 5 s) until `n` requests have come. */
  async requests(n: number): Promise<void> {
    for (let i = 0; i < 200 && this.received.length < n; i++) await new Promise((r) => setTimeout(r, 25));
    if (this.received.length < n) throw new Error(`${this.received.length} requests came, not ${n}`);
  }
}

/** OTLP/HTTP at /v1/traces; with `tls`, over TLS, asking for a client certificate signed by `tls.clientCa`. */
export class HttpCollector extends Collector {
  private readonly server: http.Server;
  url = "";
  /** Paths requests came to. */
  readonly paths: string[] = [];
  /** Each request's body, decompressed. */
  readonly bodies: Buffer[] = [];
  /** Over TLS, the common name of each request's client certificate. */
  readonly peers: string[] = [];
  /** How the n-th request (from 1) is answered. */
  answer: (n: number) => HttpAnswer = () => ({ kind: "ok" });

  constructor(tls?: { cert: string; key: string; clientCa: string }) {
    super();
    const handle = (req: http.IncomingMessage, res: http.ServerResponse) => {
      const chunks: Buffer[] = [];
      req.on("data", (d: Buffer) => chunks.push(d));
      req.on("end", () => {
        const n = this.received.length + 1;
        this.arrivals.push(performance.now());
        this.paths.push(req.url ?? "");
        const socket = req.socket as import("node:tls").TLSSocket;
        if (typeof socket.getPeerCertificate === "function") this.peers.push(String(socket.getPeerCertificate().subject?.CN ?? ""));
        const raw = Buffer.concat(chunks);
        const body = req.headers["content-encoding"] === "gzip" ? gunzipSync(raw) : raw;
        this.bodies.push(body);
        const contentType = String(req.headers["content-type"]);
        const json = contentType === "application/json";
        this.received.push({ contentType, contentEncoding: req.headers["content-encoding"], headers: req.headers, spans: json ? decodeJson(body.toString()) : decodeBinary(body) });
        const a = this.answer(n);
        if (a.kind === "never") return;
        if (a.kind === "ok") {
          const partial = a.rejected !== undefined || a.message !== undefined ? { rejectedSpans: BigInt(a.rejected ?? 0), errorMessage: a.message ?? "" } : undefined;
          if (json) res.writeHead(200, { "content-type": "application/json" }).end(partial === undefined ? "{}" : JSON.stringify({ partialSuccess: { rejectedSpans: String(partial.rejectedSpans), errorMessage: partial.errorMessage } }));
          else res.writeHead(200, { "content-type": "application/x-protobuf" }).end(toBinary(ExportTraceServiceResponseSchema, create(ExportTraceServiceResponseSchema, partial === undefined ? {} : { partialSuccess: partial })));
          return;
        }
        const headers: Record<string, string> = { "content-type": json ? "application/json" : "application/x-protobuf" };
        if (a.retryAfter !== undefined) headers["retry-after"] = a.retryAfter;
        const status = { code: a.status === 429 ? 8 : a.status >= 500 ? 14 : 3, message: a.message ?? "" };
        res.writeHead(a.status, headers).end(json ? JSON.stringify(status) : toBinary(StatusSchema, create(StatusSchema, status)));
      });
    };
    this.server = tls === undefined ? http.createServer(handle) : https.createServer({ cert: tls.cert, key: tls.key, ca: tls.clientCa, requestCert: true, rejectUnauthorized: true }, handle);
  }

  async start(): Promise<this> {
    await new Promise<void>((r) => this.server.listen(0, "127.0.0.1", r));
    this.url = `${this.server instanceof https.Server ? "https" : "http"}://127.0.0.1:${(this.server.address() as AddressInfo).port}/v1/traces`;
    return this;
  }

  stop(): Promise<void> {
    this.server.closeAllConnections();
    return new Promise((r) => this.server.close(() => r()));
  }
}

/** How the gRPC collector answers one request: taken, or refused with a code (and RetryInfo's delay, where given). */
export type GrpcAnswer = { readonly kind: "ok"; readonly rejected?: number; readonly message?: string } | { readonly kind: "error"; readonly code: grpc.status; readonly retryDelayMs?: number } | { readonly kind: "never" };

const raw = (b: Buffer) => b;

/** OTLP/gRPC: opentelemetry.proto.collector.trace.v1.TraceService/Export on grpc-js, messages coded with the schema. */
export class GrpcCollector extends Collector {
  private readonly server = new grpc.Server();
  /** How the n-th request (from 1) is answered. */
  answer: (n: number) => GrpcAnswer = () => ({ kind: "ok" });
  url = "";
  private readonly credentials: grpc.ServerCredentials;

  constructor(tls?: { cert: string; key: string; clientCa: string }) {
    super();
    this.credentials = tls === undefined ? grpc.ServerCredentials.createInsecure() : grpc.ServerCredentials.createSsl(Buffer.from(tls.clientCa), [{ cert_chain: Buffer.from(tls.cert), private_key: Buffer.from(tls.key) }], true);
    this.server.addService(
      {
        export: {
          path: "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
          requestStream: false,
          responseStream: false,
          requestSerialize: raw,
          requestDeserialize: raw,
          responseSerialize: raw,
          responseDeserialize: raw,
        },
      },
      {
        export: (call: grpc.ServerUnaryCall<Buffer, Buffer>, callback: grpc.sendUnaryData<Buffer>) => {
          const n = this.received.length + 1;
          this.arrivals.push(performance.now());
          const md = call.metadata.getMap();
          // grpc-js takes grpc-encoding out of the metadata once it has decompressed the message.
          this.received.push({ contentType: "application/grpc", contentEncoding: undefined, headers: md as Record<string, string>, spans: decodeBinary(call.request) });
          const a = this.answer(n);
          if (a.kind === "never") return;
          if (a.kind === "ok") {
            const init: MessageInitShape<typeof ExportTraceServiceResponseSchema> = a.rejected !== undefined || a.message !== undefined ? { partialSuccess: { rejectedSpans: BigInt(a.rejected ?? 0), errorMessage: a.message ?? "" } } : {};
            callback(null, Buffer.from(toBinary(ExportTraceServiceResponseSchema, create(ExportTraceServiceResponseSchema, init))));
            return;
          }
          const metadata = new grpc.Metadata();
          if (a.retryDelayMs !== undefined) {
            const detail = anyPack(RetryInfoSchema, create(RetryInfoSchema, { retryDelay: { seconds: BigInt(Math.floor(a.retryDelayMs / 1000)), nanos: (a.retryDelayMs % 1000) * 1e6 } }));
            metadata.set("grpc-status-details-bin", Buffer.from(toBinary(StatusSchema, create(StatusSchema, { code: a.code, message: "slow down", details: [detail] }))));
          }
          callback({ code: a.code, details: "slow down", metadata });
        },
      },
    );
  }

  async start(): Promise<this> {
    const port = await new Promise<number>((resolve, reject) => this.server.bindAsync("127.0.0.1:0", this.credentials, (e, p) => (e ? reject(e) : resolve(p))));
    this.url = `${this.credentials._isSecure() ? "https" : "http"}://127.0.0.1:${port}`;
    return this;
  }

  stop(): Promise<void> {
    this.server.forceShutdown();
    return Promise.resolve();
  }
}

/** A span's attributes as a plain object. */
export const attributesOf = (s: OtlpSpan) => Object.fromEntries(s.attributes.map((a) => [a.key, Object.values(a.value)[0]]));
