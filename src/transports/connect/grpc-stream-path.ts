import type { ConnectError } from "@connectrpc/connect";
import { compressionNegotiate, type UniversalHandler, type UniversalServerResponse } from "@connectrpc/connect/protocol";
import { setTrailerStatus } from "@connectrpc/connect/protocol-grpc";
import type { IncomingHttpHeaders, OutgoingHttpHeaders, ServerHttp2Stream } from "node:http2";
import type { Http2StreamClaim } from "../server/one-port-server.ts";
import { accessLog, completeOnClose, type AccessLog } from "../server/access-log.ts";
import { goneOf } from "../server/caller-gone.ts";
import { headerReader, type CallSource } from "./catalogue-services.ts";
import type { AccessFields } from "../server/access-log.ts";
import { isGrpcAnswer, trailersOnlyOr } from "./grpc-trailers-only.ts";
import { acceptCompression, compressMinBytes, fastRoutes, headerValue, once, oneBlock, readBody, type FastPathOptions, type FastResult, type FastRoute } from "./unary-fast-path.ts";

/**
 * The gRPC fast path: a unary call of a catalogue operation over HTTP/2,
 * served on the stream itself, before Node's compatibility objects,
 * Fastify's request and reply and connect-node's handler exist. Those cost
 * a good part of a cached call: the same fixed answer took 42-45 µs of CPU
 * a call on the stream and 65-93 µs through Fastify on the compatibility
 * layer, when measured.
 *
 * A stream is claimed on its headers alone: a POST to an operation's path
 * (no query), `application/grpc` or `application/grpc+proto`, no
 * `grpc-timeout`, `grpc-encoding` absent or identity, and no `Origin` (the
 * CORS headers of an answer depend on it; browsers cannot speak gRPC over
 * HTTP/2 anyway). A claimed call whose body is not exactly one
 * uncompressed message that parses, or is too large, is handed with its
 * bytes to connect-node's handler for its method, as the Fastify route
 * would, and its answer written to the stream as connect-node writes it.
 *
 * What the caller sees is what the Fastify route sends: the same headers
 * (the app's CORS headers, content type, `grpc-encoding`), frame and
 * trailers, and the same two access log lines with the same request id.
 * test/rpc-fast-path.test.ts compares the two over a matrix of requests.
 */
export function grpcStreamPath(settings: FastPathOptions): Http2StreamClaim {
  const options = { ...settings, accessLog: accessLog(settings.log, settings.accessLogMode) };
  const routes = fastRoutes(options);
  // Unary and server-streaming methods: one request message, read whole here as connect-node would read it.
  const others = new Map((settings.services ?? []).filter((h) => h.method.methodKind === "unary" || h.method.methodKind === "server_streaming").map((h) => [h.requestPath, h] as const));
  return (stream, headers) => {
    const path = headers[":path"];
    const route = path === undefined ? undefined : routes.get(path);
    if (route === undefined) {
      // Another service's unary or server-streaming method over gRPC: connect-node's own handler, its answer written as writeUniversal writes it.
      const other = path === undefined ? undefined : others.get(path);
      if (other === undefined || headers[":method"] !== "POST" || headers.origin !== undefined || !isGrpcAnswer(headers["content-type"])) return false;
      serveOther(options, other, stream, headers, path!).catch((e: unknown) => {
        options.log.error({ err: e }, "a gRPC call on the stream path failed");
        stream.destroy();
      });
      return true;
    }
    if (headers[":method"] !== "POST" || headers.origin !== undefined) return false;
    const contentType = headers["content-type"];
    if (contentType !== "application/grpc" && contentType !== "application/grpc+proto") return false;
    if (headers["grpc-timeout"] !== undefined || (headers["grpc-encoding"] !== undefined && headers["grpc-encoding"] !== "identity")) return false;
    serve(options, route, stream, headers, path!).catch((e: unknown) => {
      options.log.error({ err: e }, "a gRPC call on the fast path failed");
      stream.destroy();
    });
    return true;
  };
}

/** A stream taken: its request id, its caller's address, the URL connect-node names the call by, and its access log lines, as Fastify would give them. */
interface Opened {
  readonly requestId: string;
  readonly clientIp: string;
  readonly procedure: string;
  /** What the core tells the access line of the call (CallInput.logFields). */
  readonly logFields: AccessFields | undefined;
}

