import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient, type Client } from "@connectrpc/connect";
import { compressionGzip, createGrpcTransport, Http2SessionManager, type GrpcTransportOptions } from "@connectrpc/connect-node";
import { createHash, X509Certificate } from "node:crypto";
import { readFileSync } from "node:fs";
import http from "node:http";
import type http2 from "node:http2";
import https from "node:https";
import { promisify } from "node:util";
import { gzip } from "node:zlib";
import type { SpanData, SpanSink } from "../core/tracing.ts";
import { RetryInfoSchema } from "../gen/google/rpc/error_details_pb.js";
import { StatusSchema } from "../gen/google/rpc/status_pb.js";
import { ExportTraceServiceRequestSchema, ExportTraceServiceResponseSchema, TraceService } from "../gen/opentelemetry/proto/collector/trace/v1/trace_service_pb.js";
import { InstrumentationScopeSchema, type InstrumentationScope, type KeyValueSchema } from "../gen/opentelemetry/proto/common/v1/common_pb.js";
import { ResourceSchema, type Resource as ResourceMessage } from "../gen/opentelemetry/proto/resource/v1/resource_pb.js";
import { Span_SpanKind, SpanFlags, Status_StatusCode, type SpanSchema } from "../gen/opentelemetry/proto/trace/v1/trace_pb.js";
import type { MessageInitShape } from "@bufbuild/protobuf";
import { readTlsFiles, tlsProblem, type OtlpProtocol } from "./otlp-plan.ts";

/** What became of spans: taken by the collector, refused by it (a partial success), or lost on the way. */
export type SpanOutcome = "exported" | "rejected" | "dropped";

/** How a batch the collector could not take now is tried again (OTLP: "Retrying"). */
export interface RetryPolicy {
  /** Tries of one batch, the first included. */
  readonly attempts: number;
  /** The wait before the second try, growing 1.5 times a try up to `maxDelayMs`, each ±20%. */
  readonly firstDelayMs: number;
  readonly maxDelayMs: number;
  /**
   * The longest wait a collector's own hint (`Retry-After`, gRPC's
   * `RetryInfo`) is waited for before the batch is tried again; past it the
   * batch is dropped, and nothing is sent until the hint's time has passed.
   */
  readonly longestHintMs: number;
  /** The longest pause a collector's hint stops sending for: a `Retry-After` of a year, a bug or not, pauses this long. */
  readonly longestPauseMs: number;
}

export interface OtlpTracesOptions {
  /** The collector's traces endpoint (OTLP/HTTP: e.g. http://collector:4318/v1/traces; OTLP/gRPC: http://collector:4317). */
  readonly url: string;
  readonly protocol: OtlpProtocol;
  readonly gzip: boolean;
  /** `service.name`, `service.instance.id` and `service.version` of the resource every span belongs to; `resource`, more of its attributes, which take precedence over the last two. */
  readonly serviceName: string;
  readonly instanceId: string;
  readonly serviceVersion: string;
  readonly resource: Readonly<Record<string, string>>;
  /** Header fields each batch is sent with (a collector's token, say): never logged. */
  readonly headers: Readonly<Record<string, string>>;
  /** PEM text for an `https` collector: the authorities trusted instead of the system's, and the gateway's own certificate and key. */
  readonly tls: { readonly ca?: string; readonly cert?: string; readonly key?: string };
  /** The files `tls` came from: read again every `tlsCheckMs` (0: never) and by renewTls(), so a renewed client certificate needs no restart. */
  readonly tlsFiles: { readonly ca?: string; readonly cert?: string; readonly key?: string };
  readonly tlsCheckMs: number;
  /** Told when the files were read again and changed: `renewed` (new requests use them) or `refused` (they do not work together or cannot be read; the ones before stay). */
  readonly onTlsRenewal: (outcome: "renewed" | "refused", e?: unknown) => void;
  /** Told the validity of the client certificate in use, where there is one: at the start, and after each renewal. */
  readonly onClientCertificate: (validity: { readonly notBefore: Date; readonly notAfter: Date }) => void;
  /** A batch is sent at this many spans, or `intervalMs` after its first. */
  readonly batchSpans: number;
  readonly intervalMs: number;
  /** Spans held while the collector is slow or away; past it new spans are dropped (and counted). */
  readonly maxQueued: number;
  /** One request's limit. */
  readonly timeoutMs: number;
  readonly retry: RetryPolicy;
  /** Told of each batch's spans: `exported`, `rejected` (the collector took the request but refused them) or `dropped`. */
  readonly onSpans: (outcome: SpanOutcome, n: number) => void;
  /** Told when a batch could not be sent, or the collector refused spans; at most once a minute. */
  readonly onError: (e: unknown) => void;
}

