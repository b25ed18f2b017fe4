import http, { type ServerResponse } from "node:http";
import http2 from "node:http2";
import type { Socket } from "node:net";
import type { Gateway } from "../../core/gateway.ts";
import { ErrorCode } from "../../gen/gateway/catalogue/v1/status_pb.js";
import type { Outcome } from "../../core/gateway.ts";
import { legacyFormats } from "../../render/legacy-formats.ts";
import { legacyResponse } from "../../render/legacy-response.ts";
import { errorAnswer, rpcProtocolOf, type ErrorAnswer, type RpcProtocol } from "../connect/error-answer.ts";
import { statusError } from "../connect/status-error.ts";
import { corsHeaders, type CorsSettings } from "./cors-headers.ts";
import type { OnePortServerOptions } from "./one-port-server.ts";

/** Set on a request whose answer this handler wrote while the request's own handler was still reading its body. */
const answeredHere = Symbol("answeredHere");
type AnsweredHere = http.IncomingMessage & { [answeredHere]?: true };

/**
 * Whether the server answered the request itself (its body refused by the
 * parser, see below) while a handler was still reading it: that handler's
 * answer has nowhere to go, and must not be written (connect-fastify
 * printed a stack trace to stderr for each: "Cannot set headers after they
 * are sent").
 */
export function answeredByServer(req: http.IncomingMessage): boolean {
  return (req as AnsweredHere)[answeredHere] === true;
}

/**
 * Fastify's `clientErrorHandler`: a request the HTTP parser refuses (bad
 * syntax, headers too large, a client too slow) still gets a status block,
 * recorded like any refusal: written straight to the socket as a legacy
 * status block when no response exists yet (nothing of the request can be
 * trusted), and in the request's own protocol when its head was read (an
 * RPC's error with the block as its detail, see `refusalAnswer`). Any other
 * client error (with TLS, a handshake that failed or timed out) closes the
 * connection, unrecorded.
 */
export function clientErrorHandler(gateway: Gateway, limits: Pick<OnePortServerOptions, "maxHeaderBytes" | "requestTimeoutMs">, cors: CorsSettings) {
  return (error: Error & { code?: string }, socket: Socket): void => {
    // Only the HTTP parser's refusals and the request timeout get an answer. The rest (a TLS
    // handshake that failed or never came, a reset) leave nothing to answer on: an HTTP answer
    // written to a TLS socket before its handshake would wait for the handshake for ever.
    const http1Fault = error.code === "ERR_HTTP_REQUEST_TIMEOUT" || error.code?.startsWith("HPE_") === true;
    if (!http1Fault) {
      socket.destroy();
      return;
    }
    if (!socket.writable) return;
    // The head was read and a handler owns the answer (the fault is in the body,
    // e.g. cut short): once that answer has started, let it finish, then close.
    // Node sets it to null once an answer has finished, until the next request's head is read.
    const answering = (socket as unknown as { _httpMessage?: ServerResponse | null })._httpMessage ?? undefined;
    if (answering?.headersSent) {
      if (answering.writableFinished) socket.end();
      else answering.once("finish", () => socket.end());
      return;
    }
    // Otherwise the answer is ours; keep Node from ending the socket when a
    // half-closing client's FIN arrives while the refusal is being recorded.
    socket.removeAllListeners("end");
    const code = error.code === "ERR_HTTP_REQUEST_TIMEOUT" ? ErrorCode.TIMEOUT : ErrorCode.PARAM_ERROR;
    const [status, reason] =
      error.code === "HPE_HEADER_OVERFLOW"
        ? [431, `the request line and headers are larger than ${limits.maxHeaderBytes} bytes`]
        : error.code === "ERR_HTTP_REQUEST_TIMEOUT"
          ? [408, `the request was not sent within ${limits.requestTimeoutMs} ms`]
          : [400, answering ? "the request body is not complete" : "the request is not valid HTTP"];
    const request = answering?.req;
    const contentType = request?.headers["content-type"];
    const protocol = request === undefined ? undefined : rpcProtocolOf(request.method, request.url, contentType);
    void gateway.refuse(code, "", reason, { clientIp: socket.remoteAddress ?? "", transport: protocol ?? "legacy" }).then(
      (outcome) => {
        const answer = refusalAnswer(outcome, status, protocol, contentType);
        // A browser reads the refusal only with the CORS headers any answer carries (the Origin, when the head was read).
        const origin = request?.headers.origin;
        const headers = { ...corsHeaders(cors, typeof origin === "string" ? origin : undefined), ...answer.headers, connection: "close" };
        if (answering !== undefined && !answering.headersSent) {
          (answering.req as AnsweredHere)[answeredHere] = true;
          answering.writeHead(answer.status, headers).end(answer.body);
          answering.once("finish", () => socket.end());
        } else if (answering === undefined) {
          const head = Object.entries(headers).map(([k, v]) => `${k}: ${v}\r\n`).join("");
          socket.end(Buffer.concat([Buffer.from(`HTTP/1.1 ${answer.status} ${http.STATUS_CODES[answer.status]}\r\n${head}\r\n`), answer.body]));
        }
      },
      () => socket.destroy(),
    ).catch(() => socket.destroy()); // nothing thrown while answering may escape: it would stop the process
  };
}

