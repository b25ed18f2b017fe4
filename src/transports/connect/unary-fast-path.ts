import { create, toBinary, toJsonString, type DescMessage, type Message } from "@bufbuild/protobuf";
import { compressionBrotli, compressionGzip } from "@connectrpc/connect-node";
import { compressionNegotiate, createMethodSerializationLookup, type Compression } from "@connectrpc/connect/protocol";
import { codeToHttpStatus, codeToString, errorToJsonBytes } from "@connectrpc/connect/protocol-connect";
import { Code, ConnectError, type ContextValues } from "@connectrpc/connect";
import { universalRequestFromNodeRequest, universalResponseToNodeResponse } from "@connectrpc/connect-node";
import type { UniversalHandler } from "@connectrpc/connect/protocol";
import type { FastifyBaseLogger, FastifyReply, FastifyRequest } from "fastify";
import { IncomingMessage, ServerResponse, type IncomingHttpHeaders } from "node:http";
import type { Http2ServerResponse } from "node:http2";
import type { Readable } from "node:stream";
import type { TLSSocket } from "node:tls";
import { accessLog, callLogOf, completeOnClose, type AccessFields, type AccessLogMode } from "../server/access-log.ts";
import { goneOf } from "../server/caller-gone.ts";
import { callerReset } from "../server/hang-up-check.ts";
import { endInParts } from "../server/end-in-parts.ts";
import type { ClientAddress } from "../server/client-address.ts";
import type { Http1RequestClaim } from "../server/one-port-server.ts";
import { callerGoneKey } from "./context.ts";
import type { Gateway } from "../../core/gateway.ts";
import { exactUtf8 } from "../../core/retained-size.ts";
import type { Operation } from "../../core/operation.ts";
import { StatusBlockSchema } from "../../gen/gateway/catalogue/v1/status_pb.js";
import type { Outcome } from "../../core/gateway.ts";
import { headerReader, operationAnswer, type CallSource } from "./catalogue-services.ts";
import { callerError } from "./internal-errors.ts";
import { trailersOnlyOr } from "./grpc-trailers-only.ts";
import { fastMessageField } from "./fast-binary.ts";
import { callHeaderPairs } from "../replay-headers.ts";

const itemBinaryMemo = "rpc-item-binary";
const itemJsonMemo = "rpc-item-json";

/**
 * A success as connect-node's serializers would write it, as two parts whose
 * concatenation is the message, the item's part made once per cache entry:
 * in binary, the status block's field then the item's field(s) (field order
 * is free in protobuf); in JSON, exactly `toJsonString` of the whole message
 * (`{"item":…,"status":…}`, fields in declaration order), the item's part
 * first. Kept apart, a gRPC answer writes them as they are, and copies no
 * 12.8 kB item into a new off-heap block a call.
 */
function successParts(output: DescMessage, statusField: number, outcome: Extract<Outcome, { kind: "success" }>, binary: boolean): [Uint8Array, Uint8Array] {
  const memo = outcome.memo;
  const key = binary ? itemBinaryMemo : itemJsonMemo;
  let item = memo?.get(key) as Buffer | undefined;
  if (item === undefined) {
    const only = create(output, { item: outcome.item } as never);
    // Binary: the item's field(s). JSON: `{"item":X`, the whole message's text up to where the status joins it.
    // Kept in the entry: in blocks of their own size, so what the cache counts is what stays alive
    // (toBinary returns a fresh exact-size array: a Buffer view of it copies nothing).
    const bytes = binary ? toBinary(output, only) : undefined;
    item = bytes ? Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength) : exactUtf8(toJsonString(output, only).slice(0, -1));
    memo?.set(key, item);
  }
  // Binary: the status block's field, then the item's (field order is free in protobuf).
  // JSON: `{"item":X` + `,"status":Y}`, exactly toJsonString of the whole message.
  if (binary) return [fastMessageField(statusField, StatusBlockSchema, outcome.status), item];
  return [item, Buffer.from(`,${toJsonString(output, create(output, { status: outcome.status } as never)).slice(1)}`)];
}

