import type { SpanData, SpanSink } from "../core/tracing.ts";

export interface OtlpTracesOptions {
  /** The collector's OTLP/HTTP traces endpoint, e.g. http://collector:4318/v1/traces. */
  readonly url: string;
  /** `service.name` and `service.instance.id` of the resource every span belongs to. */
  readonly serviceName: string;
  readonly instanceId: string;
  readonly serviceVersion: string;
  /** Header fields each batch is sent with (a collector's token, say): never logged. */
  readonly headers: Readonly<Record<string, string>>;
  /** A batch is sent at this many spans, or `intervalMs` after its first. */
  readonly batchSpans: number;
  readonly intervalMs: number;
  /** Spans held while the collector is slow or away; past it new spans are dropped (and counted). */
  readonly maxQueued: number;
  /** One request's limit. */
  readonly timeoutMs: number;
  /** Told of each batch sent (`exported`) or lost (`dropped`: the queue was full, or the collector refused it or did not answer). */
  readonly onSpans: (outcome: "exported" | "dropped", n: number) => void;
  /** Told when a batch could not be sent; at most once a minute. */
  readonly onError: (e: unknown) => void;
}

export const defaultOtlpTracesOptions: Omit<OtlpTracesOptions, "url" | "serviceName" | "instanceId" | "serviceVersion"> = {
  headers: {},
  batchSpans: 512,
  intervalMs: 1000,
  maxQueued: 4096,
  timeoutMs: 5000,
  onSpans: () => {},
  onError: () => {},
};

const kinds = { server: 2, client: 3 } as const;

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
  out += `,"name":${JSON.stringify(s.name)},"kind":${kinds[s.kind]},"startTimeUnixNano":"${s.startNs}","endTimeUnixNano":"${s.endNs}","attributes":${attributesJson(s.attributes)}`;
  // ERROR (2) with its message, or UNSET (0): a refusal of the caller's request is not the server's fault.
  return `${out},"status":${s.error !== undefined ? `{"code":2,"message":${JSON.stringify(s.error)}}` : `{"code":0}`}}`;
}

/**
 * Spans to an OpenTelemetry collector over OTLP/HTTP, JSON encoded
 * (https://opentelemetry.io/docs/specs/otlp/#otlphttp): queued on the call's
 * path, sent in batches, one request at a time, off it. A collector that is
 * slow or away never holds a call up: its batches are dropped and counted
 * (`gateway_spans_total{outcome="dropped"}`), as a full queue's new spans are.
 */
export class OtlpTraceExporter implements SpanSink {
  private readonly options: OtlpTracesOptions;
  private queue: SpanData[] = [];
  private timer: NodeJS.Timeout | undefined;
  private sending: Promise<void> | undefined;
  private lastError = -Infinity;
  /** The batch's JSON before and after its spans. */
  private readonly head: string;
  private readonly tail = "]}]}]}";

  constructor(options: Pick<OtlpTracesOptions, "url" | "serviceName" | "instanceId" | "serviceVersion"> & Partial<OtlpTracesOptions>) {
    this.options = { ...defaultOtlpTracesOptions, ...options };
    const o = this.options;
    const resource = attributesJson({ "service.name": o.serviceName, "service.instance.id": o.instanceId, "service.version": o.serviceVersion });
    this.head = `{"resourceSpans":[{"resource":{"attributes":${resource}},"scopeSpans":[{"scope":{"name":${JSON.stringify(o.serviceName)},"version":${JSON.stringify(o.serviceVersion)}},"spans":[`;
  }

  add(span: SpanData): void {
    if (this.queue.length >= this.options.maxQueued) {
      this.options.onSpans("dropped", 1);
      return;
    }
    this.queue.push(span);
    this.sendOrWait();
  }

  /** A full batch goes now; spans short of one wait at most `intervalMs` from the first. */
  private sendOrWait(): void {
    if (this.queue.length >= this.options.batchSpans) this.send();
    else if (this.queue.length > 0 && this.timer === undefined) {
      this.timer = setTimeout(() => this.send(), this.options.intervalMs);
      this.timer.unref();
    }
  }

  /** Sends what is queued, and waits for what is being sent (shutdown). */
  async flush(): Promise<void> {
    while (this.sending !== undefined) await this.sending;
    if (this.queue.length > 0) {
      this.send();
      await this.sending;
    }
  }

  private send(): void {
    clearTimeout(this.timer);
    this.timer = undefined;
    if (this.sending !== undefined || this.queue.length === 0) return;
    const batch = this.queue.splice(0, this.options.batchSpans);
    this.sending = this.post(batch).finally(() => {
      this.sending = undefined;
      this.sendOrWait();
    });
  }

  private async post(batch: SpanData[]): Promise<void> {
    const body = this.head + batch.map(spanJson).join(",") + this.tail;
    try {
      const res = await fetch(this.options.url, { method: "POST", headers: { ...this.options.headers, "content-type": "application/json" }, body, signal: AbortSignal.timeout(this.options.timeoutMs) });
      await res.arrayBuffer().catch(() => undefined);
      if (!res.ok) throw new Error(`the collector answered HTTP ${res.status}`);
      this.options.onSpans("exported", batch.length);
    } catch (e) {
      this.options.onSpans("dropped", batch.length);
      const now = Date.now();
      if (now - this.lastError >= 60_000) {
        this.lastError = now;
        this.options.onError(e);
      }
    }
  }
}
