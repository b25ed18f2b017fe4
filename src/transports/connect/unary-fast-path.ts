import { create, toBinary, toJsonString, type DescMessage, type Message } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { compressionBrotli, compressionGzip } from "@connectrpc/connect-node";
import { compressionNegotiate, createMethodSerializationLookup, type Compression } from "@connectrpc/connect/protocol";
import { codeToHttpStatus, errorToJsonBytes } from "@connectrpc/connect/protocol-connect";
import { setTrailerStatus } from "@connectrpc/connect/protocol-grpc";
import type { FastifyReply, FastifyRequest } from "fastify";
import type { IncomingMessage } from "node:http";
import type { Gateway } from "../../core/gateway.ts";
import { exactUtf8 } from "../../core/retained-size.ts";
import type { Operation } from "../../core/operation.ts";
import { StatusBlockSchema } from "../../gen/gateway/catalogue/v1/status_pb.js";
import type { Outcome } from "../../core/gateway.ts";
import { operationAnswer, type CallSource } from "./catalogue-services.ts";

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
function successParts(output: DescMessage, outcome: Extract<Outcome, { kind: "success" }>, binary: boolean): [Uint8Array, Uint8Array] {
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
  const status = create(output, { status: outcome.status } as never);
  // Binary: the status block's field, then the item's (field order is free in protobuf).
  // JSON: `{"item":X` + `,"status":Y}`, exactly toJsonString of the whole message.
  return binary ? [toBinary(output, status), item] : [item, Buffer.from(`,${toJsonString(output, status).slice(1)}`)];
}

const joined = ([a, b]: [Uint8Array, Uint8Array]): Uint8Array => Buffer.concat([a, b]);

/** The compressions connect-fastify offers (its default), in its order. */
export const acceptCompression: Compression[] = [compressionGzip, compressionBrotli];
/** connect-es's default: smaller answers are never compressed. */
const compressMinBytes = 1024;

/** What the fast path leaves to connect-node: the request, with the body bytes it already read, if any. */
export type Declined = { readonly body?: AsyncIterable<Uint8Array> };

/** The request body, read up to `max` bytes; past it, what was read and the rest of the stream, for connect-node to refuse. */
async function readBody(req: IncomingMessage, max: number): Promise<{ bytes: Uint8Array } | { over: AsyncIterable<Uint8Array> }> {
  const chunks: Buffer[] = [];
  let size = 0;
  const it = req[Symbol.asyncIterator]();
  for (;;) {
    const { value, done } = await it.next();
    if (done) break;
    chunks.push(value as Buffer);
    size += (value as Buffer).length;
    if (size > max) {
      return {
        over: (async function* () {
          yield* chunks;
          for (;;) {
            const next = await it.next();
            if (next.done) return;
            yield next.value as Buffer;
          }
        })(),
      };
    }
  }
  return { bytes: chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks) };
}

const once = (bytes: Uint8Array): AsyncIterable<Uint8Array> => (async function* () {
  yield bytes;
})();

/** How a request the fast path serves is framed. */
type Shape = { readonly protocol: "connect"; readonly binary: boolean } | { readonly protocol: "grpc"; readonly binary: true };

/**
 * The shape of a request the fast path can serve, or undefined: a Connect
 * unary POST in `application/proto` or `application/json`, uncompressed,
 * without a timeout, in protocol version 1 or unnamed; or a gRPC call over
 * HTTP/2 in `application/grpc` or `application/grpc+proto`, uncompressed
 * (`grpc-encoding` absent or identity), without `grpc-timeout`.
 */
function shapeOf(req: FastifyRequest): Shape | undefined {
  if (req.method !== "POST") return undefined;
  const h = req.headers;
  const contentType = h["content-type"];
  if (contentType === "application/proto" || contentType === "application/json") {
    if (h["content-encoding"] !== undefined || h["connect-timeout-ms"] !== undefined) return undefined;
    if (h["connect-protocol-version"] !== undefined && h["connect-protocol-version"] !== "1") return undefined;
    return { protocol: "connect", binary: contentType === "application/proto" };
  }
  if ((contentType === "application/grpc" || contentType === "application/grpc+proto") && req.raw.httpVersionMajor === 2) {
    if (h["grpc-timeout"] !== undefined || (h["grpc-encoding"] !== undefined && h["grpc-encoding"] !== "identity")) return undefined;
    return { protocol: "grpc", binary: true };
  }
  return undefined;
}

const headerValue = (v: string | string[] | undefined): string | null => (v === undefined ? null : Array.isArray(v) ? v.join(",") : v);

/**
 * The hottest shapes of call, served without connect-node's per-call
 * machinery (handler context, abort signals, async-iterable pipelines,
 * interceptors): a Connect unary POST (binary or JSON) and a gRPC unary call
 * over HTTP/2, as `shapeOf` says. Every other request (gRPC-Web, gRPC over
 * HTTP/1.1, GET, compressed requests, timeouts, other content types, a body
 * that does not parse, is not one uncompressed gRPC message, or is too
 * large) is declined and goes to connect-node unchanged, with the bytes
 * already read.
 *
 * What leaves is what connect-node would send, built with its own parts:
 * the method's serialization lookup (same parsers and serializers), its
 * compression negotiation and compressors, its error JSON, HTTP status
 * mapping and gRPC trailer status, and the same headers written in the same
 * order. test/rpc-fast-path.test.ts holds the two side by side over a matrix
 * of requests.
 */
