import type http from "node:http";
import type { Socket } from "node:net";

/**
 * HTTP/1.1 callers that end their side of the connection (TCP FIN) while
 * their answer is still being made. Either the caller has hung up (closed
 * its socket, the ordinary way every client library gives up: a fetch
 * aborted, curl's `--max-time`, PHP's `CURLOPT_TIMEOUT`, a proxy whose own
 * client went away) or it has only finished sending and still reads, as
 * `printf … | nc` does. TCP cannot tell the two apart until something is
 * sent: a closed socket answers data with a reset. So the server sends the
 * one thing HTTP/1.1 lets it send before an answer, an interim
 * `102 Processing` (RFC 9110, section 15.2: a client must take any number of
 * 1xx answers before the final one), and then looks at the connection with
 * an empty write, which sends nothing and reports a reset that has come
 * back: 1 ms later, then 10, 50 and 100, then every 100 ms until the answer
 * goes. A reset destroys the socket, and the core's check before an answer
 * is charged (caller-gone.ts, and connect-node's signal, which a closed
 * socket aborts) finds the caller gone: recorded 4017, not charged. A caller
 * still reading gets the interim answer, then its answer, charged.
 *
 * Not for HTTP/1.0 requests (no 1xx may be sent to them), nor once the
 * answer's head has gone (the answer is on its way), nor on TLS, where
 * Node's HTTP/1.1 server takes a FIN as the request's end anyway.
 */
export function checkHangUps(socket: Socket): void {
  socket.on("end", onEnd);
}

/** Node's socket names the answer it is writing, or will write next (its first request not yet answered). */
type AnsweringSocket = Socket & { _httpMessage?: http.ServerResponse | null };

function onEnd(this: AnsweringSocket): void {
  const res = this._httpMessage;
  if (res == null || res.headersSent || res.writableEnded || res.req.httpVersionMinor < 1) return;
  res.writeProcessing();
  look(this, res, 0);
}

/** When to look again, after each look: 1 ms after the interim answer, then 10, 50, 100, then every 100 ms. */
const lookAfterMs = [1, 10, 50, 100];

function look(socket: AnsweringSocket, res: http.ServerResponse, looks: number): void {
  if (socket.destroyed || res.writableFinished || socket._httpMessage !== res) return;
  // Sends no bytes; a reset that came back is its error, and the socket is destroyed with it.
  if (looks > 0) socket.write("");
  setTimeout(look, lookAfterMs[looks] ?? 100, socket, res, looks + 1).unref();
}
