import type http from "node:http";
import type { Socket } from "node:net";

/**
 * HTTP/1.x callers that end their side of the connection (TCP FIN) while
 * their answer is still being made. Either the caller has hung up (closed
 * its socket, the ordinary way every client library gives up: a fetch
 * aborted, curl's `--max-time`, PHP's `CURLOPT_TIMEOUT`, a proxy whose own
 * client went away, nginx's default HTTP/1.0 connection to its upstream
 * among them) or it has only finished sending and still reads, as
 * `printf … | nc` does. TCP cannot tell the two apart until something is
 * sent: a closed socket answers data with a reset. So the server sends the
 * first bytes of the answer itself, `HTTP/1.1 `, which begin every answer
 * Node writes on either version (its status line is `HTTP/1.1 <code>
 * <reason>` for HTTP/1.0 requests too), and the answer's head, when it is
 * written, leaves them out: the caller reads the very bytes it would have
 * read, only the first nine of them sooner. Then the server looks at the
 * connection with an empty write, which sends nothing and reports a reset
 * that has come back: 1 ms later, then 10, 50 and 100, then every 100 ms
 * until the answer goes. A reset destroys the socket, and the core's check
 * before an answer is charged (caller-gone.ts, and connect-node's signal,
 * which a closed socket aborts) finds the caller gone: recorded 4017, not
 * charged. A caller still reading gets its answer, charged. And the core's
 * check looks once more itself (`callerReset`): on a busy server the timers
 * of those looks come late, and an answer made in the meantime would be
 * charged with the reset already come back.
 *
 * Not once the answer's head is written (the answer is on its way), nor on
 * TLS, where Node's HTTP/1.1 server takes a FIN as the request's end anyway.
 */
export function checkHangUps(socket: Socket): void {
  socket.on("end", onEnd);
}

/** What every answer of Node's HTTP/1.x server begins with, whatever the request's version. */
const answerStart = "HTTP/1.1 ";

/** The mark of a socket whose caller has ended its side. */
const ended = Symbol("caller ended its side");

/** Node's socket names the answer it is writing, or will write next (its first request not yet answered). */
type AnsweringSocket = Socket & { _httpMessage?: http.ServerResponse | null; [ended]?: true };

/** Node's answer keeps its head (status line and fields) with `_storeHeader` until its first bytes go. */
type StoringHead = http.ServerResponse & { _storeHeader(firstLine: string, headers: unknown): void };

function onEnd(this: AnsweringSocket): void {
  this[ended] = true;
  const res = this._httpMessage as StoringHead | null | undefined;
  if (res == null || res.headersSent || res.writableEnded) return;
  const storeHead = res._storeHeader;
  // Every status line Node writes begins so (ServerResponse.writeHead); one that did not would be written whole.
  res._storeHeader = function (firstLine, headers) {
    storeHead.call(this, firstLine.startsWith(answerStart) ? firstLine.slice(answerStart.length) : firstLine, headers);
  };
  this.write(answerStart);
  look(this, res, 0);
}

/** When to look again, after each look: 1 ms after the first bytes, then 10, 50, 100, then every 100 ms. */
const lookAfterMs = [1, 10, 50, 100];

function look(socket: AnsweringSocket, res: http.ServerResponse, looks: number): void {
  if (socket.destroyed || res.writableFinished || socket._httpMessage !== res) return;
  // Sends no bytes; a reset that came back is its error, and the socket is destroyed with it.
  if (looks > 0) socket.write("");
  setTimeout(look, lookAfterMs[looks] ?? 100, socket, res, looks + 1).unref();
}

/**
 * Whether the caller of an HTTP/1.x answer has gone, looked at now: its
 * connection reset, or, once the caller has ended its side, a reset that
 * has come back and not yet been read. An empty write reports that at once
 * (the socket's `errored`; it is destroyed on the next tick). Sends nothing;
 * costs a property read for a caller that has not ended its side.
 */
export function callerReset(res: http.ServerResponse): boolean {
  const socket = res.socket as AnsweringSocket | null;
  if (socket == null || socket[ended] !== true) return false;
  if (socket.destroyed || socket.errored != null) return true;
  socket.write("");
  return socket.errored != null;
}