function opened(options: FastPathOptions & { readonly accessLog: AccessLog }, stream: ServerHttp2Stream, headers: IncomingHttpHeaders, path: string): Opened {
  // A reset or a broken connection ends the stream; the answer then has nowhere to go, and no listener would crash the process.
  stream.on("error", () => {});
  const requestId = options.gateway.newRequestId();
  const clientIp = options.clientAddress(stream.session?.socket?.remoteAddress ?? "", headers);
  const logged = options.accessLog(requestId, "POST", path, clientIp, headers.traceparent);
  if (logged !== undefined) completeOnClose(stream, () => logged.fields, (sent) => logged.completed(Number(stream.sentHeaders?.[":status"] ?? 200), sent));
  return { requestId, clientIp, procedure: `${headers[":scheme"] ?? "http"}://${headers[":authority"] ?? headers.host ?? ""}${path}`, logFields: logged?.fields };
}

/** The call handed to connect-node's handler with its body, and its answer written to the stream (Trailers-Only for an error). */
async function handOver(
  options: FastPathOptions,
  handler: UniversalHandler,
  stream: ServerHttp2Stream,
  headers: IncomingHttpHeaders,
  caller: Opened,
  body: AsyncIterable<Uint8Array>,
): Promise<void> {
  const abort = new AbortController();
  stream.once("close", () => abort.abort());
  const header = new Headers();
  for (const [k, v] of Object.entries(headers)) {
    if (k.startsWith(":") || v === undefined) continue;
    for (const one of Array.isArray(v) ? v : [String(v)]) header.append(k, one);
  }
  const response = await handler({ httpVersion: "2.0", method: "POST", url: caller.procedure, header, body, signal: abort.signal, contextValues: options.contextValues(caller.clientIp, caller.requestId, caller.logFields) });
  await writeUniversal(stream, response, options.answerHeaders);
}

/**
 * A unary or server-streaming call of another service (the AccountService,
 * the AdminService and its WatchCalls, health and its Watch) over gRPC: its
 * body read, then connect-node's handler for it, which checks everything
 * (its interceptors, a deadline, a compression) as on Fastify's route; only
 * the answer is written here, so that an error before any message goes out
 * Trailers-Only, as a catalogue call's does, and a client's retry policy
 * may retry it. A stream's messages follow as its handler yields them, and
 * its end when its caller cancels (the stream's close aborts the handler).
 */
async function serveOther(options: FastPathOptions & { readonly accessLog: AccessLog }, handler: UniversalHandler, stream: ServerHttp2Stream, headers: IncomingHttpHeaders, path: string): Promise<void> {
  const caller = opened(options, stream, headers, path);
  let body: Awaited<ReturnType<typeof readBody>>;
  try {
    body = await readBody(stream, options.readMaxBytes + 5);
  } catch {
    return; // the caller reset the stream
  }
  await handOver(options, handler, stream, headers, caller, "over" in body ? body.over : once(body.bytes));
}

async function serve(options: FastPathOptions & { readonly accessLog: AccessLog }, route: FastRoute, stream: ServerHttp2Stream, headers: IncomingHttpHeaders, path: string): Promise<void> {
  const caller = opened(options, stream, headers, path);
  const { requestId, clientIp, procedure } = caller;
  const decline = (body: AsyncIterable<Uint8Array>) => handOver(options, route.handler, stream, headers, caller, body);

  // One length-prefixed message: 5 bytes of prefix, then at most readMaxBytes.
  let body: Awaited<ReturnType<typeof readBody>>;
  try {
    body = await readBody(stream, options.readMaxBytes + 5);
  } catch {
    return; // the caller reset the stream
  }
  if ("over" in body) return decline(body.over);
  const bytes = body.bytes;
  // Anything but exactly one uncompressed message that parses is connect-node's to answer, in its words.
  if (bytes.length < 5 || bytes[0] !== 0 || Buffer.from(bytes.buffer, bytes.byteOffset, 5).readUInt32BE(1) !== bytes.length - 5) return decline(once(bytes));
  const input = route.fast.parse(bytes.subarray(5), true);
  if (input === undefined) return decline(once(bytes));
  const src: CallSource = {
    header: headerReader(headers),
    clientIp,
    requestId,
    signal: undefined,
    gone: goneOf(stream),
    transport: "grpc",
    binary: true,
    logFields: caller.logFields,
  };
  await respondGrpc(stream, headers, await route.fast.call(input, src, procedure), options.answerHeaders);
}

/** The trailers connect-node ends a call with: its status, and for an error its message and details. */
function trailerOf(error: ConnectError | undefined): Record<string, string> {
  const trailer: Record<string, string> = {};
  setTrailerStatus(new Headers(), error).forEach((value, key) => (trailer[key] = value));
  return trailer;
}