/** The compressions connect-fastify offers (its default), in its order. */
export const acceptCompression: Compression[] = [compressionGzip, compressionBrotli];
/** connect-es's default: smaller answers are never compressed. */
export const compressMinBytes = 1024;

/** What the fast path leaves to connect-node: the request, with the body bytes it already read, if any. */
export type Declined = { readonly body?: AsyncIterable<Uint8Array> };

/** A request's body that closed before its end: its caller reset it or went away, or the server answered it already (past the request timeout). Nobody is left to answer, and it is no fault of the gateway's. */
export class BodyCut extends Error {
  constructor() {
    super("the request stream closed before its end");
  }
}

/**
 * The request body, read up to `max` bytes; past it, what was read and the
 * rest of the stream, for connect-node to refuse. Rejects when the stream
 * closes or fails before its end.
 *
 * Node's HTTP/1.1 request whose body came in the same read as its head (a
 * small call's does) is taken whole at the next tick, once the parser has
 * pushed the body, with one `read()`: no listeners, no flowing mode, no
 * `'end'` to wait for. That costs about 3 µs less a Connect call than the
 * listeners (README, Performance). Any other body (one still on its way,
 * chunked and not yet complete, too large, or over HTTP/2) is read with
 * listeners: a stream's async iterator costs more to make than a small
 * body takes to read.
 */
export function readBody(body: Readable, max: number): Promise<BodyRead> {
  // HTTP/1.1 only: an HTTP/2 request (Node's compatibility request, as Fastify hands one over h2c) says
  // `complete` of a stream that was reset too.
  if (!(body instanceof IncomingMessage)) return new Promise((resolve, reject) => listen(body, max, resolve, reject));
  const req = body;
  return new Promise((resolve, reject) =>
    process.nextTick(() => {
      if (req.destroyed) {
        reject(new BodyCut());
        return;
      }
      // Whole: the parser said so, or every byte the head declared is here (its end is then pushed
      // in the same read, after this tick). Nothing else has read from it.
      const declared = req.headers["content-length"];
      const whole = req.complete || (declared !== undefined && req.readableLength === Number(declared));
      if (whole && !req.readableDidRead && req.readableLength <= max) {
        resolve({ bytes: (req.read() as Buffer | null) ?? new Uint8Array(0) });
        return;
      }
      listen(req, max, resolve, reject);
    }),
  );
}

type BodyRead = { bytes: Uint8Array } | { over: AsyncIterable<Uint8Array> };

/** readBody with listeners: chunk by chunk to the end, or until `max` is passed. */
function listen(body: Readable, max: number, resolve: (read: BodyRead) => void, reject: (e: unknown) => void): void {
  const chunks: Buffer[] = [];
  let size = 0;
  const done = () => {
    body.off("data", onData);
    body.off("end", onEnd);
    body.off("error", onError);
    body.off("close", onClose);
  };
  const onData = (chunk: Buffer) => {
    chunks.push(chunk);
    size += chunk.length;
    if (size <= max) return;
    done();
    body.pause();
    resolve({
      over: (async function* () {
        yield* chunks;
        yield* body as AsyncIterable<Buffer>;
      })(),
    });
  };
  const onEnd = () => {
    done();
    resolve({ bytes: chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks) });
  };
  const onError = (e: unknown) => {
    done();
    reject(e);
  };
  const onClose = () => onError(new BodyCut());
  body.on("data", onData);
  body.on("end", onEnd);
  body.on("error", onError);
  body.on("close", onClose);
}

export const once = (bytes: Uint8Array): AsyncIterable<Uint8Array> => (async function* () {
  yield bytes;
})();

/**
 * What the fast path answers a call with: the message in two parts
 * (successParts) and the headers connect-node's handler would set beside it
 * (RateLimit, in their names' order), or the error connect-node's path would
 * end it with.
 */
export type FastResult = { readonly parts: [Uint8Array, Uint8Array]; readonly header: readonly (readonly [string, string])[] } | { readonly error: ConnectError };

