import type { UniversalServerResponse } from "@connectrpc/connect/protocol";

/** Whether an answer is gRPC's (not gRPC-Web's, whose trailers travel in the body). */
export function isGrpcAnswer(contentType: string | null | undefined): boolean {
  return contentType != null && contentType.startsWith("application/grpc") && !contentType.startsWith("application/grpc-web");
}

/**
 * gRPC's Trailers-Only answer to a call that ends with no message (an
 * error): the response's one HEADERS frame carries the status and ends the
 * stream (PROTOCOL-HTTP2, "Trailers-Only is permitted for calls that
 * produce an immediate error"). It is the only error answer a gRPC client's
 * retry policy may retry (gRFC A6, "when retries are valid"): headers that
 * arrive apart from the trailers commit the call, so grpc-js, grpc-go and
 * grpc-java never retry it, whatever its code or `grpc-retry-pushback-ms`.
 * connect-node sends its headers first; this turns its answer around.
 *
 * connect-node's answer with its body's first chunk read (its trailers are
 * whole only once the body has ended): `head`, the headers and trailers as
 * one, for a gRPC answer whose body ended with nothing in it and whose
 * trailers hold its status; otherwise the answer as it was, its body
 * unchanged to whoever reads it.
 */
export async function trailersOnlyOr(response: UniversalServerResponse): Promise<{ readonly head: Headers } | { readonly response: UniversalServerResponse }> {
  const body = response.body;
  if (!isGrpcAnswer(response.header?.get("content-type")) || body === undefined || body instanceof Uint8Array) return { response };
  const it = body[Symbol.asyncIterator]();
  const first = await it.next();
  if (first.done === true && response.trailer?.has("grpc-status") === true) {
    const head = new Headers(response.header);
    response.trailer.forEach((value, name) => head.set(name, value));
    return { head };
  }
  const rest = (async function* () {
    if (first.done === true) return;
    yield first.value;
    // Hands return() and throw() on to connect-node's own iterator, as its writer expects.
    yield* { [Symbol.asyncIterator]: () => it };
  })();
  return { response: { ...response, body: rest } };
}
