import type { UniversalHandler, UniversalServerResponse } from "@connectrpc/connect/protocol";

// connect-es shares its protobuf serializer between clients and servers and
// codes a failed parse `internal`, right for a client reading a bad response
// but wrong for a server reading a caller's bad request: that is
// `invalid_argument`, as connect-es already answers for undecodable JSON.
const parseFailure = "parse binary:";
const grpcInternal = "13";
const grpcInvalidArgument = "3";

function fixGrpcWebTrailer(chunk: Uint8Array): Uint8Array {
  // A trailer frame: flag 0x80, a 4-byte length, then HTTP/1-style header lines.
  if (chunk.length < 5 || chunk[0] !== 0x80) return chunk;
  const text = Buffer.from(chunk.subarray(5)).toString("latin1");
  const message = /grpc-message: ([^\r\n]*)/i.exec(text)?.[1] ?? "";
  if (!/grpc-status: 13\r?\n/i.test(text) || !decodeURIComponent(message).startsWith(parseFailure)) return chunk;
  const fixed = Buffer.from(text.replace(/grpc-status: 13/i, `grpc-status: ${grpcInvalidArgument}`), "latin1");
  const frame = Buffer.alloc(5 + fixed.length);
  frame[0] = 0x80;
  frame.writeUInt32BE(fixed.length, 1);
  fixed.copy(frame, 5);
  return frame;
}

async function* once(bytes: Uint8Array): AsyncIterable<Uint8Array> {
  yield bytes;
}

async function* mapChunks(body: AsyncIterable<Uint8Array>): AsyncIterable<Uint8Array> {
  for await (const chunk of body) yield fixGrpcWebTrailer(chunk);
}

async function bytesOf(body: UniversalServerResponse["body"]): Promise<Buffer | undefined> {
  if (body instanceof Uint8Array) return Buffer.from(body);
  if (body === undefined || typeof body !== "object" || body === null || !(Symbol.asyncIterator in body)) return undefined;
  const chunks: Uint8Array[] = [];
  for await (const c of body as AsyncIterable<Uint8Array>) chunks.push(c);
  return Buffer.concat(chunks);
}

async function fix(res: UniversalServerResponse): Promise<UniversalServerResponse> {
  // Connect: a 500 with a JSON error body (small: read it whole).
  if (res.status === 500 && (res.header?.get("content-type") ?? "").startsWith("application/json")) {
    const bytes = await bytesOf(res.body);
    if (bytes === undefined) return res;
    const text = bytes.toString("utf8");
    const header = new Headers(res.header);
    if (text.includes('"code":"internal"') && text.includes(`"message":"${parseFailure}`)) {
      const body = Buffer.from(text.replace('"code":"internal"', '"code":"invalid_argument"'), "utf8");
      header.set("content-length", String(body.length));
      return { ...res, status: 400, header, body: once(body) };
    }
    return { ...res, header, body: once(bytes) };
  }
  const status = res.trailer?.get("grpc-status");
  if (status === grpcInternal && decodeURIComponent(res.trailer?.get("grpc-message") ?? "").startsWith(parseFailure)) {
    const trailer = new Headers(res.trailer);
    trailer.set("grpc-status", grpcInvalidArgument);
    return { ...res, trailer };
  }
  if ((res.header?.get("content-type") ?? "").startsWith("application/grpc-web") && res.body !== undefined && Symbol.asyncIterator in res.body) {
    return { ...res, body: mapChunks(res.body as AsyncIterable<Uint8Array>) };
  }
  return res;
}

/** The handler, answering `invalid_argument` (not `internal`) when a request's protobuf bytes do not decode. */
export function undecodableIsInvalidArgument(handler: UniversalHandler): UniversalHandler {
  const wrapped = async (req: Parameters<UniversalHandler>[0]) => await fix(await handler(req));
  return Object.assign(wrapped, {
    service: handler.service,
    method: handler.method,
    requestPath: handler.requestPath,
    supportedContentType: handler.supportedContentType,
    protocolNames: handler.protocolNames,
    allowedMethods: handler.allowedMethods,
  });
}