/** A success's trailers, the same every call. */
const successTrailer: Readonly<Record<string, string>> = Object.freeze(trailerOf(undefined));

/**
 * A gRPC answer as connect-node writes it: the headers (the app's, content
 * type, `grpc-encoding` when the caller accepts one we offer), the message
 * as one length-prefixed frame (compressed from compressMinBytes on), then
 * the trailers with the status.
 */
async function respondGrpc(stream: ServerHttp2Stream, headers: IncomingHttpHeaders, result: FastResult, answerHeaders: Readonly<Record<string, string>>): Promise<void> {
  const compression = compressionNegotiate(acceptCompression, null, headerValue(headers["grpc-accept-encoding"]), "grpc-accept-encoding").response;
  const head: OutgoingHttpHeaders = { ":status": 200, ...answerHeaders, "content-type": "application/grpc+proto" };
  if (compression !== null) head["grpc-encoding"] = compression.name;
  // A success's headers as connect-node's handler sets them (RateLimit); an error's metadata joins its trailers.
  if ("parts" in result) for (const [name, value] of result.header) head[name] = value;
  // The frame: its 5-byte prefix with the first part, then the second part as it is kept (no copy of the item).
  let frame: [Buffer, Uint8Array] | undefined;
  if ("parts" in result) {
    let [first, second] = result.parts;
    let size = first.byteLength + second.byteLength;
    let flags = 0;
    if (compression !== null && size >= compressMinBytes) {
      first = await compression.compress(oneBlock(result.parts));
      second = new Uint8Array(0);
      size = first.byteLength;
      flags = 1;
    }
    const prefixed = Buffer.allocUnsafe(5 + first.byteLength);
    prefixed[0] = flags;
    prefixed.writeUInt32BE(size, 1);
    prefixed.set(first, 5);
    frame = [prefixed, second];
  }
  const trailer = "error" in result ? trailerOf(result.error) : { ...successTrailer };
  // Gone, or answered already (a request past its timeout is answered by the server: one-port-server.ts).
  if (stream.destroyed || stream.closed || stream.headersSent) return;
  // An error, with no message: Trailers-Only, as writeUniversal turns connect-node's around (grpc-trailers-only.ts).
  if (frame === undefined) {
    stream.respond({ ...head, ...trailer }, { endStream: true });
    return;
  }
  stream.respond(head, { waitForTrailers: true });
  stream.once("wantTrailers", () => stream.sendTrailers(trailer));
  if (frame[1].byteLength === 0) stream.end(frame[0]);
  else {
    stream.write(frame[0]);
    stream.end(frame[1]);
  }
}

/**
 * connect-node's answer written to the stream as its own writer would write
 * it to a response: headers after the first chunk, the chunks, the
 * trailers; or, for an answer with no message, Trailers-Only (as
 * answerWithConnectNode writes it through Fastify: grpc-trailers-only.ts).
 */
async function writeUniversal(stream: ServerHttp2Stream, universal: UniversalServerResponse, answerHeaders: Readonly<Record<string, string>>): Promise<void> {
  const answer = await trailersOnlyOr(universal);
  if ("head" in answer) {
    if (stream.destroyed || stream.closed || stream.headersSent) return;
    const head: OutgoingHttpHeaders = { ":status": universal.status, ...answerHeaders };
    answer.head.forEach((value, key) => (head[key] = value));
    stream.respond(head, { endStream: true });
    return;
  }
  const response = answer.response;
  const body = response.body === undefined ? undefined : response.body instanceof Uint8Array ? once(response.body) : response.body;
  const it = body?.[Symbol.asyncIterator]();
  try {
    let chunk = await it?.next();
    if (stream.destroyed || stream.closed || stream.headersSent) return;
    const head: OutgoingHttpHeaders = { ":status": response.status, ...answerHeaders };
    response.header?.forEach((value, key) => (head[key] = value));
    const trailer: Record<string, string> = {};
    response.trailer?.forEach((value, key) => (trailer[key] = value));
    stream.respond(head, { waitForTrailers: true });
    stream.once("wantTrailers", () => stream.sendTrailers(trailer));
    for (; chunk !== undefined && chunk.done !== true; chunk = await it!.next()) {
      if (!stream.write(chunk.value)) await new Promise((resolve) => stream.once("drain", resolve).once("close", resolve));
      if (stream.destroyed) return;
    }
    stream.end();
  } finally {
    await it?.return?.();
  }
}
