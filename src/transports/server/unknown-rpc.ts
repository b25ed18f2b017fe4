import type { FastifyReply, FastifyRequest } from "fastify";
import type { Http2ServerRequest } from "node:http2";
import type { Gateway } from "../../core/gateway.ts";
import type { Transport } from "../../core/meter.ts";
import { Code, ConnectError } from "@connectrpc/connect";
import { errorToJsonBytes } from "@connectrpc/connect/protocol-connect";
import { setTrailerStatus } from "@connectrpc/connect/protocol-grpc";
import { fourDigits } from "../../contract/error-codes.ts";
import { ErrorCode, StatusBlockSchema } from "../../gen/gateway/catalogue/v1/status_pb.js";
import { callLogOf } from "./access-log.ts";

/** `/package.Service/Method`: the path of every RPC. */
const rpcPath = /^\/[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+\/[A-Za-z_][A-Za-z0-9_]*$/;

/**
 * Which RPC protocol a request for an RPC path (`/package.Service/Method`)
 * speaks, judged as gRPC gateways judge it: by its content type
 * (`application/grpc…`, `application/grpc-web…`, a Connect type) or a
 * `Connect-Protocol-Version` header; a Connect GET by its `connect=v1`.
 * Anything else, and any other path, is a legacy request.
 */
export function rpcProtocolOf(req: FastifyRequest): Exclude<Transport, "legacy"> | undefined {
  const path = req.url.split("?")[0]!;
  if (!rpcPath.test(path)) return undefined;
  if (req.method === "GET") return /[?&]connect=v1(&|$)/.test(req.url) || req.headers["connect-protocol-version"] !== undefined ? "connect" : undefined;
  if (req.method !== "POST") return undefined;
  const contentType = (req.headers["content-type"] ?? "").toLowerCase();
  if (contentType.startsWith("application/grpc-web")) return "grpc-web";
  if (contentType.startsWith("application/grpc")) return "grpc";
  if (/^application\/(connect\+)?(json|proto)\b/.test(contentType) || req.headers["connect-protocol-version"] !== undefined) return "connect";
  return undefined;
}

/**
 * Answers a request for an RPC this server does not have in the caller's own
 * protocol: gRPC and gRPC-Web get status 12 (UNIMPLEMENTED) as a
 * trailers-only response, Connect gets `unimplemented` as its error JSON with
 * HTTP 404, each with the 4010 status block as the error's detail. Counted
 * like any request that reached no operation (4010).
 */
export async function answerUnknownRpc(gateway: Gateway, req: FastifyRequest, reply: FastifyReply, transport: Exclude<Transport, "legacy">): Promise<FastifyReply> {
  const path = req.url.split("?")[0]!.slice(0, 200);
  const outcome = await gateway.refuse(ErrorCode.API_NOT_FOUND, "", `${path} is not a method of this server`, { clientIp: req.clientIp, transport, requestId: req.id, logFields: callLogOf(req) });
  const message = `${path} is not a method of this server (request ${outcome.status.requestId})`;
  // The status block travels as the error's detail, as every catalogue refusal's does.
  const error = new ConnectError(`${fourDigits(outcome.status.errorCode)} ${message}`, Code.Unimplemented, undefined, [{ desc: StatusBlockSchema, value: outcome.status }]);
  if (transport === "connect") {
    return reply.code(404).header("content-type", "application/json").send(Buffer.from(errorToJsonBytes(error, undefined)));
  }
  const contentType = (req.headers["content-type"] ?? "").split(";")[0]!.trim() || (transport === "grpc" ? "application/grpc" : "application/grpc-web");
  const status = Object.fromEntries(setTrailerStatus(new Headers(), error));
  const stream = (req.raw as unknown as Partial<Http2ServerRequest>).stream;
  if (stream !== undefined) {
    // HTTP/2: one HEADERS frame that ends the stream, which gRPC clients read as trailers.
    reply.hijack();
    stream.respond({ ":status": 200, "content-type": contentType, ...status }, { endStream: true });
    return reply;
  }
  return reply.code(200).header("content-type", contentType).headers(status).send();
}
