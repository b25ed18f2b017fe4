import { create, toBinary, toJsonString, type DescMessage, type Message } from "@bufbuild/protobuf";
import type { ConnectError } from "@connectrpc/connect";
import { compressionBrotli, compressionGzip } from "@connectrpc/connect-node";
import { compressionNegotiate, createMethodSerializationLookup, type Compression } from "@connectrpc/connect/protocol";
import { codeToHttpStatus, errorToJsonBytes } from "@connectrpc/connect/protocol-connect";
import type { FastifyReply, FastifyRequest } from "fastify";
import type { Readable } from "node:stream";
import type { Gateway } from "../../core/gateway.ts";
import { exactUtf8 } from "../../core/retained-size.ts";
import type { Operation } from "../../core/operation.ts";
import { StatusBlockSchema } from "../../gen/gateway/catalogue/v1/status_pb.js";
import type { Outcome } from "../../core/gateway.ts";
import { headerReader, operationAnswer, type CallSource } from "./catalogue-services.ts";
import { callerError } from "./internal-errors.ts";
import { fastMessageField } from "./fast-binary.ts";

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

export const joined = ([a, b]: [Uint8Array, Uint8Array]): Uint8Array => Buffer.concat([a, b]);

/** The compressions connect-fastify offers (its default), in its order. */
export const acceptCompression: Compression[] = [compressionGzip, compressionBrotli];
/** connect-es's default: smaller answers are never compressed. */
export const compressMinBytes = 1024;

/** What the fast path leaves to connect-node: the request, with the body bytes it already read, if any. */
export type Declined = { readonly body?: AsyncIterable<Uint8Array> };

/**
 * The request body, read up to `max` bytes; past it, what was read and the
 * rest of the stream, for connect-node to refuse. Read with listeners: a
 * stream's async iterator costs more to make than a small body takes to
 * read. Rejects when the stream closes or fails before its end.
 */
export function readBody(body: Readable, max: number): Promise<{ bytes: Uint8Array } | { over: AsyncIterable<Uint8Array> }> {
  return new Promise((resolve, reject) => {
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
    const onClose = () => onError(new Error("the request stream closed before its end"));
    body.on("data", onData);
    body.on("end", onEnd);
    body.on("error", onError);
    body.on("close", onClose);
  });
}

export const once = (bytes: Uint8Array): AsyncIterable<Uint8Array> => (async function* () {
  yield bytes;
})();

/** What the fast path answers a call with: the message in two parts (successParts), or the error connect-node's path would end it with. */
export type FastResult = { readonly parts: [Uint8Array, Uint8Array] } | { readonly error: ConnectError };

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
        return { parts: successParts(output, statusField, await answer(input, src), src.binary) };
      } catch (e) {
        // As the logInternalErrors interceptor does on connect-node's path.
        return { error: callerError(e, src.requestId, procedure, options.log) };
      }
    },
  };
}

/**
 * Whether a request is a Connect unary call the fast path can serve: a POST
 * in `application/proto` or `application/json`, uncompressed, without a
 * timeout, in protocol version 1 or unnamed; and if so, whether binary.
 */
function connectShape(req: FastifyRequest): { readonly binary: boolean } | undefined {
  if (req.method !== "POST") return undefined;
  const h = req.headers;
  const contentType = h["content-type"];
  if (contentType !== "application/proto" && contentType !== "application/json") return undefined;
  if (h["content-encoding"] !== undefined || h["connect-timeout-ms"] !== undefined) return undefined;
  if (h["connect-protocol-version"] !== undefined && h["connect-protocol-version"] !== "1") return undefined;
  return { binary: contentType === "application/proto" };
}

export const headerValue = (v: string | string[] | undefined): string | null => (v === undefined ? null : Array.isArray(v) ? v.join(",") : v);

/**
 * The hottest shape of call over HTTP/1.1, served without connect-node's
 * per-call machinery (handler context, abort signals, async-iterable
 * pipelines, interceptors): a Connect unary POST, binary or JSON, as
 * `connectShape` says. gRPC over HTTP/2 has its own fast path before
 * Fastify (grpc-stream-path.ts). Every other request (gRPC-Web, GET,
 * compressed requests, timeouts, other content types, a body that does not
 * parse or is too large) is declined and goes to connect-node unchanged,
 * with the bytes already read.
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
    const shape = connectShape(req);
    if (shape === undefined) return {};
    const body = await readBody(req.raw, options.readMaxBytes);
    if ("over" in body) return { body: body.over };
    const input = fast.parse(body.bytes, shape.binary);
    if (input === undefined) return { body: once(body.bytes) };
    const h = req.headers;
    const src: CallSource = {
      header: headerReader(h),
      clientIp: req.clientIp,
      requestId: req.id,
      signal: undefined,
      transport: "connect",
      binary: shape.binary,
    };
    await sendConnect(req, reply, await fast.call(input, src, `${req.protocol}://${req.host}${path}`), shape.binary);
    return undefined;
  };
}

/** A Connect unary answer: the message, or the error as JSON with its HTTP status, compressed as negotiated. */
async function sendConnect(req: FastifyRequest, reply: FastifyReply, result: FastResult, binary: boolean): Promise<void> {
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

export type { DescMessage };
