import { randomFillSync } from "node:crypto";
import type { TraceContext } from "./trace-context.ts";

/**
 * The gateway's own spans, for an operator's tracing backend (OpenTelemetry:
 * the exporter is src/exporters/otlp-traces.ts). A call is one server span;
 * a purchase from a source that it causes is a client span beneath it, and
 * the purchase carries that span's id as its parent to the provider, so the
 * provider's work hangs under the gateway's, and the gateway's under the
 * caller's.
 *
 * Sampling follows the caller (OpenTelemetry's parent-based sampler): a
 * call whose `traceparent` is sampled is recorded, one whose is not is not
 * (its context goes on to the provider unchanged, as with no tracer), and a
 * call with none is recorded at the configured ratio, as a trace of its own.
 * Nothing is recorded, and nothing costs more than a check, without a
 * tracer.
 */

export type SpanKind = "server" | "client";

export type SpanAttributes = Record<string, string | number | boolean>;

/** The ids and names a span is made with. */
interface SpanStart {
  readonly traceId: string;
  readonly spanId: string;
  readonly parentSpanId: string | undefined;
  /** Whether the parent is the caller's (its `traceparent`), not a span of this process. */
  readonly remoteParent: boolean;
  readonly traceState: string | undefined;
  readonly name: string;
  readonly kind: SpanKind;
}

/** A finished span, as an exporter sends it. Times are Unix nanoseconds. */
export interface SpanData extends SpanStart {
  readonly startNs: bigint;
  readonly endNs: bigint;
  readonly attributes: SpanAttributes;
  /** Set where the span ended in a fault of the gateway or its source (its message); undefined: no error. */
  readonly error: string | undefined;
}

/** Where finished spans go (an exporter). Called on the call's path: it must queue and return, never throw. */
export interface SpanSink {
  add(span: SpanData): void;
}

/** A log line's fields naming a span: `traceId` and `spanId`, or none where there is no span. */
export function spanLogFields(span: { readonly traceId: string; readonly spanId: string } | undefined): { readonly traceId?: string; readonly spanId?: string } {
  return span === undefined ? {} : { traceId: span.traceId, spanId: span.spanId };
}

/** A span being recorded. */
export interface ActiveSpan {
  readonly traceId: string;
  readonly spanId: string;
  /** The context a child's work is handed (a purchase's request to the provider): this span as the parent, sampled. */
  readonly context: TraceContext;
  /** A span beneath this one. */
  child(name: string, kind: SpanKind): ActiveSpan;
  end(attributes: SpanAttributes, error?: string): void;
}

/**
 * Random ids, cut from a pool drawn 8 KiB at a time: drawing 8 or 16 bytes
 * for each id had been the largest cost of recording a span.
 */
const pool = Buffer.allocUnsafe(8192);
let poolAt = pool.length;
function hexBytes(n: number): string {
  if (poolAt + n > pool.length) {
    randomFillSync(pool);
    poolAt = 0;
  }
  poolAt += n;
  return pool.toString("hex", poolAt - n, poolAt);
}

/** The wall clock in Unix ns: the monotonic clock, from where the wall clock stood when this module loaded. */
const epochNs = BigInt(Date.now()) * 1_000_000n - process.hrtime.bigint();
const nowNs = (): bigint => epochNs + process.hrtime.bigint();

class RecordingSpan implements ActiveSpan {
  readonly traceId: string;
  readonly spanId: string;
  readonly context: TraceContext;
  private readonly sink: SpanSink;
  private readonly start: SpanStart;
  private readonly startNs = nowNs();
  private ended = false;

  constructor(sink: SpanSink, start: SpanStart) {
    this.sink = sink;
    this.start = start;
    this.traceId = start.traceId;
    this.spanId = start.spanId;
    this.context = { traceparent: `00-${start.traceId}-${start.spanId}-01`, tracestate: start.traceState, traceId: start.traceId, span: this };
  }

  child(name: string, kind: SpanKind): ActiveSpan {
    return new RecordingSpan(this.sink, { traceId: this.traceId, spanId: hexBytes(8), parentSpanId: this.spanId, remoteParent: false, traceState: this.start.traceState, name, kind });
  }

  end(attributes: SpanAttributes, error?: string): void {
    if (this.ended) return;
    this.ended = true;
    this.sink.add({ ...this.start, startNs: this.startNs, endNs: nowNs(), attributes, error });
  }
}

export class Tracer {
  private readonly sink: SpanSink;
  private readonly ratio: number;
  private readonly random: () => number;

  /**
   * `ratio`: of the calls with no `traceparent`, the share recorded (0 to
   * 1), each as the root of a trace of its own.
   */
  constructor(sink: SpanSink, ratio: number, random: () => number = Math.random) {
    this.sink = sink;
    this.ratio = ratio;
    this.random = random;
  }

  /** The span of a call whose caller sent `trace` (or none), or undefined where it is not sampled. */
  startCall(trace: TraceContext | undefined, name: string): ActiveSpan | undefined {
    if (trace !== undefined) {
      // The caller decided: its flags' sampled bit.
      if ((parseInt(trace.traceparent.slice(53, 55), 16) & 1) === 0) return undefined;
      return new RecordingSpan(this.sink, { traceId: trace.traceId, spanId: hexBytes(8), parentSpanId: trace.traceparent.slice(36, 52), remoteParent: true, traceState: trace.tracestate, name, kind: "server" });
    }
    if (this.ratio <= 0 || this.random() >= this.ratio) return undefined;
    return new RecordingSpan(this.sink, { traceId: hexBytes(16), spanId: hexBytes(8), parentSpanId: undefined, remoteParent: false, traceState: undefined, name, kind: "server" });
  }
}