/**
 * The same answer for an HTTP/2 stream whose request did not arrive whole
 * within the request timeout (one-port-server.ts cuts it; Node's HTTP/1.1
 * parser reports such a request to the handler above): 4017, recorded like
 * any refusal, in the stream's own protocol (`refusalAnswer`: a gRPC call
 * gets `deadline_exceeded` in its trailers with the block as detail, a
 * legacy request a 408 with the block). One that cannot be recorded is
 * reset, as the HTTP/1.1 connection is then cut.
 */
export function http2RequestTimedOut(gateway: Gateway, limits: Pick<OnePortServerOptions, "requestTimeoutMs">, cors: CorsSettings) {
  return (stream: http2.ServerHttp2Stream, headers: http2.IncomingHttpHeaders): void => {
    const clientIp = stream.session?.socket?.remoteAddress ?? "";
    const reset = () => {
      if (!stream.destroyed) stream.close(http2.constants.NGHTTP2_CANCEL);
    };
    const contentType = headers["content-type"];
    const protocol = rpcProtocolOf(headers[":method"], headers[":path"], contentType);
    void gateway
      .refuse(ErrorCode.TIMEOUT, "", `the request was not sent within ${limits.requestTimeoutMs} ms`, { clientIp, transport: protocol ?? "legacy" })
      .then((outcome) => {
        if (stream.destroyed || stream.headersSent) return;
        const answer = refusalAnswer(outcome, 408, protocol, contentType);
        // gRPC's trailers-only answer is its head alone.
        const endStream = answer.body.length === 0;
        const origin = headers.origin;
        stream.respond({ ":status": answer.status, ...corsHeaders(cors, typeof origin === "string" ? origin : undefined), ...answer.headers }, { endStream });
        if (!endStream) stream.end(answer.body);
      }, reset)
      .catch(reset); // nothing thrown while answering may escape: it would stop the process
  };
}

/**
 * A refusal of a request before its call began, as its caller reads
 * answers: an RPC's error in its protocol, with the code the contract gives
 * the four digits and the status block as its detail, as any RPC refusal;
 * anything else a legacy status block in JSON with `legacyStatus`.
 */
function refusalAnswer(outcome: Outcome, legacyStatus: number, protocol: RpcProtocol | undefined, contentType: string | undefined): ErrorAnswer {
  if (protocol !== undefined) return errorAnswer(statusError(outcome.status), protocol, contentType);
  const body = Buffer.from(legacyFormats.json.render(legacyResponse(outcome)));
  return { status: legacyStatus, headers: { "content-type": "application/json; charset=utf-8", "content-length": String(body.length) }, body };
}
