import type http from "node:http";
import http2 from "node:http2";
import type { Socket } from "node:net";

/**
 * Clients that send faster than they read. Node's HTTP/1.1 server parses
 * every request of a chunk it reads (up to 64 KiB: a couple of thousand
 * pipelined GETs) and hands each to the handler at once; it stops reading
 * only once answers wait to be written, after that chunk. A client that
 * pipelines and never reads had each of those requests handled and its
 * answer held in memory behind the first: 100 connections of 1,000
 * pipelined GETs each took a gateway past its heap limit in 12 s (V8's
 * "heap out of memory", the process gone), and a 404's answer of 452 bytes
 * did it as well as the 42 kB OpenAPI document, since each request held
 * about 5 kB of Node's and Fastify's objects. And an answer a client does
 * not take stays in memory, with its connection, for as long as the client
 * keeps the connection open: Node has no send timeout.
 *
 * So, for HTTP/1.1 (cleartext, or TLS with ALPN `http/1.1`):
 * - a request that arrives while another of its connection is in hand is
 *   held, and taken up once the chunk it came in has been parsed (on the
 *   next turn of the event loop), so that a connection closed for what
 *   follows it in the chunk has none of it handled (or charged);
 * - at most `answersAtOnce` requests of one connection are handled at once
 *   (answered, or their answers waiting to be written); the rest of a
 *   pipeline is held, not handled (so not charged), and the connection is
 *   not read further until the held ones are taken up, one as each answer
 *   goes out;
 * - a connection with more than `answersAtOnce + heldPerConnection` (36)
 *   requests in hand or held, or whose held request would take all
 *   connections' past `heldInAll`, is
 *   closed: its held requests were never handled (`pipeline` in
 *   `gateway_slow_readers_cut_total`), and the rest of the chunk is not
 *   parsed (stopParsing): closing alone is not enough, since Node would go
 *   on making a request and an answer object for each request left in the
 *   chunk, and keep them until the close is processed, after every other
 *   connection's chunk of the same turn of the event loop;
 * - a connection whose answer waits to be written and whose client has
 *   taken none of it for the send timeout is closed (`send_timeout`), as
 *   nginx's `send_timeout` does.
 */
export const answersAtOnce = 4;
export const heldPerConnection = 32;
export const heldInAll = 4096;

/** Why HTTP/1.1 connections were closed or HTTP/2 streams reset under a client that did not read: the counts `gateway_slow_readers_cut_total` reports. */
export const cutReasons = ["pipeline", "send_timeout", "http2_send_timeout", "http2_waiting"] as const;
export type CutReason = (typeof cutReasons)[number];
export type CutCounts = Record<CutReason, number>;

/** A server's counts, none yet: its HTTP/1.1 gate and its HTTP/2 watcher add to the same ones. */
export function noCuts(): CutCounts {
  return { pipeline: 0, send_timeout: 0, http2_send_timeout: 0, http2_waiting: 0 };
}

/** For a stream closed with an error code, which emits it: unheard, it would stop the process. */
export const ignore = () => {};

/** The socket of an answer's request: Node detaches it from the answer before `finish` listeners run. */
export const requestSocket = Symbol("requestSocket");
export type AnsweredOn = http.ServerResponse & { [requestSocket]?: Socket };

interface Pipeline {
  /** Requests handed to the handler whose answers have not all gone to the socket. */
  busy: number;
  held: [http.IncomingMessage, AnsweredOn][];
  /** This gate stopped reading the socket (Node may stop it for its own reasons too). */
  paused: boolean;
  /** Held requests are to be taken up on the next turn of the event loop. */
  scheduled: boolean;
  /** Bytes the socket had taken at the last look, and since when that has not changed while some wait (0: none wait). */
  taken: number;
  stalledSince: number;
}
const pipeline = Symbol("pipeline");
type GatedSocket = Socket & { [pipeline]?: Pipeline; _paused?: boolean; parser?: { onIncoming: unknown } | null };

