import http from "node:http";
import http2 from "node:http2";
import type { Server, Socket } from "node:net";
import { checkHangUps } from "./hang-up-check.ts";
import { ignore, noCuts, requestSocket, watchHttp2Answers, watchSlowReaders, type AnsweredOn, type CutCounts } from "./slow-readers.ts";

/** The client connection preface of HTTP/2 (RFC 9113, section 3.4). */
const h2Preface = Buffer.from("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "latin1");

/** Takes an HTTP/2 stream before Node's compatibility layer (and so Fastify) sees it; false leaves it to them. */
export type Http2StreamClaim = (stream: http2.ServerHttp2Stream, headers: http2.IncomingHttpHeaders) => boolean;

/** Takes an HTTP/1.1 request before Fastify sees it (and answers it); false leaves it to Fastify. */
export type Http1RequestClaim = (req: http.IncomingMessage, res: http.ServerResponse) => boolean;

/** What may take requests before Fastify: HTTP/2 streams, HTTP/1.1 requests. */
export interface RequestClaims {
  readonly http2Stream?: Http2StreamClaim | undefined;
  readonly http1Request?: Http1RequestClaim | undefined;
  /**
   * Answers an HTTP/2 stream whose request did not arrive whole within the
   * request timeout and whose answer has not started (as Fastify's
   * clientErrorHandler answers such an HTTP/1.1 request); without it the
   * stream is reset. The stream is reset once that answer has gone out.
   */
  readonly http2RequestTimedOut?: ((stream: http2.ServerHttp2Stream, headers: http2.IncomingHttpHeaders) => void) | undefined;
}

/** Fastify's request handler, which serves both HTTP/1.1 and HTTP/2 compatibility objects. */
export type Handler = (req: http.IncomingMessage, res: http.ServerResponse) => void;

/** Limits of the server. */
export interface OnePortServerOptions {
  keepAliveTimeoutMs: number;
  /** Time a client has to send a whole request (also the limit for its headers). */
  requestTimeoutMs: number;
  /** An HTTP/2 connection with no frame either way for this long is closed (after a short grace, even with streams open). */
  http2SessionTimeoutMs: number;
  /** Request line and headers together, in bytes. */
  maxHeaderBytes: number;
  /**
   * Open connections at once, both protocols; also the most HTTP/2 streams
   * open at once across all connections (a stream is a request in flight,
   * as an HTTP/1.1 connection is): more are refused with REFUSED_STREAM.
   */
  maxConnections: number;
  /**
   * Open connections at once from one client address (0: no cap): more
   * from it are closed as they are accepted, so one client cannot hold
   * `maxConnections` for everyone. The address is the connection's own, a
   * proxy's when there is one in front.
   */
  maxConnectionsPerAddress: number;
  /** Addresses `maxConnectionsPerAddress` does not hold (the trusted proxies, each carrying many clients' calls); none when unset. */
  uncappedAddress?: ((address: string) => boolean) | undefined;
  /**
   * HTTP/2 streams one connection may have open at once, advertised to the
   * client (SETTINGS_MAX_CONCURRENT_STREAMS): a client waits for a free one,
   * and nghttp2 ends the connection of one that opens more than it has
   * acknowledged (GOAWAY, PROTOCOL_ERROR).
   */
  http2MaxStreams: number;
  /**
   * Time a new connection has to send its first request head (HTTP/1.1) or
   * the whole HTTP/2 preface; a connection silent past it is closed, so
   * sockets that send nothing cannot hold the connection cap.
   */
  firstRequestTimeoutMs: number;
  /**
   * Time a client has to take some of an answer waiting to be written; an
   * HTTP/1.1 connection whose client took none of it for this long is
   * closed, an HTTP/2 stream reset (slow-readers.ts).
   */
  sendTimeoutMs: number;
  /**
   * Bytes of HTTP/2 answers that may wait, all connections together, for
   * clients that do not take them; past it, the answers that have waited
   * longest without progress are reset (slow-readers.ts).
   */
  waitingAnswerBytes: number;
  /**
   * An HTTP/1.1 caller that ends its side of the connection before its
   * answer is sent an interim `102 Processing`, so a caller that hung up is
   * told from one still reading (hang-up-check.ts).
   */
  hangUpCheck: boolean;
}

/** What the servers below add to Node's: Fastify's close hook for HTTP/2 sessions, the HTTP/1.1 connections closed and HTTP/2 streams reset under clients that did not read, and what the connection cap holds and refused. */
export interface OnePortServerExtras {
  closeHttp2Sessions(): void;
  readonly slowReadersCut: CutCounts;
  readonly connections: ConnectionCounts;
}

/**
 * What the connection cap (`maxConnections`) holds now and has refused,
 * read when the metrics are scraped. A refusal is otherwise seen by its
 * client alone: a connection past the cap is closed as it is accepted, with
 * nothing written to it, and a stream past it is reset (REFUSED_STREAM).
 */
export interface ConnectionCounts {
  /** Connections open now, both protocols, as the cap counts them (a TLS one from when it is accepted, its handshake included). */
  open(): Promise<number>;
  /** HTTP/2 sessions open now (each one of the connections). */
  http2Sessions(): number;
  /** HTTP/2 streams open now across sessions, as the cap counts them too. */
  http2Streams(): number;
  /** Refused at the caps since the server started. */
  readonly refused: Record<CapRefusal, number>;
  /** Told of each refusal as it happens (`buildApp` logs it); nothing by default. */
  onRefused: (what: CapRefusal) => void;
  /** The client addresses holding the most connections now, most first (at most `n`, up to `warnedHolders`; worked out at most once a second, for the refusals' warnings). */
  heldMostBy(n: number): readonly ConnectionHolder[];
  /** Client addresses with a connection open now. */
  addresses(): number;
  /** The most connections one address holds now, the addresses the per-address cap does not hold (trusted proxies) left out (0: none open). */
  mostByOneAddress(): number;
  /** The `n` addresses holding the most connections now, most first and ties by address, each marked if the per-address cap does not hold it: worked out as asked (AdminService.GetConnections). */
  holders(n: number): readonly (ConnectionHolder & { readonly uncapped: boolean })[];
}

export interface ConnectionHolder {
  readonly address: string;
  readonly connections: number;
}

/** How many of the addresses holding the most a refusal's warning names. */
export const warnedHolders = 3;

/**
 * Open connections by client address, each admitted only while its
 * address holds fewer than `max` (0: no cap), a trusted proxy's always
 * (`uncappedAddress`). One map entry per address
 * with a connection open, counted up as one is accepted and down as it
 * closes: work per connection, none per request.
 */
class ConnectionsByAddress {
  private readonly open = new Map<string, number>();
  private readonly max: number;
  private readonly uncapped: (address: string) => boolean;
  private ranked: ConnectionHolder[] = [];
  private rankedAt = Number.NEGATIVE_INFINITY;

  constructor(options: Pick<OnePortServerOptions, "maxConnectionsPerAddress" | "uncappedAddress">) {
    this.max = options.maxConnectionsPerAddress;
    this.uncapped = options.uncappedAddress ?? (() => false);
  }

  /** Counts `socket` to its address and true, or false (the socket is the caller's to close) when its address is at the cap. */
  admit(socket: Socket): boolean {
    const address = socket.remoteAddress ?? "";
    const held = this.open.get(address) ?? 0;
    if (this.max > 0 && held >= this.max && !this.uncapped(address)) return false;
    this.open.set(address, held + 1);
    socket.once("close", () => {
      const left = (this.open.get(address) ?? 1) - 1;
      if (left > 0) this.open.set(address, left);
      else this.open.delete(address);
    });
    return true;
  }

  heldMostBy(n: number): readonly ConnectionHolder[] {
    // Asked on every refusal, which come thousands a second in a flood: the ranking is kept a second.
    const now = performance.now();
    if (now - this.rankedAt >= 1000) {
      this.ranked = this.rank(warnedHolders);
      this.rankedAt = now;
    }
    return this.ranked.slice(0, n);
  }

  get addresses(): number {
    return this.open.size;
  }

  /** The most one address the cap holds has open (a trusted proxy's are many clients'). */
  mostByOne(): number {
    let most = 0;
    for (const [address, held] of this.open) if (held > most && !this.uncapped(address)) most = held;
    return most;
  }

  /** The `n` addresses holding the most now, most first, ties by address (so one ranking reads the same twice). */
  rank(n: number): ConnectionHolder[] {
    const all = [...this.open].map(([address, connections]) => ({ address, connections }));
    return all.sort((a, b) => b.connections - a.connections || (a.address < b.address ? -1 : a.address > b.address ? 1 : 0)).slice(0, n);
  }

  isUncapped(address: string): boolean {
    return this.uncapped(address);
  }
}

/**
 * What the connection caps refuse: a connection past `maxConnections` or
 * one past `maxConnectionsPerAddress` from its address (each closed as it is
 * accepted), or an HTTP/2 stream past `maxConnections` (REFUSED_STREAM).
 */
export const capRefusals = ["connection", "address", "stream"] as const;
export type CapRefusal = (typeof capRefusals)[number];

/** A server's connection counts, read from the server, its sessions, its streams and its connections by address. */
function countConnections(server: Server, sessions: { readonly size: number }, streams: { readonly size: number }, byAddress: ConnectionsByAddress): ConnectionCounts {
  const counts: ConnectionCounts = {
    open: () => new Promise((resolve) => server.getConnections((e, n) => resolve(e ? Number.NaN : n))),
    http2Sessions: () => sessions.size,
    http2Streams: () => streams.size,
    refused: { connection: 0, address: 0, stream: 0 },
    onRefused: () => {},
    heldMostBy: (n) => byAddress.heldMostBy(n),
    addresses: () => byAddress.addresses,
    mostByOneAddress: () => byAddress.mostByOne(),
    holders: (n) => byAddress.rank(n).map((h) => ({ ...h, uncapped: byAddress.isUncapped(h.address) })),
  };
  // Node's net server closes a connection past `maxConnections` as it accepts it, and says so only by this event.
  server.on("drop", () => {
    counts.refused.connection++;
    counts.onRefused("connection");
  });
  return counts;
}

/**
 * How often Node looks for requests past the request (or header) timeout: a
 * quarter of it, so a request is cut between 1 and 1.25 times the timeout
 * (Node's default, every 30 s, would let a 30 s timeout run to 60).
 */
function timeoutCheckEvery(requestTimeoutMs: number): number {
  return Math.max(50, Math.min(30_000, Math.floor(Math.min(requestTimeoutMs, 60_000) / 4)));
}

/** How long an HTTP/2 session closed for idleness may wait for its open streams before it is cut. */
const idleSessionGraceMs = 5000;

const firstRequestTimer = Symbol("firstRequestTimer");
type PendingSocket = Socket & { [firstRequestTimer]?: NodeJS.Timeout };

/** Closes the socket unless firstRequestArrived is called for it within `ms`. */
function awaitFirstRequest(socket: PendingSocket, ms: number): void {
  socket[firstRequestTimer] = setTimeout(() => socket.destroy(), ms);
  socket[firstRequestTimer].unref();
  socket.once("close", () => firstRequestArrived(socket));
}

function firstRequestArrived(socket: PendingSocket): void {
  const timer = socket[firstRequestTimer];
  if (timer === undefined) return;
  clearTimeout(timer);
  // Not deleted: a deleted property would turn the socket into a slow dictionary-mode object for every later request.
  socket[firstRequestTimer] = undefined;
}

/**
 * An HTTP/1.1 server that also speaks cleartext HTTP/2 with prior knowledge
 * on the same port: the first bytes of each connection decide. HTTP/1.1
 * serves curl, legacy callers, Connect and gRPC-Web; HTTP/2 serves gRPC.
 * The returned object is the HTTP/1.1 server, which owns the listening socket,
 * so Fastify's lifecycle (listen, close, idle-connection cleanup) applies to
 * it; `closeHttp2Sessions` lets Fastify drain the HTTP/2 side on close.
 * `claims` may take HTTP/2 streams and HTTP/1.1 requests before Fastify sees them.
 */
export function createOnePortServer(handler: Handler, options: OnePortServerOptions, claims: RequestClaims = {}): http.Server {
  // Once closing starts, every HTTP/1.1 connection ends with its current
  // response, and HTTP/2 sessions get a GOAWAY and end with their streams.
  let closing = false;
  const onFinish = function (this: AnsweredOn) {
    leftBodyDiscarded.call(this);
    if (closing) setImmediate(() => h1.closeIdleConnections());
  };
  const cut = noCuts();
  const readers = watchSlowReaders(http1Handler(handler, claims.http1Request), options.sendTimeoutMs, onFinish, cut);
  const h1 = http.createServer({ maxHeaderSize: options.maxHeaderBytes, connectionsCheckingInterval: timeoutCheckEvery(options.requestTimeoutMs) }, readers.handler);
  h1.keepAliveTimeout = options.keepAliveTimeoutMs;
  h1.requestTimeout = options.requestTimeoutMs;
  h1.headersTimeout = Math.min(options.requestTimeoutMs, 60_000);
  h1.maxConnections = options.maxConnections;
  // A client may finish sending (half-close) and still read the answer, as `printf … | nc`
  // does; by default Node would drop the request if the answer is not ready yet.
  (h1 as http.Server & { httpAllowHalfOpen: boolean }).httpAllowHalfOpen = true;
  const h2 = http2.createServer({ maxSessionMemory: 10, settings: http2Settings(options) }, handler as unknown as (req: http2.Http2ServerRequest, res: http2.Http2ServerResponse) => void);
  const streams = serveHttp2Streams(h2, options, claims, cut, () => connections);
  const sessions = trackHttp2Sessions(h2, options);
  // The HTTP/1.1 server accepts every connection, HTTP/2 ones too, and counts them against the caps.
  const byAddress = new ConnectionsByAddress(options);
  const connections = countConnections(h1, sessions, streams, byAddress);

  const h1Listeners = h1.listeners("connection") as ((socket: Socket) => void)[];
  h1.removeAllListeners("connection");
  h1.on("connection", (socket: PendingSocket) => {
    if (!admitted(socket, byAddress, connections)) return;
    awaitFirstRequest(socket, options.firstRequestTimeoutMs);
    let seen = Buffer.alloc(0);
    const decide = () => {
      let chunk: Buffer | null;
      while ((chunk = socket.read() as Buffer | null) !== null) seen = Buffer.concat([seen, chunk]);
      const n = Math.min(seen.length, h2Preface.length);
      const isH2 = seen.subarray(0, n).equals(h2Preface.subarray(0, n));
      if (isH2 && seen.length < h2Preface.length) return; // wait for the rest of the preface
      socket.off("readable", decide);
      socket.off("end", onEnd);
      socket.unshift(seen);
      if (isH2) {
        firstRequestArrived(socket); // the preface is whole: the session's own timeout takes over
        // The HTTP/1.1 server accepts sockets half-open (for `printf … | nc` clients); an HTTP/2 server does
        // not, and its session needs the socket to close when the client's side ends: half-open, a stream
        // still waiting for its request held the socket, the connection cap and a graceful close until
        // the session's idle timeout.
        socket.allowHalfOpen = false;
        h2.emit("connection", socket);
      }
      else {
        // Off, a caller that ends its side early is answered as any; a quiet stream's is still looked for.
        checkHangUps(socket, options.hangUpCheck);
        for (const listener of h1Listeners) listener.call(h1, socket);
      }
    };
    const onEnd = () => socket.destroy();
    socket.on("readable", decide);
    socket.on("end", onEnd);
  });

  h1.on("request", (req: http.IncomingMessage, res: http.ServerResponse) => {
    firstRequestArrived(req.socket);
    if (closing) res.shouldKeepAlive = false;
  });
  // Fastify calls this hook by name when it starts closing.
  Object.assign(h1, {
    closeHttp2Sessions() {
      closing = true;
      sessions.closeAll();
    },
    slowReadersCut: cut,
    connections,
  } satisfies OnePortServerExtras);
  h1.on("close", () => {
    readers.stop();
    streams.stop();
    h2.close();
  });
  return h1;
}

/**
 * An answer finished before its request's body was read to the end (a body
 * over the size limit, which connect-node stops reading at the limit, and
 * whose request it may destroy). Node discards the rest of a body nobody
 * started reading, so the connection can carry the next request; but once a
 * handler has started reading, Node leaves the rest to it, the parser stops
 * reading the socket when the request holds more than it takes (arrived
 * whole or not), and the connection waits: a keep-alive client's next
 * request goes unanswered until the request timeout. So the rest is
 * discarded as Node discards it (its `_dump`, which makes the parser drop
 * what still comes), and the socket read again. The request timeout still
 * bounds how long its sender may take.
 */
function leftBodyDiscarded(this: AnsweredOn): void {
  const req = this.req;
  // Read to its end, or arrived whole and taken: nothing holds the parser.
  if (req.readableEnded || (req.complete && req.readableLength === 0)) return;
  (req as unknown as { _dump?(): void })._dump?.();
  // A destroyed request no longer names its socket; the answer kept it.
  const socket = this[requestSocket];
  if (socket !== undefined && !socket.destroyed) socket.resume();
}

/**
 * The same over HTTP/2: a stream whose answer has ended before its request
 * was read to the end (connect-node stops reading at the size limit). Node
 * closes a stream only once both sides have ended, and a client that got its
 * answer may simply stop sending (connect-node's client does), so the
 * stream would stay open for the session's life and hold a graceful close of
 * the server until the session's idle timeout. So what still comes is
 * discarded, and once the answer's last frame (END_STREAM) has gone out the
 * stream is reset with NO_ERROR, as RFC 9113 (section 8.1) has a server ask a
 * client to stop sending a request it has answered. Reset earlier, frames
 * of the answer still queued would be dropped.
 */
function leftStreamBodyDiscarded(this: http2.ServerHttp2Stream & { [timedOut]?: true }): void {
  if (this.readableEnded || this.destroyed) return;
  // A request cut for its timeout: its handler may still wait for the body, and must not see it end
  // (it would take what came so far for the whole request); the stream is reset once answered.
  if (this[timedOut]) {
    closeOnceAnswered(this, 0);
    return;
  }
  this.removeAllListeners("readable");
  this.removeAllListeners("data");
  this.resume();
  closeOnceAnswered(this, 0);
}

/**
 * Once its END_STREAM has been sent (or the stream was reset), the stream is
 * destroyed: reset with NO_ERROR, and what its request still buffers dropped
 * (a closed stream whose request holds unread bytes is otherwise never
 * destroyed). Looks every 20 ms for up to 5 s; a client that reads nothing
 * of its answer for that long is left to the session's idle timeout.
 */
function closeOnceAnswered(stream: http2.ServerHttp2Stream, tries: number): void {
  if (stream.destroyed || stream.readableEnded) return;
  if (stream.closed || stream.state.localClose === 1) stream.destroy();
  else if (tries < 250) setTimeout(closeOnceAnswered, 20, stream, tries + 1).unref();
}

/**
 * The HTTP/2 sessions of a server, each closed when idle for the session
 * timeout: asked to end (GOAWAY), it waits for its open streams, but a
 * stream whose request never ends sends nothing more, so past a short grace
 * the connection is cut and silent streams cannot hold connections (and
 * the connection cap) for ever. `closeAll` sends every session a GOAWAY,
 * and every session opened after it one too.
 *
 * A session's timers end with it. Node (24.21) means to clear a session's
 * idle timer as it closes, but marks the session destroyed first, and
 * `setTimeout(0)` does nothing on a destroyed session: the timer stays
 * armed and holds the session (its socket and state, about 2.2 kB of heap)
 * until it fires, the session timeout later. Clients that open a session
 * per call and close it (a connect-node transport per call does) left two
 * minutes of sessions on the heap: 2,000 more with every 2,000 opened and
 * closed. So the timer is cleared here, found by Node's own symbol.
 */
function trackHttp2Sessions(server: http2.Http2Server | http2.Http2SecureServer, options: OnePortServerOptions): { closeAll(): void; readonly size: number } {
  const sessions = new Set<http2.ServerHttp2Session>();
  let closing = false;
  server.on("session", (session: http2.ServerHttp2Session) => {
    sessions.add(session);
    let cut: NodeJS.Timeout | undefined;
    // A connection taken before the close whose preface came after it (the first bytes decide its protocol): its
    // session was not there to be asked to end, and held the close for the session timeout (2 min), past any grace.
    // It is asked once its first requests, sent with its preface, are read: those are served, then it ends.
    if (closing) {
      session.once("remoteSettings", () => setImmediate(() => session.close()));
      cut = setTimeout(() => session.close(), idleSessionGraceMs).unref();
    }
    session.once("close", () => {
      sessions.delete(session);
      clearTimeout(idleTimerOf(session));
      clearTimeout(cut);
    });
    session.setTimeout(options.http2SessionTimeoutMs, () => {
      session.close();
      clearTimeout(cut);
      cut = setTimeout(() => session.destroy(), Math.min(idleSessionGraceMs, options.http2SessionTimeoutMs)).unref();
    });
  });
  return {
    closeAll() {
      closing = true;
      for (const session of sessions) session.close();
    },
    get size() {
      return sessions.size;
    },
  };
}

/** Whether an accepted connection may stay: one its address holds too many of already is closed, and counted. */
function admitted(socket: Socket, byAddress: ConnectionsByAddress, counts: ConnectionCounts): boolean {
  if (byAddress.admit(socket)) return true;
  socket.on("error", () => {});
  socket.destroy();
  counts.refused.address++;
  counts.onRefused("address");
  return false;
}

/** Node's symbol for a session's (or socket's) idle timer: `kTimeout` of its internal/timers, whose description is "timeout". */
let idleTimerKey: symbol | undefined;

/** The idle timer `setTimeout` armed on a session, if any. */
function idleTimerOf(session: http2.Http2Session): NodeJS.Timeout | undefined {
  idleTimerKey ??= Object.getOwnPropertySymbols(session).find((key) => key.description === "timeout");
  return idleTimerKey === undefined ? undefined : (session as unknown as Record<symbol, NodeJS.Timeout | undefined>)[idleTimerKey];
}

/**
 * The TLS server: HTTP/2 and HTTP/1.1 on one port, chosen by ALPN, with the
 * same limits as the cleartext server. The TLS handshake and then the first
 * request head (HTTP/1.1) or the client's HTTP/2 settings must each come
 * within the first-request timeout; HTTP/1.1 requests have the request,
 * header and keep-alive timeouts and the header size limit; HTTP/2
 * sessions the header list limit and the idle-session timeout; and the
 * connection cap counts both. `claims` may take HTTP/2 streams and HTTP/1.1 requests before
 * Fastify sees them.
 */
export function createTlsServer(
  handler: Handler,
  options: OnePortServerOptions,
  tls: { readonly cert: string | Buffer; readonly key: string | Buffer },
  claims: RequestClaims = {},
): http2.Http2SecureServer {
  const cut = noCuts();
  const readers = watchSlowReaders(http1Handler(handler, claims.http1Request), options.sendTimeoutMs, leftBodyDiscarded, cut);
  const server = http2.createSecureServer(
    {
      allowHTTP1: true,
      cert: tls.cert,
      key: tls.key,
      handshakeTimeout: options.firstRequestTimeoutMs,
      maxSessionMemory: 10,
      settings: http2Settings(options),
    },
    readers.handler as unknown as (req: http2.Http2ServerRequest, res: http2.Http2ServerResponse) => void,
  );
  // Node's HTTP/1.1 handling of an ALPN `http/1.1` connection reads these from the server.
  Object.assign(server, {
    keepAliveTimeout: options.keepAliveTimeoutMs,
    requestTimeout: options.requestTimeoutMs,
    headersTimeout: Math.min(options.requestTimeoutMs, 60_000),
    maxHeaderSize: options.maxHeaderBytes,
  });
  server.maxConnections = options.maxConnections;
  const streams = serveHttp2Streams(server, options, claims, cut, () => connections);
  server.on("close", () => {
    readers.stop();
    streams.stop();
  });
  const sessions = trackHttp2Sessions(server, options);
  const byAddress = new ConnectionsByAddress(options);
  const connections = countConnections(server, sessions, streams, byAddress);
  // Before the TLS server's own listener starts a handshake on it.
  server.prependListener("connection", (socket: Socket) => void admitted(socket, byAddress, connections));
  server.on("secureConnection", (socket: PendingSocket) => {
    awaitFirstRequest(socket, options.firstRequestTimeoutMs);
  });
  // HTTP/2: the client's settings follow its preface; from there the session's own timeout takes over.
  server.on("session", (session: http2.ServerHttp2Session) => session.once("remoteSettings", () => firstRequestArrived(session.socket as unknown as PendingSocket)));
  server.on("request", (req: http.IncomingMessage | http2.Http2ServerRequest, res: http.ServerResponse | http2.Http2ServerResponse) => {
    if (req.httpVersionMajor !== 1) return;
    firstRequestArrived(req.socket as PendingSocket);
  });
  Object.assign(server, { closeHttp2Sessions: () => sessions.closeAll(), slowReadersCut: cut, connections } satisfies OnePortServerExtras);
  return server;
}

/** The handler, with `claim` first for each HTTP/1.1 request (the TLS server hands its HTTP/2 compatibility requests here too). */
function http1Handler(handler: Handler, claim: Http1RequestClaim | undefined): Handler {
  if (claim === undefined) return handler;
  return (req, res) => {
    if (req.httpVersionMajor === 1 && claim(req, res)) return;
    handler(req, res);
  };
}

/** The settings an HTTP/2 session advertises. */
function http2Settings(options: OnePortServerOptions): http2.Settings {
  return { maxHeaderListSize: options.maxHeaderBytes, maxConcurrentStreams: options.http2MaxStreams };
}

const timedOut = Symbol("timedOut");
const requestHeaders = Symbol("requestHeaders");
/** A stream in the map of open streams: its request's headers (for an answer at the request timeout), and whether it timed out. */
type OpenStream = http2.ServerHttp2Stream & { [requestHeaders]?: http2.IncomingHttpHeaders; [timedOut]?: true };

/**
 * Every new HTTP/2 stream, before Node's compatibility layer (the handler's
 * request and response objects, itself a listener of `stream`, added with
 * the request handler) sees it:
 * - past `maxConnections` streams open across all sessions, it is refused
 *   (REFUSED_STREAM, which a client may retry). Each session's own limit
 *   (`http2MaxStreams`) is nghttp2's to enforce; this one bounds their sum,
 *   which a few thousand connections could otherwise raise to millions of
 *   streams, each holding a few kilobytes until the heap runs out;
 * - its answer finishing before its request ended is watched for
 *   (leftStreamBodyDiscarded);
 * - `claims.http2Stream` may take it; what it leaves goes on to Node's
 *   compatibility layer as before;
 * - a stream whose request has not arrived whole within the request
 *   timeout is answered by `claims.http2RequestTimedOut` if its answer has
 *   not started (then reset once answered), else reset: over HTTP/1.1
 *   Node's own request timeout does this, over HTTP/2 nothing did, and a
 *   client that kept its session busy could hold streams open for ever.
 *   Open streams are looked at every quarter of the timeout, as Node looks
 *   at HTTP/1.1 requests;
 * - answers its client does not take are reset (watchHttp2Answers).
 */
function serveHttp2Streams(
  server: http2.Http2Server | http2.Http2SecureServer,
  options: OnePortServerOptions,
  claims: RequestClaims,
  cut: CutCounts,
  counts: () => ConnectionCounts,
): { stop(): void; readonly size: number } {
  const compat = server.listeners("stream") as ((...args: unknown[]) => void)[];
  server.removeAllListeners("stream");
  const claim = claims.http2Stream;
  // Open streams, by when they opened (ms).
  const open = new Map<http2.ServerHttp2Stream, number>();
  // One function for every stream, not a closure each: this runs on every call.
  const closed = function (this: http2.ServerHttp2Stream) {
    open.delete(this);
  };
  server.on("stream", function (this: unknown, stream: http2.ServerHttp2Stream, headers: http2.IncomingHttpHeaders, ...rest: unknown[]) {
    if (open.size >= options.maxConnections) {
      // A stream closed with an error code emits it: unheard, it would stop the process.
      stream.on("error", ignore);
      stream.close(http2.constants.NGHTTP2_REFUSED_STREAM);
      const refused = counts();
      refused.refused.stream++;
      refused.onRefused("stream");
      return;
    }
    open.set(stream, performance.now());
    (stream as OpenStream)[requestHeaders] = headers;
    stream.on("close", closed);
    // `on`, not `once`: a stream finishes once, and `once` would make a wrapper for every stream.
    stream.on("finish", leftStreamBodyDiscarded);
    if (claim?.(stream, headers)) return;
    for (const listener of compat) listener.call(this, stream, headers, ...rest);
  });
  const sweep = setInterval(() => {
    const before = performance.now() - options.requestTimeoutMs;
    for (const [stream, opened] of open) {
      // Oldest first: the rest are younger.
      if (opened > before) break;
      if (stream.destroyed) continue;
      // Arrived whole (its END_STREAM received, read or not): nothing of the request is awaited.
      if (stream.state.remoteClose === 1 || (stream as OpenStream)[timedOut]) continue;
      requestTimedOut(stream, claims.http2RequestTimedOut);
    }
  }, timeoutCheckEvery(options.requestTimeoutMs));
  sweep.unref();
  const answers = watchHttp2Answers(open, options, cut);
  return {
    stop: () => {
      clearInterval(sweep);
      answers.stop();
    },
    get size() {
      return open.size;
    },
  };
}

/**
 * A stream whose request is past the request timeout: what the handler has
 * read so far is all it gets (it must not see the request end: it would
 * take a part for the whole), and the stream is answered, then reset.
 */
function requestTimedOut(stream: OpenStream, answer: RequestClaims["http2RequestTimedOut"]): void {
  stream[timedOut] = true;
  // Its readers (a fast path's, or Node's compatibility request) lose the stream: they see no more
  // data and no end, only its close when it is reset.
  stream.removeAllListeners("data");
  stream.removeAllListeners("readable");
  stream.removeAllListeners("end");
  stream.pause();
  stream.on("error", ignore);
  if (stream.headersSent || answer === undefined) {
    stream.close(http2.constants.NGHTTP2_CANCEL);
    return;
  }
  answer(stream, stream[requestHeaders] ?? {});
}