/** One operation as the fast paths serve it: its request parser and its answer. */
export interface FastAnswer {
  /** The request message, or undefined where connect-node's parser would refuse it (connect-node then says why, in its words). */
  parse(payload: Uint8Array, binary: boolean): Message | undefined;
  /** The call's answer; `procedure` names it in the log line of an internal error. */
  call(input: Message, src: CallSource, procedure: string): Promise<FastResult>;
}

export function fastAnswer(gateway: Gateway, operation: Operation, options: { readonly readMaxBytes: number; readonly log?: { error(obj: unknown, msg: string): void } | undefined }): FastAnswer {
  const answer = operationAnswer(gateway, operation);
  const output = operation.method.output;
  const statusField = output.fields.find((f) => f.name === "status")!.number;
  const serialization = createMethodSerializationLookup(operation.method as never, undefined, undefined, { readMaxBytes: options.readMaxBytes, writeMaxBytes: 0xffffffff });
  return {
    parse(payload, binary) {
      try {
        return serialization.getI(binary).parse(payload) as Message;
      } catch {
        return undefined;
      }
    },
    async call(input, src, procedure) {
      try {
        const outcome = await answer(input, src);
        return { parts: successParts(output, statusField, outcome, src.binary), header: callHeaderPairs(outcome) };
      } catch (e) {
        // As the logInternalErrors and recordRpcCode interceptors do on connect-node's path.
        const error = callerError(e, src.requestId, procedure, options.log);
        if (src.logFields !== undefined) src.logFields.rpcCode = codeToString(error.code);
        return { error };
      }
    },
  };
}

/**
 * Whether a request is a Connect unary call the fast path can serve: a POST
 * in `application/proto` or `application/json`, uncompressed, without a
 * timeout, in protocol version 1 or unnamed; and if so, whether binary.
 */
function connectShape(method: string | undefined, h: IncomingHttpHeaders): { readonly binary: boolean } | undefined {
  if (method !== "POST") return undefined;
  const contentType = h["content-type"];
  if (contentType !== "application/proto" && contentType !== "application/json") return undefined;
  if (h["content-encoding"] !== undefined || h["connect-timeout-ms"] !== undefined) return undefined;
  if (h["connect-protocol-version"] !== undefined && h["connect-protocol-version"] !== "1") return undefined;
  return { binary: contentType === "application/proto" };
}

export const headerValue = (v: string | string[] | undefined): string | null => (v === undefined ? null : Array.isArray(v) ? v.join(",") : v);

/** A Connect unary answer as it leaves, whichever path serves the call. */
interface ConnectAnswer {
  readonly status: number;
  /** After the app's own (CORS), in connect-node's order: its headers are a fetch `Headers`, which iterates by name. */
  readonly headers: readonly (readonly [string, string])[];
  /**
   * The body in the parts it was made in (a success uncompressed: the
   * item's kept bytes and the call's status), written one after the other:
   * joining them would copy the 12.8 kB item into a new off-heap block
   * every call, which V8's collector then runs for.
   */
  readonly body: readonly Uint8Array[];
}

/** A body given in parts, as one block (for a writer that takes only one). */
export const oneBlock = (parts: readonly Uint8Array[]): Uint8Array => (parts.length === 1 ? parts[0]! : Buffer.concat(parts));

