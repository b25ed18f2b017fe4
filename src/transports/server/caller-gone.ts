import { ServerResponse } from "node:http";
import { callerReset } from "./hang-up-check.ts";
import type { Http2ServerResponse, ServerHttp2Stream } from "node:http2";

/**
 * The core's `CallInput.gone` for a call answered on Node's HTTP/1.1
 * response, HTTP/2's compatibility response or an HTTP/2 stream: gone once
 * nothing can reach the caller any more. Node's HTTP/1.1 response is
 * destroyed once its socket is reset or closed; a client's FIN alone does
 * not close it, since the server keeps half-open connections for callers
 * that end their side and still read (one-port-server.ts). An HTTP/2
 * stream is gone once it is reset or its session is (streamGone). An HTTP/1.x
 * caller that has ended its side is looked at when asked (callerReset). Asked only
 * before the answer is written (after, a response is destroyed as it ends).
 */
export function goneOf(res: ServerResponse | Http2ServerResponse | ServerHttp2Stream): () => "hung_up" | undefined {
  if ("stream" in res) return () => (streamGone(res.stream) ? "hung_up" : undefined);
  if (!(res instanceof ServerResponse)) return () => (streamGone(res) ? "hung_up" : undefined);
  return () => (res.destroyed || callerReset(res) ? "hung_up" : undefined);
}

/**
 * An HTTP/2 stream's caller is gone once it has reset the stream before the
 * answer ended (`aborted`, set as the reset is read, before the stream is
 * destroyed and its request closes) or the stream is destroyed (its session
 * gone).
 */
export function streamGone(stream: ServerHttp2Stream): boolean {
  return stream.aborted || stream.destroyed;
}
