import type { FastifyBaseLogger } from "fastify";
import type { IncomingMessage, ServerResponse } from "node:http";
import type { Gateway } from "../../core/gateway.ts";
import type { Operation } from "../../core/operation.ts";
import { ErrorCode } from "../../gen/gateway/catalogue/v1/status_pb.js";
import { operations } from "../../operations/index.ts";
import type { ClientAddress } from "../server/client-address.ts";
import type { Http1RequestClaim } from "../server/one-port-server.ts";
import { accessLog, completeOnClose, type AccessLogMode } from "../server/access-log.ts";
import { goneOf } from "../server/caller-gone.ts";
import { endInParts } from "../server/end-in-parts.ts";
import { bodyByteLength, bodyParts } from "../../render/legacy-formats.ts";
import { legacyParams } from "./legacy-params.ts";
import { headerText, legacyAnswer, legacyCall, legacyPathsOf, traceContextOfHeaders, type LegacyAnswer } from "./legacy-shim.ts";

export interface LegacyFastPathOptions {
  /** The caller's address, as the app's requests have it. */
  readonly clientAddress: ClientAddress;
  /** Headers the app adds to every answer to a request without `Origin` (CORS), in the order it adds them. */
  readonly answerHeaders: Readonly<Record<string, string>>;
  /** The app's logger: the access lines are written as Fastify writes them. */
  readonly log: FastifyBaseLogger;
  /** Which access lines are written (access-log.ts; default both). */
  readonly accessLogMode?: AccessLogMode | undefined;
}

/**
 * The hottest legacy shape served on Node's HTTP/1.1 request, before
 * Fastify: a GET without a body and without `Origin`, on an operation's
 * own path (with or without its trailing slash, nothing else to decode).
 * For such a request Fastify's routing, hooks and reply add nothing but
 * cost: the CORS headers are fixed (`answerHeaders`), no body is parsed,
 * and the route's handler is this one. Everything else (POST, HEAD,
 * OPTIONS, a request with `Origin` or a body, any other path) is left to
 * Fastify unchanged.
 *
 * What leaves is what the Fastify route sends: the same call of the core
 * (`legacyCall`), the same rendering and compression (`legacyAnswer`), the
 * same request id, the same headers in the same order, and the same two
 * access lines. test/legacy-fast-path.test.ts holds the two side by side.
 */
export function legacyFastPath(gateway: Gateway, options: LegacyFastPathOptions): Http1RequestClaim {
  const byPath = new Map<string, Operation>();
  for (const op of operations) for (const path of legacyPathsOf(op)) byPath.set(path, op);
  const { clientAddress, answerHeaders } = options;
  const log = accessLog(options.log, options.accessLogMode);

  const write = (res: ServerResponse, answer: LegacyAnswer): void => {
    // As sendLegacy on a reply that CORS has already given its headers: Fastify writes them in the order they were set.
    const headers: Record<string, string> = { ...answerHeaders, "content-type": answer.contentType, vary: "accept-encoding" };
    if (answer.encoding !== undefined) headers["content-encoding"] = answer.encoding;
    if (answer.retryAfter !== undefined) headers["retry-after"] = answer.retryAfter;
    for (const [name, value] of answer.quota) headers[name] = value;
    const body = answer.body;
    headers["content-length"] = String(bodyByteLength(body));
    res.writeHead(200, headers);
    endInParts(res, bodyParts(body));
  };

  const serve = async (operation: Operation, req: IncomingMessage, res: ServerResponse): Promise<void> => {
    const url = req.url!;
    const requestId = gateway.newRequestId();
    const clientIp = clientAddress(req.socket.remoteAddress ?? "", req.headers);
    const logged = log(requestId, "GET", url, clientIp, req.headers.traceparent);
    if (logged !== undefined) completeOnClose(res, () => logged.fields, (sent) => logged.completed(res.statusCode, sent));
    try {
      const { input, format } = legacyCall(operation, legacyParams(url), {
        method: "GET",
        authorization: req.headers.authorization,
        clientIp,
        requestId,
        gone: goneOf(res),
        trace: traceContextOfHeaders(req.headers),
        logFields: logged?.fields,
        idempotencyKey: headerText(req.headers["idempotency-key"]),
      });
      write(res, legacyAnswer(await gateway.call(operation, input), format, "GET", req.headers["accept-encoding"]));
    } catch (e) {
      // As the app's error handler answers a fault inside a route.
      if (res.headersSent) {
        res.destroy();
        return;
      }
      const refusal = await gateway.refuse(ErrorCode.SERVER_INTERNAL_ERROR, "", "internal error", { clientIp, transport: "legacy", requestId, logFields: logged?.fields }, e);
      write(res, legacyAnswer(refusal, "json", "GET", req.headers["accept-encoding"]));
    }
  };

  return (req, res) => {
    if (req.method !== "GET") return false;
    const url = req.url ?? "";
    const q = url.indexOf("?");
    const operation = byPath.get(q < 0 ? url : url.slice(0, q));
    if (operation === undefined) return false;
    const h = req.headers;
    if (h.origin !== undefined || h["content-length"] !== undefined || h["transfer-encoding"] !== undefined) return false;
    serve(operation, req, res).catch((e: unknown) => {
      // Only a refusal that cannot be recorded lands here: there is no status block to send.
      options.log.error({ err: e }, "a legacy call on the fast path failed");
      if (!res.headersSent) res.destroy();
    });
    return true;
  };
}