/** The message, or the error as JSON with its HTTP status, compressed as `Accept-Encoding` negotiates. */
async function connectAnswer(result: FastResult, binary: boolean, acceptEncoding: string | string[] | undefined): Promise<ConnectAnswer> {
  let parts: readonly Uint8Array[];
  let status = 200;
  let contentType = binary ? "application/proto" : "application/json";
  if ("parts" in result) parts = result.parts;
  else {
    parts = [errorToJsonBytes(result.error, undefined)];
    status = codeToHttpStatus(result.error.code);
    contentType = "application/json";
  }
  let size = parts.reduce((n, p) => n + p.byteLength, 0);
  const compression = compressionNegotiate(acceptCompression, null, headerValue(acceptEncoding), "accept-encoding").response;
  const headers: (readonly [string, string])[] = [];
  if (compression !== null && size >= compressMinBytes) {
    const compressed = await compression.compress(oneBlock(parts));
    parts = [compressed];
    size = compressed.byteLength;
    headers.push(["content-encoding", compression.name]);
  }
  headers.push(["content-length", String(size)], ["content-type", contentType]);
  // A success's headers (RateLimit), or an error's metadata (a refusal's Retry-After, RateLimit), join the
  // headers as connect-node merges them, in a fetch Headers' order: by name. The answer's own sort after
  // content-type.
  if ("parts" in result) headers.push(...result.header);
  else if ([...result.error.metadata.keys()].length > 0) {
    result.error.metadata.forEach((value, name) => headers.push([name, value]));
    headers.sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0));
  }
  return { status, headers, body: parts };
}

/** What a Connect unary call of an operation needs of its request, whichever path carries it. */
interface ConnectRequest {
  readonly raw: IncomingMessage;
  /** Where the answer goes (Node's HTTP/1.1 response, or HTTP/2's compatibility response inside Fastify). */
  readonly res: ServerResponse | Http2ServerResponse;
  readonly clientIp: string;
  readonly requestId: string;
  /** The URL connect-node names the call by (its log line of an internal error). */
  readonly procedure: string;
  /** What the core tells the access line of the call (CallInput.logFields). */
  readonly logFields: AccessFields | undefined;
}

/**
 * One Connect unary call on the fast path: its answer, or, when the fast
 * path declines it, what connect-node then needs (the body, with the bytes
 * already read).
 */
async function fastConnectCall(fast: FastAnswer, readMaxBytes: number, binary: boolean, req: ConnectRequest): Promise<ConnectAnswer | Declined> {
  const body = await readBody(req.raw, readMaxBytes);
  if ("over" in body) return { body: body.over };
  const input = fast.parse(body.bytes, binary);
  if (input === undefined) return { body: once(body.bytes) };
  const h = req.raw.headers;
  const src: CallSource = { header: headerReader(h), clientIp: req.clientIp, requestId: req.requestId, signal: undefined, gone: goneOf(req.res), transport: "connect", binary, logFields: req.logFields };
  return connectAnswer(await fast.call(input, src, req.procedure), binary, h["accept-encoding"]);
}

/**
 * The hottest shape of call over HTTP/1.1, served without connect-node's
 * per-call machinery (handler context, abort signals, async-iterable
 * pipelines, interceptors): a Connect unary POST, binary or JSON, as
 * `connectShape` says. gRPC over HTTP/2 has its own fast path before
 * Fastify (grpc-stream-path.ts), and so has this shape when the request
 * has no `Origin` (connectRequestPath, below); this is the one inside the
 * Fastify route, for the rest (browsers, whose CORS headers Fastify's
 * plugin decides). Every other request (gRPC-Web, GET, compressed
 * requests, timeouts, other content types, a body that does not parse or
 * is too large) is declined and goes to connect-node unchanged, with the
 * bytes already read.
 *
 * What leaves is what connect-node would send, built with its own parts:
 * the method's serialization lookup (same parsers and serializers), its
 * compression negotiation and compressors, its error JSON and HTTP status
 * mapping, and the same headers written in the same order.
 * test/rpc-fast-path.test.ts holds the two side by side over a matrix of
 * requests.
 */
