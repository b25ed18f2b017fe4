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
 * Not once the answer's head is written (the answer is on its way), unless
 * it is a stream that asked to be told (`callerEndedSignal`), nor on TLS,
 * where Node's HTTP/1.1 server takes a FIN as the request's end anyway.
 * `early` false (GATEWAY_HANG_UP_CHECK=off): streams only.
 */
export function checkHangUps(socket: Socket, early = true): void {
  socket.on("end", early ? onEnd : onEndStreaming);
}

/**
 * Streaming answers whose handler sends a message when told its caller
 * ended its side (`callerEndedSignal`), by request: a stream's head is
 * sent and it may be quiet for long (a watch waiting for the next call), so
 * a caller that closed its socket would be found only by the stream's next
 * message, a heartbeat's quarter-minute later or, where nothing beats, never.
 */
const streamPrompts = new WeakMap<http.IncomingMessage, AbortController>();

/**
 * For a streaming answer on HTTP/1.x: aborted once its caller ends its side
 * of the connection (a FIN) after the answer's head went. The handler then
 * sends a message at once (its heartbeat, or the state it last sent): a
 * caller that has closed answers it with a reset, which the looks that
 * follow find, and the stream ends (connect-node's signal); a caller that
 * only finished sending reads it and is followed on.
 */
export function callerEndedSignal(req: http.IncomingMessage): AbortSignal {
  let prompt = streamPrompts.get(req);
  if (prompt === undefined) {
    streamPrompts.set(req, (prompt = new AbortController()));
    if ((req.socket as AnsweringSocket | null)?.[ended] === true) prompt.abort();
  }
  return prompt.signal;
}

/** A caller's FIN while its streaming answer is on its way: the handler is told, and the connection looked at as it sends. */
function onEndStreaming(this: AnsweringSocket): void {
  this[ended] = true;
  const res = this._httpMessage;
  if (res == null || !res.headersSent || res.writableEnded) return;
  const prompt = streamPrompts.get(res.req);
  if (prompt === undefined) return;
  prompt.abort();
  look(this, res, 0);
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
  if (res != null && res.headersSent) return onEndStreaming.call(this);
  if (res == null || res.writableEnded) return;
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