export const defaultRetryPolicy: RetryPolicy = { attempts: 5, firstDelayMs: 1000, maxDelayMs: 5000, longestHintMs: 30_000, longestPauseMs: 600_000 };

export const defaultOtlpTracesOptions: Omit<OtlpTracesOptions, "url" | "serviceName" | "instanceId" | "serviceVersion"> = {
  protocol: "http/protobuf",
  gzip: false,
  resource: {},
  headers: {},
  tls: {},
  tlsFiles: {},
  tlsCheckMs: 0,
  onTlsRenewal: () => {},
  onClientCertificate: () => {},
  batchSpans: 512,
  intervalMs: 1000,
  maxQueued: 4096,
  timeoutMs: 10_000,
  retry: defaultRetryPolicy,
  onSpans: () => {},
  onError: () => {},
};

/** What one request came to. */
type Sent =
  | { readonly ok: true; readonly rejected: number; readonly message: string }
  | { readonly ok: false; readonly retry: boolean; readonly afterMs: number | undefined; readonly reason: string };

/** How a batch reaches the collector. */
interface Sender {
  send(batch: readonly SpanData[], timeoutMs: number): Promise<Sent>;
  close(): void;
}

// ---------------------------------------------------------------------------
// Encodings

type Resource = Readonly<Record<string, string>>;

const kinds = { server: Span_SpanKind.SERVER, client: Span_SpanKind.CLIENT } as const;

/** W3C flags (sampled: every span recorded is) and whether the parent is remote (the caller's), as OTLP's `flags` carries them. */
function flagsOf(s: SpanData): number {
  return 0x01 | SpanFlags.CONTEXT_HAS_IS_REMOTE_MASK | (s.remoteParent ? SpanFlags.CONTEXT_IS_REMOTE_MASK : 0);
}

/** An attribute's OTLP AnyValue, as JSON. */
function valueJson(v: string | number | boolean): string {
  if (typeof v === "string") return `{"stringValue":${JSON.stringify(v)}}`;
  if (typeof v === "boolean") return `{"boolValue":${v}}`;
  return Number.isInteger(v) ? `{"intValue":"${v}"}` : `{"doubleValue":${v}}`;
}

/** Attributes as OTLP's JSON list of key and value. */
function attributesJson(a: Record<string, string | number | boolean>): string {
  let out = "[";
  for (const key in a) out += `${out.length > 1 ? "," : ""}{"key":${JSON.stringify(key)},"value":${valueJson(a[key]!)}}`;
  return `${out}]`;
}

/**
 * A span in OTLP's JSON encoding (ids as hex, times as decimal strings),
 * written as text: building the objects for JSON.stringify had cost as much
 * again.
 */
function spanJson(s: SpanData): string {
  let out = `{"traceId":"${s.traceId}","spanId":"${s.spanId}"`;
  if (s.parentSpanId !== undefined) out += `,"parentSpanId":"${s.parentSpanId}"`;
  if (s.traceState !== undefined) out += `,"traceState":${JSON.stringify(s.traceState)}`;
  out += `,"flags":${flagsOf(s)},"name":${JSON.stringify(s.name)},"kind":${kinds[s.kind]},"startTimeUnixNano":"${s.startNs}","endTimeUnixNano":"${s.endNs}","attributes":${attributesJson(s.attributes)}`;
  // ERROR (2) with its message, or UNSET (0): a refusal of the caller's request is not the server's fault.
  return `${out},"status":${s.error !== undefined ? `{"code":2,"message":${JSON.stringify(s.error)}}` : `{"code":0}`}}`;
}

function attributesMessage(a: Record<string, string | number | boolean>): MessageInitShape<typeof KeyValueSchema>[] {
  const out: MessageInitShape<typeof KeyValueSchema>[] = [];
  for (const key in a) {
    const v = a[key]!;
    const value =
      typeof v === "string"
        ? ({ case: "stringValue", value: v } as const)
        : typeof v === "boolean"
          ? ({ case: "boolValue", value: v } as const)
          : Number.isInteger(v)
            ? ({ case: "intValue", value: BigInt(v) } as const)
            : ({ case: "doubleValue", value: v } as const);
    out.push({ key, value: { value } });
  }
  return out;
}