export function unaryFastPath(
  gateway: Gateway,
  operation: Operation,
  options: { readonly readMaxBytes: number; readonly log?: { error(obj: unknown, msg: string): void } },
): (req: FastifyRequest, reply: FastifyReply) => Promise<Declined | undefined> {
  const fast = fastAnswer(gateway, operation, options);
  const path = `/${operation.service.typeName}/${operation.method.name}`;
  return async (req, reply) => {
    const shape = connectShape(req.method, req.headers);
    if (shape === undefined) return {};
    let answer: ConnectAnswer | Declined;
    try {
      answer = await fastConnectCall(fast, options.readMaxBytes, shape.binary, { raw: req.raw, res: reply.raw, clientIp: req.clientIp, requestId: req.id, procedure: `${req.protocol}://${req.host}${path}`, logFields: callLogOf(req) });
    } catch (e) {
      // The body never ended: the caller went away, or the server answered the request already (over
      // HTTP/2, one past the request timeout, which one-port-server.ts answers and resets). Nobody is
      // left to answer; a fault of ours it is not. (HTTP/2's compatibility request is not `destroyed`
      // when its stream is reset: a client's reset mid-body was logged as an error.)
      if (e instanceof BodyCut || req.raw.destroyed || reply.raw.headersSent) return undefined;
      throw e;
    }
    if (!("status" in answer)) return answer;
    reply.code(answer.status);
    for (const [name, value] of answer.headers) reply.header(name, value);
    const body = oneBlock(answer.body);
    reply.send(Buffer.from(body.buffer, body.byteOffset, body.byteLength));
    return undefined;
  };
}

/**
 * connect-node's answer to a call, written to Node's response as
 * connect-fastify writes it, with `headers` (the app's: CORS) first. An
 * abort ends quietly; any other failure is logged and the connection cut
 * if nothing was sent yet.
 */
export async function answerWithConnectNode(
  handler: UniversalHandler,
  req: IncomingMessage,
  res: ServerResponse,
  options: { readonly headers: Readonly<Record<string, unknown>>; readonly contextValues: ContextValues; readonly body?: AsyncIterable<Uint8Array> | undefined; readonly log: FastifyBaseLogger; readonly requestId: string },
): Promise<void> {
  try {
    if (res instanceof ServerResponse) options.contextValues.set(callerGoneKey, () => callerReset(res));
    const request = universalRequestFromNodeRequest(req, res, undefined, options.contextValues);
    const response = await handler(options.body === undefined ? request : { ...request, body: options.body });
    // Answered already: the server cut a request past its timeout (one-port-server.ts), and the
    // handler ends only now, its body gone. Nothing more may be written.
    if (res.headersSent) return;
    for (const [key, value] of Object.entries(options.headers)) if (value !== undefined) res.setHeader(key, value as string);
    const answer = await trailersOnlyOr(response);
    if ("head" in answer) {
      // gRPC's Trailers-Only (grpc-trailers-only.ts): headers set, not written, and an end with nothing make one HEADERS frame that ends the stream.
      if (res.headersSent) return;
      res.statusCode = response.status;
      answer.head.forEach((value, key) => res.setHeader(key, value));
      res.end();
      return;
    }
    await universalResponseToNodeResponse(answer.response, res);
  } catch (e) {
    if (ConnectError.from(e).code === Code.Aborted) return;
    options.log.error({ err: e, requestId: options.requestId }, `handler for rpc ${handler.method.name} of ${handler.service.typeName} failed`);
    if (!res.headersSent) res.destroy();
  }
}

/** What the fast paths before Fastify (Connect over HTTP/1.1 here, gRPC in grpc-stream-path.ts) take from the app. */
export interface FastPathOptions {
  readonly gateway: Gateway;
  /** Each catalogue operation with connect-node's handler of its method, which answers what the fast path declines. */
  readonly routes: readonly { readonly operation: Operation; readonly handler: UniversalHandler }[];
  /** Largest request message, in bytes. */
  readonly readMaxBytes: number;
  /** The app's logger: access lines as Fastify writes them, internal errors as the interceptor does. */
  readonly log: FastifyBaseLogger;
  /** The caller's address from the peer's and the request's headers, as Fastify's requests have it. */
  readonly clientAddress: ClientAddress;
  /** Headers every answer to a request without `Origin` carries on Fastify's path (CORS). */
  readonly answerHeaders: Readonly<Record<string, string>>;
  /** Which access lines are written, as on Fastify's path (access-log.ts; default both). */
  readonly accessLogMode?: AccessLogMode | undefined;
  /** The handler context values connect-node's path gives a call (`logFields`: what the core tells its access line, CallInput.logFields). */
  readonly contextValues: (clientIp: string, requestId: string, logFields: AccessFields | undefined) => ContextValues;
  /**
   * The other services' handlers (AccountService, AdminService, health,
   * reflection): their unary methods are served over gRPC on the stream
   * path by these handlers themselves, so that an error is Trailers-Only.
   */
  readonly services?: readonly UniversalHandler[] | undefined;
}

