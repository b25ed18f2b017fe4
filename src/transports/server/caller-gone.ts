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
 * stream is destroyed once it is reset or its session is gone. An HTTP/1.x
 * caller that has ended its side is looked at when asked (callerReset). Asked only
 * before the answer is written (after, a response is destroyed as it ends).
 */
export function goneOf(res: ServerResponse | Http2ServerResponse | ServerHttp2Stream): () => "hung_up" | undefined {
  if ("stream" in res) return () => (res.stream.destroyed ? "hung_up" : undefined);
  if (!(res instanceof ServerResponse)) return () => (res.destroyed ? "hung_up" : undefined);
  return () => (res.destroyed || callerReset(res) ? "hung_up" : undefined);
}