const noBytes = new Uint8Array(0);

function spanMessage(s: SpanData): MessageInitShape<typeof SpanSchema> {
  return {
    traceId: Buffer.from(s.traceId, "hex"),
    spanId: Buffer.from(s.spanId, "hex"),
    parentSpanId: s.parentSpanId !== undefined ? Buffer.from(s.parentSpanId, "hex") : noBytes,
    traceState: s.traceState ?? "",
    flags: flagsOf(s),
    name: s.name,
    kind: kinds[s.kind],
    startTimeUnixNano: s.startNs,
    endTimeUnixNano: s.endNs,
    attributes: attributesMessage(s.attributes),
    status: s.error !== undefined ? { code: Status_StatusCode.ERROR, message: s.error } : {},
  };
}

/**
 * A batch as OTLP's encodings write it, under one resource and scope: the
 * protobuf-es request (binary OTLP/HTTP and gRPC), and OTLP's JSON, whose
 * text before and after the spans is made once.
 */
class Encodings {
  /** The batch's resource and scope as messages, made once: every request carries the same. */
  private readonly resource: ResourceMessage;
  private readonly scope: InstrumentationScope;
  private readonly head: string;
  private readonly tail = "]}]}]}";

  constructor(resource: Resource, scope: { readonly name: string; readonly version: string }) {
    this.resource = create(ResourceSchema, { attributes: attributesMessage(resource) });
    this.scope = create(InstrumentationScopeSchema, scope);
    this.head = `{"resourceSpans":[{"resource":{"attributes":${attributesJson(resource)}},"scopeSpans":[{"scope":{"name":${JSON.stringify(scope.name)},"version":${JSON.stringify(scope.version)}},"spans":[`;
  }

  request(batch: readonly SpanData[]) {
    return create(ExportTraceServiceRequestSchema, {
      resourceSpans: [{ resource: this.resource, scopeSpans: [{ scope: this.scope, spans: batch.map(spanMessage) }] }],
    });
  }

  binary(batch: readonly SpanData[]): Buffer {
    const bytes = toBinary(ExportTraceServiceRequestSchema, this.request(batch));
    return Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  }

  json(batch: readonly SpanData[]): Buffer {
    return Buffer.from(this.head + batch.map(spanJson).join(",") + this.tail);
  }
}

/** The collector's words, fit for a log line: printable, and short. */
function collectorWords(text: string): string {
  const clean = text.replace(/[\0-\x1f\x7f]+/g, " ").trim();
  return clean.length > 200 ? `${clean.slice(0, 200)}…` : clean;
}

/** The spans a partial success refused, at most the batch. */
function refusedOf(rejected: bigint | number | string | undefined, batch: number): number {
  const n = Number(rejected ?? 0);
  return Number.isFinite(n) && n > 0 ? Math.min(n, batch) : 0;
}

// ---------------------------------------------------------------------------
// OTLP/HTTP

const gzipAsync = promisify(gzip);
/** What is read of a collector's answer; the rest is not wanted. */
const answerBytes = 65_536;

/** `Retry-After` as milliseconds from now: seconds, or an HTTP date. */
function retryAfterMs(value: string | undefined, now: number): number | undefined {
  if (value === undefined) return undefined;
  if (/^\s*\d+\s*$/.test(value)) return Number(value) * 1000;
  const at = Date.parse(value);
  return Number.isNaN(at) ? undefined : Math.max(0, at - now);
}

/** OTLP/HTTP (https://opentelemetry.io/docs/specs/otlp/#otlphttp), binary or JSON, over one kept-alive connection. */
class HttpSender implements Sender {
  private readonly url: URL;
  private readonly agent: http.Agent;
  private readonly json: boolean;
  private readonly options: OtlpTracesOptions;
  private readonly encodings: Encodings;

  constructor(options: OtlpTracesOptions, encodings: Encodings) {
    this.options = options;
    this.encodings = encodings;
    this.url = new URL(options.url);
    this.agent = this.url.protocol === "https:" ? new https.Agent({ keepAlive: true, maxSockets: 1, ...options.tls }) : new http.Agent({ keepAlive: true, maxSockets: 1 });
    this.json = options.protocol === "http/json";
  }

