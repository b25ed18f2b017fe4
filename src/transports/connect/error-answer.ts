import type { ConnectError } from "@connectrpc/connect";
import { codeToHttpStatus, contentTypeStreamJson, contentTypeStreamProto, endStreamFlag, endStreamToJson, errorToJsonBytes, parseContentType as connectContentType } from "@connectrpc/connect/protocol-connect";
import { contentTypeJson as grpcJson, contentTypeProto as grpcProto, parseContentType as grpcContentType, setTrailerStatus } from "@connectrpc/connect/protocol-grpc";
import { contentTypeJson as grpcWebJson, contentTypeProto as grpcWebProto, parseContentType as grpcWebContentType, trailerFlag, trailerSerialize } from "@connectrpc/connect/protocol-grpc-web";

/** The three RPC protocols one port serves besides the legacy query string. */
export type RpcProtocol = "connect" | "grpc" | "grpc-web";

/** An answer whose head and body are whole at once: nothing of a message precedes it. */
export interface ErrorAnswer {
  readonly status: number;
  readonly headers: Record<string, string>;
  readonly body: Uint8Array;
}

// `/package.Service/Method`: what an RPC's path is, and what no legacy path (`/<catalogue>/<api_name>/`) is.
const rpcPath = /^\/[^/?]*\.[^/?]*\/[^/?]+$/;

/**
 * The RPC protocol a request speaks, told as connect-node tells it: an RPC
 * path and a content type of one of its protocols (a Connect GET carries
 * none); undefined for anything else, which the legacy path answers.
 */
export function rpcProtocolOf(method: string | undefined, url: string | undefined, contentType: string | undefined): RpcProtocol | undefined {
  const path = (url ?? "").split("?", 1)[0]!;
  if (!rpcPath.test(path)) return undefined;
  const type = contentType ?? null;
  if (grpcWebContentType(type) !== undefined) return "grpc-web";
  if (grpcContentType(type) !== undefined) return "grpc";
  if (connectContentType(type) !== undefined || method === "GET") return "connect";
  return undefined;
}

/**
 * An error as the request's protocol answers one before any message, in
 * connect-es's own serializations (as connect-node writes it):
 * - gRPC: trailers-only, the status in the head and no body;
 * - gRPC-Web: the status in a trailer frame, the whole body;
 * - Connect unary: the HTTP status of the code and the error as JSON;
 * - Connect streaming: an end-of-stream message holding the error.
 * The error's details (the status block) travel with it on every protocol.
 */
export function errorAnswer(error: ConnectError, protocol: RpcProtocol, contentType: string | undefined): ErrorAnswer {
  const type = contentType ?? null;
  switch (protocol) {
    case "grpc": {
      const headers: Record<string, string> = { "content-type": grpcContentType(type)?.binary === false ? grpcJson : grpcProto };
      setTrailerStatus(new Headers(), error).forEach((value, key) => (headers[key] = value));
      return { status: 200, headers, body: new Uint8Array(0) };
    }
    case "grpc-web": {
      const body = grpcWebTrailerFrame(setTrailerStatus(new Headers(), error));
      return { status: 200, headers: { "content-type": grpcWebContentType(type)?.binary === false ? grpcWebJson : grpcWebProto, "content-length": String(body.length) }, body };
    }
    case "connect": {
      const streaming = connectContentType(type);
      if (streaming?.stream === true) {
        const body = enveloped(endStreamFlag, new TextEncoder().encode(JSON.stringify(endStreamToJson(new Headers(), error, undefined))));
        return { status: 200, headers: { "content-type": streaming.binary ? contentTypeStreamProto : contentTypeStreamJson, "content-length": String(body.length) }, body };
      }
      const body = errorToJsonBytes(error, undefined);
      const headers: Record<string, string> = { "content-type": "application/json", "content-length": String(body.length) };
      error.metadata.forEach((value, key) => (headers[key] = value));
      return { status: codeToHttpStatus(error.code), headers, body };
    }
  }
}

/** gRPC-Web's trailers as they end a body: a frame flagged 0x80 holding them as HTTP/1-style header lines. */
export function grpcWebTrailerFrame(trailer: Headers): Uint8Array {
  return enveloped(trailerFlag, trailerSerialize(trailer));
}

/** One enveloped message: its flags, its length (4 bytes, big-endian), its bytes. */
function enveloped(flags: number, data: Uint8Array): Uint8Array {
  const frame = new Uint8Array(5 + data.length);
  frame[0] = flags;
  new DataView(frame.buffer).setUint32(1, data.length);
  frame.set(data, 5);
  return frame;
}