/**
 * Closes a connection and stops Node's parser at the next request head of
 * the chunk it is parsing: Node returns what its `onIncoming` returns from
 * llhttp's `on_headers_complete`, and 2 there makes llhttp stop
 * (HPE_PAUSED_UPGRADE, which Node takes as a normal end of the chunk; what
 * is left of it is dropped). The parser is Node's again once the socket has
 * closed (Node resets it before pooling it).
 */
function cutConnection(socket: GatedSocket): void {
  if (socket.parser) socket.parser.onIncoming = stopParsing;
  socket.destroy();
}
const stopParsing = () => 2;

export interface SlowReaders {
  /** The handler, gated as above for HTTP/1.1 requests; HTTP/2 compatibility requests pass straight through. */
  readonly handler: (req: http.IncomingMessage, res: http.ServerResponse) => void;
  stop(): void;
}

/**
 * Gates `next` (see above), and calls `afterAnswer` on each HTTP/1.1 answer
 * once it has gone to the socket; counts what it closes in `cut`.
 * Connections are looked at every quarter of the send timeout (at least
 * every 250 ms) for answers their clients do not take.
 */
export function watchSlowReaders(
  next: (req: http.IncomingMessage, res: http.ServerResponse) => void,
  sendTimeoutMs: number,
  afterAnswer: (this: AnsweredOn) => void,
  cut: CutCounts,
): SlowReaders {
  const connections = new Set<GatedSocket>();
  let heldNow = 0;

  const closed = function (this: GatedSocket) {
    connections.delete(this);
    const p = this[pipeline]!;
    heldNow -= p.held.length;
    p.held.length = 0;
  };

  /** Takes up held requests while fewer than `answersAtOnce` are in hand, and reads the socket again once none are held. */
  const takeUp = (socket: GatedSocket, p: Pipeline) => {
    while (p.busy < answersAtOnce && p.held.length > 0) {
      const [req, res] = p.held.shift()!;
      heldNow--;
      p.busy++;
      next(req, res);
    }
    if (p.paused && p.held.length === 0) {
      p.paused = false;
      // Unless Node stopped it too (answers it has not written yet past its high-water mark): it resumes it itself.
      if (socket._paused !== true) socket.resume();
    }
  };
  const takeUpLater = (socket: GatedSocket) => {
    const p = socket[pipeline]!;
    p.scheduled = false;
    if (!socket.destroyed) takeUp(socket, p);
  };

  // One function for every answer, not a closure each, and the server's own `finish` work with it: this runs on every request.
  const answered = function (this: AnsweredOn) {
    afterAnswer.call(this);
    const socket = this[requestSocket] as GatedSocket | undefined;
    const p = socket?.[pipeline];
    if (p === undefined || socket!.destroyed) return;
    p.busy--;
    if (!p.scheduled) takeUp(socket!, p);
  };

  const handler = (req: http.IncomingMessage, res: http.ServerResponse) => {
    if (req.httpVersionMajor !== 1) return next(req, res);
    const socket = req.socket as GatedSocket;
    if (socket.destroyed) return cutConnection(socket);
    let p = socket[pipeline];
    if (p === undefined) {
      p = socket[pipeline] = { busy: 0, held: [], paused: false, scheduled: false, taken: 0, stalledSince: 0 };
      connections.add(socket);
      socket.once("close", closed);
    }
    (res as AnsweredOn)[requestSocket] = socket;
    res.on("finish", answered);
    if (p.busy === 0 && p.held.length === 0) {
      p.busy++;
      next(req, res);
      return;
    }
    if (p.busy + p.held.length >= answersAtOnce + heldPerConnection || heldNow >= heldInAll) {
      cut.pipeline++;
      cutConnection(socket);
      return;
    }
    p.held.push([req, res]);
    heldNow++;
    if (!p.scheduled) {
      p.scheduled = true;
      setImmediate(takeUpLater, socket);
    }
    if (!p.paused) {
      p.paused = true;
      socket.pause();
    }
  };

  const sweep = setInterval(() => {
    const now = performance.now();
    for (const socket of connections) {
      const p = socket[pipeline]!;
      const waiting = socket.writableLength;
      if (waiting === 0) {
        p.stalledSince = 0;
        continue;
      }
      const taken = (socket.bytesWritten ?? 0) - waiting;
      if (p.stalledSince === 0 || taken !== p.taken) {
        p.taken = taken;
        p.stalledSince = now;
      } else if (now - p.stalledSince >= sendTimeoutMs) {
        cut.send_timeout++;
        socket.destroy();
      }
    }
  }, Math.max(250, Math.floor(sendTimeoutMs / 4)));
  sweep.unref();

  return { handler, stop: () => clearInterval(sweep) };
}