  async send(batch: readonly SpanData[], timeoutMs: number): Promise<Sent> {
    let body = this.json ? this.encodings.json(batch) : this.encodings.binary(batch);
    const headers: Record<string, string> = { ...this.options.headers, "content-type": this.json ? "application/json" : "application/x-protobuf" };
    if (this.options.gzip) {
      body = await gzipAsync(body);
      headers["content-encoding"] = "gzip";
    }
    headers["content-length"] = String(body.length);
    let answer: { status: number; headers: http.IncomingHttpHeaders; body: Buffer };
    const signal = AbortSignal.timeout(timeoutMs);
    try {
      answer = await this.post(body, headers, signal);
    } catch (e) {
      // The collector is away, slow, or cut the connection: OTLP retries these.
      return { ok: false, retry: true, afterMs: undefined, reason: signal.aborted ? `the collector did not answer in ${timeoutMs} ms` : `the collector could not be reached (${(e as NodeJS.ErrnoException).code ?? (e as Error).message})` };
    }
    const type = answer.headers["content-type"] ?? "";
    if (answer.status >= 200 && answer.status < 300) {
      const partial = this.partialSuccess(answer.body, type);
      return { ok: true, rejected: refusedOf(partial?.rejected, batch.length), message: partial?.message ?? "" };
    }
    // OTLP/HTTP: only these are worth another try, after the server's Retry-After where it sends one.
    const retry = answer.status === 429 || answer.status === 502 || answer.status === 503 || answer.status === 504;
    const words = this.statusMessage(answer.body, type);
    return {
      ok: false,
      retry,
      afterMs: retry ? retryAfterMs(answer.headers["retry-after"], Date.now()) : undefined,
      reason: `the collector answered HTTP ${answer.status}${words !== "" ? `: ${words}` : ""}`,
    };
  }

  private post(body: Buffer, headers: Record<string, string>, signal: AbortSignal): Promise<{ status: number; headers: http.IncomingHttpHeaders; body: Buffer }> {
    return new Promise((resolve, reject) => {
      const request = (this.url.protocol === "https:" ? https : http).request(this.url, { method: "POST", agent: this.agent, headers, signal }, (res) => {
        const chunks: Buffer[] = [];
        let size = 0;
        res.on("data", (chunk: Buffer) => {
          if (size < answerBytes) chunks.push(chunk);
          size += chunk.length;
        });
        res.on("end", () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks).subarray(0, answerBytes) }));
        res.on("error", reject);
      });
      request.on("error", reject);
      request.end(body);
    });
  }

  /** A 2xx answer's partial success (OTLP: "Partial Success"), if it has one. */
  private partialSuccess(body: Buffer, type: string): { rejected: bigint | number | string | undefined; message: string } | undefined {
    if (body.length === 0) return undefined;
    try {
      if (type.includes("json")) {
        const doc = JSON.parse(body.toString("utf8")) as { partialSuccess?: { rejectedSpans?: number | string; errorMessage?: string } };
        const p = doc.partialSuccess;
        return p === undefined ? undefined : { rejected: p.rejectedSpans, message: collectorWords(String(p.errorMessage ?? "")) };
      }
      const p = fromBinary(ExportTraceServiceResponseSchema, body).partialSuccess;
      return p === undefined ? undefined : { rejected: p.rejectedSpans, message: collectorWords(p.errorMessage) };
    } catch {
      // An answer that is not OTLP's: the request was taken.
      return undefined;
    }
  }

  /** A refusal's reason: OTLP/HTTP sends a google.rpc.Status, in the request's encoding; others send text. */
  private statusMessage(body: Buffer, type: string): string {
    if (body.length === 0) return "";
    try {
      if (type.includes("json")) return collectorWords(String((JSON.parse(body.toString("utf8")) as { message?: unknown }).message ?? ""));
      if (type.includes("protobuf")) return collectorWords(fromBinary(StatusSchema, body).message);
    } catch {
      // Fall through to the text.
    }
    return type.startsWith("text/") ? collectorWords(body.toString("utf8")) : "";
  }

  close(): void {
    this.agent.destroy();
  }
}

// ---------------------------------------------------------------------------
// OTLP/gRPC

/** gRPC codes OTLP retries (OTLP: "Failures"); RESOURCE_EXHAUSTED only where the server says when (RetryInfo). */
const retriedCodes = new Set([Code.Canceled, Code.DeadlineExceeded, Code.Aborted, Code.OutOfRange, Code.Unavailable, Code.DataLoss]);