export function unaryFastPath(
  gateway: Gateway,
  operation: Operation,
  options: { readonly readMaxBytes: number; readonly log?: { error(obj: unknown, msg: string): void } },
): (req: FastifyRequest, reply: FastifyReply) => Promise<Declined | undefined> {
  const answer = operationAnswer(gateway, operation);
  const output = operation.method.output;
  const serialization = createMethodSerializationLookup(operation.method as never, undefined, undefined, { readMaxBytes: options.readMaxBytes, writeMaxBytes: 0xffffffff });
  const path = `/${operation.service.typeName}/${operation.method.name}`;

  /** The answer's message bytes, or the error connect-node's path would end the call with. */
  const call = async (req: FastifyRequest, input: Message, shape: Shape): Promise<{ parts: [Uint8Array, Uint8Array] } | { error: ConnectError }> => {
    const h = req.headers;
    const src: CallSource = {
      header: (name) => {
        const v = h[name];
        return Array.isArray(v) ? v.join(", ") : v;
      },
      clientIp: req.clientIp,
      requestId: req.id,
      signal: undefined,
      transport: shape.protocol,
      binary: shape.binary,
    };
    try {
      return { parts: successParts(output, await answer(input, src), shape.binary) };
    } catch (e) {
      if (e instanceof ConnectError && (e.code !== Code.Internal || e.findDetails(StatusBlockSchema).length > 0)) return { error: e };
      // As the logInternalErrors interceptor does on connect-node's path.
      options.log?.error({ err: e, requestId: req.id, procedure: `${req.protocol}://${req.host}${path}` }, "an RPC failed inside the gateway");
      return { error: new ConnectError(`internal error; quote request id ${req.id}`, Code.Internal) };
    }
  };

  return async (req, reply) => {
    const shape = shapeOf(req);
    if (shape === undefined) return {};
    // A gRPC body is one length-prefixed message: 5 bytes of prefix, then at most readMaxBytes.
    const body = await readBody(req.raw, shape.protocol === "grpc" ? options.readMaxBytes + 5 : options.readMaxBytes);
    if ("over" in body) return { body: body.over };
    let payload = body.bytes;
    if (shape.protocol === "grpc") {
      // Anything but exactly one uncompressed message is connect-node's to answer.
      if (payload.length < 5 || payload[0] !== 0 || Buffer.from(payload.buffer, payload.byteOffset, 5).readUInt32BE(1) !== payload.length - 5) return { body: once(body.bytes) };
      payload = payload.subarray(5);
    }
    let input: Message;
    try {
      input = serialization.getI(shape.binary).parse(payload) as Message;
    } catch {
      return { body: once(body.bytes) }; // connect-node says what is wrong with it, in its words
    }
    const result = await call(req, input, shape);
    if (shape.protocol === "grpc") await sendGrpc(req, reply, result);
    else await sendConnect(req, reply, result, shape.binary);
    return undefined;
  };
}

/** A Connect unary answer: the message, or the error as JSON with its HTTP status, compressed as negotiated. */
async function sendConnect(req: FastifyRequest, reply: FastifyReply, result: { parts: [Uint8Array, Uint8Array] } | { error: ConnectError }, binary: boolean): Promise<void> {
  let bytes: Uint8Array;
  if ("parts" in result) {
    bytes = joined(result.parts);
    reply.code(200).header("content-type", binary ? "application/proto" : "application/json");
  } else {
    bytes = errorToJsonBytes(result.error, undefined);
    reply.code(codeToHttpStatus(result.error.code)).header("content-type", "application/json");
  }
  const compression = compressionNegotiate(acceptCompression, null, headerValue(req.headers["accept-encoding"]), "accept-encoding").response;
  if (compression !== null && bytes.byteLength >= compressMinBytes) {
    bytes = await compression.compress(bytes);
    reply.header("content-encoding", compression.name);
  }
  reply.send(Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength));
}

/**
 * A gRPC answer as connect-node writes it on the same response object: the
 * headers (content type, `grpc-encoding` when the caller accepts one we
 * offer), the message as one length-prefixed frame (compressed from
 * compressMinBytes on), then the trailers with the status.
 */
async function sendGrpc(req: FastifyRequest, reply: FastifyReply, result: { parts: [Uint8Array, Uint8Array] } | { error: ConnectError }): Promise<void> {
  const res = reply.raw;
  const compression = compressionNegotiate(acceptCompression, null, headerValue(req.headers["grpc-accept-encoding"]), "grpc-accept-encoding").response;
  // Headers Fastify holds (CORS) go out too, as on connect-node's path.
  for (const [key, value] of Object.entries(reply.getHeaders())) if (value !== undefined) res.setHeader(key, value);
  const header: Record<string, string> = { "content-type": "application/grpc+proto" };
  if (compression !== null) header["grpc-encoding"] = compression.name;
  // The frame: its 5-byte prefix with the first part, then the second part as it is kept (no copy of the item).
  let frame: [Buffer, Uint8Array] | undefined;
  if ("parts" in result) {
    let [first, second] = result.parts;
    let size = first.byteLength + second.byteLength;
    let flags = 0;
    if (compression !== null && size >= compressMinBytes) {
      first = await compression.compress(joined(result.parts));
      second = new Uint8Array(0);
      size = first.byteLength;
      flags = 1;
    }
    const head = Buffer.allocUnsafe(5 + first.byteLength);
    head[0] = flags;
    head.writeUInt32BE(size, 1);
    head.set(first, 5);
    frame = [head, second];
  }
  const trailer: Record<string, string> = {};
  setTrailerStatus(new Headers(), "error" in result ? result.error : undefined).forEach((value, key) => (trailer[key] = value));
  await new Promise<void>((resolve) => {
    res.once("finish", resolve);
    res.once("close", resolve);
    res.writeHead(200, header);
    res.addTrailers(trailer);
    if (frame === undefined) res.end();
    else if (frame[1].byteLength === 0) res.end(frame[0]);
    else {
      res.write(frame[0]);
      res.end(frame[1]);
    }
  });
}

export type { DescMessage };