/** How often HTTP/2 answers are looked at: often enough that a burst of them is seen within a few thousand calls. */
const http2LookEveryMs = 100;

/**
 * HTTP/2: answers a client does not take. A stream's answer waits in the
 * gateway for as long as its client gives no flow-control window for it
 * (a client may open its streams with a window of 0), its stream open:
 * 100 connections of 100 streams that asked for the 42 kB OpenAPI
 * document with a window of 0 took a gateway of the default budget from
 * 175 MB to 698 MB and every stream the gateway takes at once
 * (`GATEWAY_MAX_CONNECTIONS`), so every other HTTP/2 call was refused for
 * as long as those connections stayed open. nghttp2's session memory limit
 * does not count these bytes. So, every 100 ms, over the open streams:
 * - a stream whose answer has had bytes waiting, none of them taken, for
 *   the send timeout is reset (CANCEL; `http2_send_timeout`);
 * - while the bytes waiting across all streams are past `waitingAnswerBytes`,
 *   the streams that took none since the last look are reset, most waiting
 *   first, until they are not (`http2_waiting`). A stream whose answer is
 *   moving is never reset for it.
 * A stream's waiting bytes are those its writer has handed over and nghttp2
 * has not yet sent (`writableLength`): an answer moves in the chunks it was
 * written in, so a client that takes less than a whole answer in the send
 * timeout is cut.
 */
export function watchHttp2Answers(
  open: ReadonlyMap<http2.ServerHttp2Stream, number>,
  limits: { readonly sendTimeoutMs: number; readonly waitingAnswerBytes: number },
  cut: CutCounts,
): { stop(): void } {
  // Streams seen with bytes waiting: how many, and since when that has not changed.
  const seen = new Map<http2.ServerHttp2Stream, { waiting: number; since: number }>();
  const reset = (stream: http2.ServerHttp2Stream, why: CutReason) => {
    cut[why]++;
    seen.delete(stream);
    stream.on("error", ignore);
    stream.close(http2.constants.NGHTTP2_CANCEL);
  };
  const look = setInterval(() => {
    const now = performance.now();
    let total = 0;
    const still: [http2.ServerHttp2Stream, number][] = [];
    for (const stream of open.keys()) {
      const waiting = stream.destroyed ? 0 : stream.writableLength;
      if (waiting === 0) {
        if (seen.size > 0) seen.delete(stream);
        continue;
      }
      const before = seen.get(stream);
      if (before === undefined || before.waiting !== waiting) {
        seen.set(stream, { waiting, since: now });
        total += waiting;
      } else if (now - before.since >= limits.sendTimeoutMs) {
        reset(stream, "http2_send_timeout");
      } else {
        total += waiting;
        still.push([stream, waiting]);
      }
    }
    for (const stream of seen.keys()) if (!open.has(stream)) seen.delete(stream);
    if (total <= limits.waitingAnswerBytes) return;
    still.sort((a, b) => b[1] - a[1]);
    for (const [stream, waiting] of still) {
      if (total <= limits.waitingAnswerBytes) break;
      reset(stream, "http2_waiting");
      total -= waiting;
    }
  }, http2LookEveryMs);
  look.unref();
  return { stop: () => clearInterval(look) };
}