type SessionManager = NonNullable<GrpcTransportOptions["sessionManager"]>;

/**
 * connect-node's HTTP/2 session manager, with each session it opens kept
 * from crashing the process: once the manager has let go of a session (its
 * abort() at a stop, a connection that failed), it no longer listens for
 * the session's `error`, which Node then throws. Seen with a gRPC exporter
 * pointed at an HTTP/1.1 port: "Protocol error", uncaught, at the stop.
 * Every error still reaches the call it belongs to.
 */
class GuardedSessions implements SessionManager {
  readonly authority: string;
  private readonly inner: Http2SessionManager;
  private readonly guarded = new WeakSet<http2.Http2Session>();

  constructor(inner: Http2SessionManager) {
    this.inner = inner;
    this.authority = inner.authority;
  }

  async request(method: string, path: string, headers: http2.OutgoingHttpHeaders, options: Omit<http2.ClientSessionRequestOptions, "signal">): Promise<http2.ClientHttp2Stream> {
    const stream = await this.inner.request(method, path, headers, options);
    const session = stream.session;
    if (session !== undefined && !this.guarded.has(session)) {
      this.guarded.add(session);
      session.on("error", () => {});
    }
    return stream;
  }

  notifyResponseByteRead(stream: http2.ClientHttp2Stream): void {
    this.inner.notifyResponseByteRead(stream);
  }

  abort(): void {
    this.inner.abort();
  }
}

/** OTLP/gRPC (https://opentelemetry.io/docs/specs/otlp/#otlpgrpc): TraceService/Export over one HTTP/2 connection, with connect-node's gRPC client. */
class GrpcSender implements Sender {
  private readonly session: GuardedSessions;
  private readonly client: Client<typeof TraceService>;
  private readonly options: OtlpTracesOptions;
  private readonly encodings: Encodings;

  constructor(options: OtlpTracesOptions, encodings: Encodings) {
    this.options = options;
    this.encodings = encodings;
    const origin = new URL(options.url).origin;
    this.session = new GuardedSessions(new Http2SessionManager(origin, undefined, origin.startsWith("https:") ? { ...options.tls } : {}));
    const transport = createGrpcTransport({
      baseUrl: origin,
      sessionManager: this.session,
      ...(options.gzip ? { sendCompression: compressionGzip, compressMinBytes: 0 } : {}),
      acceptCompression: [compressionGzip],
    });
    this.client = createClient(TraceService, transport);
  }

  async send(batch: readonly SpanData[], timeoutMs: number): Promise<Sent> {
    try {
      const answer = await this.client.export(this.encodings.request(batch), { headers: this.options.headers, timeoutMs });
      const p = answer.partialSuccess;
      return { ok: true, rejected: refusedOf(p?.rejectedSpans, batch.length), message: collectorWords(p?.errorMessage ?? "") };
    } catch (e) {
      const error = ConnectError.from(e);
      const hint = error.findDetails(RetryInfoSchema)[0]?.retryDelay;
      const afterMs = hint !== undefined ? Number(hint.seconds) * 1000 + Math.floor(hint.nanos / 1e6) : undefined;
      const retry = retriedCodes.has(error.code) || (error.code === Code.ResourceExhausted && afterMs !== undefined);
      return { ok: false, retry, afterMs, reason: `the collector answered ${Code[error.code]}: ${collectorWords(error.rawMessage)}` };
    }
  }

  close(): void {
    this.session.abort();
  }
}

// ---------------------------------------------------------------------------

/**
 * Spans to an OpenTelemetry collector over OTLP (binary or JSON over HTTP,
 * or gRPC): queued on the call's path, sent in batches, one request at a
 * time, off it. A batch the collector cannot take now (OTLP's retryable
 * answers, or no answer) is tried again, after the collector's own hint
 * where it gives one, up to `retry.attempts` times; one it refuses is
 * dropped. A collector that is slow or away never holds a call up: past
 * `maxQueued` waiting, new spans are dropped; every span is counted
 * (`gateway_spans_total`) as exported, rejected or dropped.
 */
