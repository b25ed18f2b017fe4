import http, { type ServerResponse } from "node:http";
import http2 from "node:http2";
import type { Socket } from "node:net";
import type { Gateway } from "../../core/gateway.ts";
import { ErrorCode } from "../../gen/gateway/catalogue/v1/status_pb.js";
import { legacyFormats } from "../../render/legacy-formats.ts";
import { legacyResponse } from "../../render/legacy-response.ts";
import type { OnePortServerOptions } from "./one-port-server.ts";

/**
 * Fastify's `clientErrorHandler`: a request the HTTP parser refuses (bad
 * syntax, headers too large, a client too slow) still gets a legacy status
 * block, recorded like any refusal, written straight to the socket when no
 * response exists yet. Any other client error (with TLS, a handshake that
 * failed or timed out) closes the connection, unrecorded.
 */
export function clientErrorHandler(gateway: Gateway, limits: Pick<OnePortServerOptions, "maxHeaderBytes" | "requestTimeoutMs">) {
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
    void gateway.refuse(code, "", reason, { clientIp: socket.remoteAddress ?? "", transport: "legacy" }).then(
      (outcome) => {
        const body = Buffer.from(legacyFormats.json.render(legacyResponse(outcome)));
        const headers = { "content-type": "application/json; charset=utf-8", "content-length": String(body.length), connection: "close" };
        if (answering !== undefined && !answering.headersSent) {
          answering.writeHead(status, headers).end(body);
          answering.once("finish", () => socket.end());
        } else if (answering === undefined) {
          const head = Object.entries(headers).map(([k, v]) => `${k}: ${v}\r\n`).join("");
          socket.end(Buffer.concat([Buffer.from(`HTTP/1.1 ${status} ${http.STATUS_CODES[status]}\r\n${head}\r\n`), body]));
        }
      },
      () => socket.destroy(),
    ).catch(() => socket.destroy()); // nothing thrown while answering may escape: it would stop the process
  };
}

/**
 * The same answer for an HTTP/2 stream whose request did not arrive whole
 * within the request timeout (one-port-server.ts cuts it; Node's HTTP/1.1
 * parser reports such a request to the handler above): a 408 with the
 * legacy status block, 4017, recorded like any refusal. One that cannot be
 * recorded is reset, as the HTTP/1.1 connection is then cut.
 */
export function http2RequestTimedOut(gateway: Gateway, limits: Pick<OnePortServerOptions, "requestTimeoutMs">) {
  return (stream: http2.ServerHttp2Stream): void => {
    const clientIp = stream.session?.socket?.remoteAddress ?? "";
    const reset = () => {
      if (!stream.destroyed) stream.close(http2.constants.NGHTTP2_CANCEL);
    };
    void gateway
      .refuse(ErrorCode.TIMEOUT, "", `the request was not sent within ${limits.requestTimeoutMs} ms`, { clientIp, transport: "legacy" })
      .then((outcome) => {
        if (stream.destroyed || stream.headersSent) return;
        const body = Buffer.from(legacyFormats.json.render(legacyResponse(outcome)));
        stream.respond({ ":status": 408, "content-type": "application/json; charset=utf-8", "content-length": String(body.length) });
        stream.end(body);
      }, reset)
      .catch(reset); // nothing thrown while answering may escape: it would stop the process
  };
}
