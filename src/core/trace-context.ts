import type { ActiveSpan } from "./tracing.ts";

/**
 * A caller's W3C Trace Context (https://www.w3.org/TR/trace-context/): the
 * `traceparent` it sent and its `tracestate`. A call that buys its item from
 * the upstream provider hands them on to the provider, so the provider's
 * work joins the caller's trace; the gateway's log lines carry the trace id.
 *
 * Where the gateway records no span of the call (no tracer, or a caller
 * that did not sample its trace), it forwards the caller's parent id as it
 * came (a participant that adds no span of its own): the provider's span is
 * then the caller's child, with no missing parent between them. Where it
 * does (tracing.ts), the purchase carries the gateway's own span as the
 * parent. One purchase serves every call that waits on it (single-flight),
 * so it carries the context of the call that started it.
 */
export interface TraceContext {
  /** As forwarded: version 00, lowercase. */
  readonly traceparent: string;
  /** Forwarded as it came, when it is printable ASCII of at most 512 characters (the spec lets a participant drop a longer one). */
  readonly tracestate: string | undefined;
  readonly traceId: string;
  /** The gateway's own span whose id `traceparent` carries as the parent, where the gateway records one (tracing.ts). */
  readonly span?: ActiveSpan | undefined;
}

const hex = /^[0-9a-f]+$/;
const zeros = /^0+$/;
const printable = /^[\x20-\x7e]*$/;

/**
 * The context of a call from its two headers, or undefined where
 * `traceparent` is absent or not one the spec lets a participant continue:
 * not four lowercase hex fields, a trace or parent id of zeros, version
 * `ff`, a version-00 value with anything after its flags (a repeated
 * header, joined, is one). A later version is read for its first four
 * fields, as the spec asks, and forwarded as version 00.
 */
export function traceContextOf(traceparent: string | undefined, tracestate: string | undefined): TraceContext | undefined {
  if (traceparent === undefined || traceparent.length < 55) return undefined;
  const version = traceparent.slice(0, 2);
  if (!hex.test(version) || version === "ff") return undefined;
  if (version === "00" ? traceparent.length !== 55 : traceparent.length > 55 && traceparent[55] !== "-") return undefined;
  const [, traceId, parentId, flags] = traceparent.slice(0, 55).split("-");
  if (traceparent[2] !== "-" || traceparent[35] !== "-" || traceparent[52] !== "-") return undefined;
  if (!hex.test(traceId!) || zeros.test(traceId!) || !hex.test(parentId!) || zeros.test(parentId!) || !hex.test(flags!)) return undefined;
  const state = tracestate !== undefined && tracestate.length <= 512 && printable.test(tracestate) ? tracestate : undefined;
  return { traceparent: `00-${traceId}-${parentId}-${flags}`, tracestate: state, traceId: traceId! };
}

/** The trace id a log line names for a call's `traceparent`, or undefined. */
export function traceIdOf(traceparent: string | string[] | undefined): string | undefined {
  return typeof traceparent === "string" ? traceContextOf(traceparent, undefined)?.traceId : undefined;
}