export class OtlpTraceExporter implements SpanSink {
  private readonly options: OtlpTracesOptions;
  private sender: Sender;
  private readonly encodings: Encodings;
  /** The TLS text in use, and a digest of the files' as last read (renewTls). */
  private tlsNow: OtlpTracesOptions["tls"];
  private tlsSeen: string;
  private readonly tlsTimer: NodeJS.Timeout | undefined;
  private queue: SpanData[] = [];
  private timer: NodeJS.Timeout | undefined;
  /** Whether the timer waits for a full batch (the pause only), not for the interval. */
  private timerFull = false;
  private sending: Promise<void> | undefined;
  private lastError = -Infinity;
  /** Until when nothing is sent (performance.now(): a wall clock stepping back would stretch it): a collector asked for a pause longer than a batch waits. */
  private pausedUntil = 0;
  /** Set by flush(): retries stop waiting. */
  private closing = false;
  private readonly wake = new AbortController();

  constructor(options: Pick<OtlpTracesOptions, "url" | "serviceName" | "instanceId" | "serviceVersion"> & Partial<OtlpTracesOptions>) {
    this.options = { ...defaultOtlpTracesOptions, ...options };
    const o = this.options;
    const resource: Record<string, string> = { "service.name": o.serviceName, "service.instance.id": o.instanceId, "service.version": o.serviceVersion, ...o.resource };
    resource["service.name"] = o.serviceName;
    this.encodings = new Encodings(resource, { name: o.serviceName, version: o.serviceVersion });
    this.sender = this.senderFor(o.tls);
    this.tlsNow = o.tls;
    this.tlsSeen = tlsDigest(o.tls);
    if (o.tlsCheckMs > 0 && Object.keys(o.tlsFiles).length > 0) {
      this.tlsTimer = setInterval(() => this.renewTls(), o.tlsCheckMs);
      this.tlsTimer.unref();
    }
    this.tellClientCertificate();
  }

  /** The client certificate's validity (its first, the leaf, where the file holds a chain), to onClientCertificate. */
  private tellClientCertificate(): void {
    const cert = this.tlsNow.cert;
    if (cert === undefined) return;
    let x509: X509Certificate;
    try {
      x509 = new X509Certificate(cert);
    } catch {
      return; // A pair that works together has a certificate that reads (tlsProblem); nothing to tell otherwise.
    }
    this.options.onClientCertificate({ notBefore: x509.validFromDate, notAfter: x509.validToDate });
  }

  private senderFor(tls: OtlpTracesOptions["tls"]): Sender {
    const o = { ...this.options, tls };
    return o.protocol === "grpc" ? new GrpcSender(o, this.encodings) : new HttpSender(o, this.encodings);
  }

  /**
   * Reads the TLS files again (SIGHUP, and every `tlsCheckMs`): where their
   * bytes changed and they work together (`tls.createSecureContext`), new
   * requests use them, on a new connection, and the old one closes once
   * its request is done; where they do not, the ones before stay.
   */
  renewTls(read: (file: string) => string = (f) => readFileSync(f, "utf8")): "renewed" | "unchanged" | "refused" {
    const found = readTlsFiles(this.options.tlsFiles, read);
    if ("problem" in found) {
      this.options.onTlsRenewal("refused", new Error(`${this.options.tlsFiles[found.part]} cannot be read as PEM: ${found.problem}`));
      return "refused";
    }
    // A part with no file (given as text) stays as it is.
    const next = { ...this.tlsNow, ...found.tls };
    const seen = tlsDigest(next);
    if (seen === this.tlsSeen) return "unchanged";
    this.tlsSeen = seen;
    const unusable = tlsProblem(next);
    if (unusable !== undefined) {
      this.options.onTlsRenewal("refused", new Error(`they cannot be used together: ${unusable}`));
      return "refused";
    }
    const old = this.sender;
    this.tlsNow = next;
    this.sender = this.senderFor(next);
    if (this.sending !== undefined) void this.sending.finally(() => old.close());
    else old.close();
    this.options.onTlsRenewal("renewed");
    this.tellClientCertificate();
    return "renewed";
  }

  add(span: SpanData): void {
    if (this.queue.length >= this.options.maxQueued) {
      this.options.onSpans("dropped", 1);
      return;
    }
    this.queue.push(span);
    this.sendOrWait();
  }