/** An operation's method as a fast path serves it: its fast answer, and connect-node's handler for what it declines. */
export interface FastRoute {
  readonly fast: FastAnswer;
  readonly handler: UniversalHandler;
}

/** The fast paths' routes, by the method's path. */
export function fastRoutes(options: FastPathOptions): Map<string, FastRoute> {
  const routes = new Map<string, FastRoute>();
  for (const { operation, handler } of options.routes) {
    routes.set(`/${operation.service.typeName}/${operation.method.name}`, { fast: fastAnswer(options.gateway, operation, { readMaxBytes: options.readMaxBytes, log: options.log }), handler });
  }
  return routes;
}

/**
 * The Connect unary fast path on Node's HTTP/1.1 request, before Fastify:
 * the shape `connectShape` names, on an operation's path (no query), from a
 * caller that sends no `Origin` (services, not browsers: the CORS headers
 * are then fixed, `answerHeaders`). For such a call Fastify's routing,
 * hooks, content-type parsing and reply add nothing but cost (about a
 * third of a cached call's CPU, measured). A body that does not parse, or
 * is too large, goes with its bytes to connect-node's handler, as the
 * Fastify route hands it. Everything else is left to Fastify.
 *
 * What the caller sees is what the Fastify route sends: the same answer
 * (`fastConnectCall`), the app's headers then the answer's in the same
 * order, the same request id and the same two access lines.
 * test/rpc-fast-path.test.ts compares the two over a matrix of requests.
 */
export function connectRequestPath(options: FastPathOptions): Http1RequestClaim {
  const routes = fastRoutes(options);
  const log = accessLog(options.log, options.accessLogMode);
  const serve = async (route: FastRoute, binary: boolean, req: IncomingMessage, res: ServerResponse): Promise<void> => {
    const url = req.url!;
    const requestId = options.gateway.newRequestId();
    const clientIp = options.clientAddress(req.socket.remoteAddress ?? "", req.headers);
    const logged = log(requestId, "POST", url, clientIp, req.headers.traceparent);
    if (logged !== undefined) completeOnClose(res, () => logged.fields, (sent) => logged.completed(res.statusCode, sent));
    const procedure = `${(req.socket as TLSSocket).encrypted ? "https" : "http"}://${req.headers.host ?? ""}${url}`;
    const answer = await fastConnectCall(route.fast, options.readMaxBytes, binary, { raw: req, res, clientIp, requestId, procedure, logFields: logged?.fields });
    if (!("status" in answer)) {
      await answerWithConnectNode(route.handler, req, res, { headers: options.answerHeaders, contextValues: options.contextValues(clientIp, requestId, logged?.fields), body: answer.body, log: options.log, requestId });
      return;
    }
    const headers: Record<string, string> = { ...options.answerHeaders };
    for (const [name, value] of answer.headers) headers[name] = value;
    res.writeHead(answer.status, headers);
    endInParts(res, answer.body);
  };
  return (req, res) => {
    const route = routes.get(req.url ?? "");
    if (route === undefined || req.headers.origin !== undefined) return false;
    const shape = connectShape(req.method, req.headers);
    if (shape === undefined) return false;
    serve(route, shape.binary, req, res).catch((e: unknown) => {
      // A caller that went away while its body was read has nothing to be answered.
      if (req.socket.destroyed) return;
      options.log.error({ err: e }, "a Connect call on the fast path failed");
      if (!res.headersSent) res.destroy();
    });
    return true;
  };
}

export type { DescMessage };
