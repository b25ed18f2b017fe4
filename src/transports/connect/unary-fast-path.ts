import { create, toBinary, toJsonString, type DescMessage, type Message } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { compressionBrotli, compressionGzip } from "@connectrpc/connect-node";
import { compressionNegotiate, createMethodSerializationLookup, type Compression } from "@connectrpc/connect/protocol";
import { codeToHttpStatus, errorToJsonBytes } from "@connectrpc/connect/protocol-connect";
import type { FastifyReply, FastifyRequest } from "fastify";
import type { IncomingMessage } from "node:http";
import type { Gateway } from "../../core/gateway.ts";
import type { Operation } from "../../core/operation.ts";
import { StatusBlockSchema } from "../../gen/gateway/catalogue/v1/status_pb.js";
import type { Outcome } from "../../core/gateway.ts";
import { operationAnswer, type CallSource } from "./catalogue-services.ts";

const itemBinaryMemo = "rpc-item-binary";
const itemJsonMemo = "rpc-item-json";

/**
 * A success as connect-node's serializers would write it, with the item's
 * part made once per cache entry: in binary, the status block's field then
 * the item's field(s) (field order is free in protobuf); in JSON, exactly
 * `toJsonString` of the whole message (`{"item":…,"status":…}`, fields in
 * declaration order), spliced from the item's and the status's own.
 */
function successBytes(output: DescMessage, outcome: Extract<Outcome, { kind: "success" }>, binary: boolean): Uint8Array {
  const memo = outcome.memo;
  const key = binary ? itemBinaryMemo : itemJsonMemo;
  let item = memo?.get(key) as Buffer | undefined;
  if (item === undefined) {
    const only = create(output, { item: outcome.item } as never);
    // Binary: the item's field(s). JSON: `{"item":X`, the whole message's text up to where the status joins it.
    item = binary ? Buffer.from(toBinary(output, only)) : Buffer.from(toJsonString(output, only).slice(0, -1));
    memo?.set(key, item);
  }
  const status = create(output, { status: outcome.status } as never);
  // Binary: the status block's field, then the item's (field order is free in protobuf).
  // JSON: `{"item":X` + `,"status":Y}`, exactly toJsonString of the whole message.
  return binary ? Buffer.concat([toBinary(output, status), item]) : Buffer.concat([item, Buffer.from(`,${toJsonString(output, status).slice(1)}`)]);
}

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

/**
 * The hottest shape of call, served without connect-node's per-call
 * machinery (handler context, abort signals, async-iterable pipelines,
 * interceptors): a Connect unary POST in `application/proto` or
 * `application/json`, uncompressed, with no timeout. Every other request
 * (gRPC, gRPC-Web, GET, compressed requests, timeouts, other content types,
 * a body that does not parse or is too large) is declined and goes to
 * connect-node unchanged, with the bytes already read.
 *
 * What leaves is what connect-node would send, built with its own parts:
 * the method's serialization lookup (same parsers and serializers), its
 * compression negotiation and compressors, its error JSON and HTTP status
 * mapping, and the same headers. test/rpc-fast-path.test.ts holds the two
 * side by side over a matrix of requests.
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
  return async (req, reply) => {
    const h = req.headers;
    const contentType = h["content-type"];
    const binary = contentType === "application/proto" ? true : contentType === "application/json" ? false : undefined;
    if (
      req.method !== "POST" ||
      binary === undefined ||
      h["content-encoding"] !== undefined ||
      h["connect-timeout-ms"] !== undefined ||
      (h["connect-protocol-version"] !== undefined && h["connect-protocol-version"] !== "1")
    ) {
      return {};
    }
    const body = await readBody(req.raw, options.readMaxBytes);
    if ("over" in body) return { body: body.over };
    let input: Message;
    try {
      input = serialization.getI(binary).parse(body.bytes) as Message;
    } catch {
      return { body: once(body.bytes) }; // connect-node says what is wrong with it, in its words
    }
    const src: CallSource = {
      header: (name) => {
        const v = h[name];
        return Array.isArray(v) ? v.join(", ") : v;
      },
      clientIp: req.clientIp,
      requestId: req.id,
      signal: undefined,
      transport: "connect",
      binary,
    };
    let status = 200;
    let bytes: Uint8Array;
    let type = binary ? "application/proto" : "application/json";
    try {
      bytes = successBytes(output, await answer(input, src), binary);
    } catch (e) {
      let error: ConnectError;
      if (e instanceof ConnectError && (e.code !== Code.Internal || e.findDetails(StatusBlockSchema).length > 0)) error = e;
      else {
        // As the logInternalErrors interceptor does on connect-node's path.
        options.log?.error({ err: e, requestId: req.id, procedure: `${req.protocol}://${req.host}${path}` }, "an RPC failed inside the gateway");
        error = new ConnectError(`internal error; quote request id ${req.id}`, Code.Internal);
      }
      status = codeToHttpStatus(error.code);
      type = "application/json";
      bytes = errorToJsonBytes(error, undefined);
    }
    reply.code(status).header("content-type", type);
    const accept = h["accept-encoding"];
    const compression = compressionNegotiate(acceptCompression, null, accept === undefined ? null : Array.isArray(accept) ? accept.join(",") : accept, "accept-encoding").response;
    if (compression !== null && bytes.byteLength >= compressMinBytes) {
      bytes = await compression.compress(bytes);
      reply.header("content-encoding", compression.name);
    }
    reply.send(Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength));
    return undefined;
  };
}

export type { DescMessage };