  /** A full batch goes now; spans short of one wait at most `intervalMs` from the first; none go while paused. */
  private sendOrWait(): void {
    if (this.sending !== undefined || this.queue.length === 0) return;
    const full = this.queue.length >= this.options.batchSpans;
    if (this.timer !== undefined && (!full || this.timerFull)) return;
    const paused = Math.ceil(this.pausedUntil - performance.now());
    if (full && paused <= 0) return this.send();
    // A full batch waits out the pause only; one short of full, its interval too.
    clearTimeout(this.timer);
    this.timerFull = full;
    this.timer = setTimeout(() => this.send(), full ? paused : Math.max(paused, this.options.intervalMs));
    this.timer.unref();
  }

  /** Sends what is queued, one try a batch, and waits for what is being sent (shutdown); within one request's limit in all. */
  async flush(): Promise<void> {
    clearInterval(this.tlsTimer);
    this.closing = true;
    this.wake.abort();
    const deadline = performance.now() + this.options.timeoutMs;
    while (this.sending !== undefined) await this.sending;
    while (this.queue.length > 0 && performance.now() < deadline) {
      this.send(Math.ceil(deadline - performance.now()));
      await this.sending;
    }
    if (this.queue.length > 0) this.options.onSpans("dropped", this.queue.splice(0).length);
    this.sender.close();
  }

  /**
   * Sends one export of no spans, once (`gateway check`): whether the
   * collector is there and takes the gateway's credentials, at no cost in
   * spans. Undefined where it took it; otherwise why not.
   */
  async probe(): Promise<string | undefined> {
    const sent = await this.sender.send([], Math.min(this.options.timeoutMs, 5000));
    this.sender.close();
    return sent.ok ? undefined : sent.reason;
  }

  private send(limitMs = this.options.timeoutMs): void {
    clearTimeout(this.timer);
    this.timer = undefined;
    if (this.sending !== undefined || this.queue.length === 0) return;
    const batch = this.queue.splice(0, this.options.batchSpans);
    this.sending = this.post(batch, limitMs).finally(() => {
      this.sending = undefined;
      if (!this.closing) this.sendOrWait();
    });
  }

  private async post(batch: SpanData[], limitMs: number): Promise<void> {
    const { retry, onSpans } = this.options;
    for (let attempt = 1; ; attempt++) {
      const sent = await this.sender.send(batch, Math.max(1, Math.min(this.options.timeoutMs, limitMs)));
      if (sent.ok) {
        if (batch.length - sent.rejected > 0) onSpans("exported", batch.length - sent.rejected);
        if (sent.rejected > 0) onSpans("rejected", sent.rejected);
        if (sent.rejected > 0 || sent.message !== "") this.report(new Error(`the collector refused ${sent.rejected} of ${batch.length} spans${sent.message !== "" ? `: ${sent.message}` : ""}`));
        return;
      }
      const wait = sent.retry ? (sent.afterMs ?? backoffMs(retry, attempt)) : undefined;
      if (wait === undefined || attempt >= retry.attempts || this.closing || wait > retry.longestHintMs) {
        if (sent.afterMs !== undefined) this.pausedUntil = Math.max(this.pausedUntil, performance.now() + Math.min(sent.afterMs, retry.longestPauseMs));
        onSpans("dropped", batch.length);
        this.report(new Error(`${sent.reason}${sent.retry && !this.closing ? ` (tried ${attempt} times)` : ""}`));
        return;
      }
      await sleep(wait, this.wake.signal);
    }
  }

  private report(e: Error): void {
    const now = performance.now();
    if (now - this.lastError >= 60_000) {
      this.lastError = now;
      this.options.onError(e);
    }
  }
}

/** A short digest of TLS files' text: whether a renewal changed them. */
function tlsDigest(tls: { readonly ca?: string; readonly cert?: string; readonly key?: string }): string {
  return createHash("sha256").update(JSON.stringify([tls.ca ?? "", tls.cert ?? "", tls.key ?? ""])).digest("hex");
}

/** The wait before try `attempt + 1`: growing 1.5 times a try from `firstDelayMs` up to `maxDelayMs`, ±20% so replicas do not come back together. */
function backoffMs(policy: RetryPolicy, attempt: number): number {
  const base = Math.min(policy.maxDelayMs, policy.firstDelayMs * 1.5 ** (attempt - 1));
  return Math.round(base * (0.8 + Math.random() * 0.4));
}

function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve();
    const t = setTimeout(done, ms);
    function done(): void {
      clearTimeout(t);
      signal.removeEventListener("abort", done);
      resolve();
    }
    signal.addEventListener("abort", done);
  });
}
