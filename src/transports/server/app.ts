import { cors as connectCors, createContextValues } from "@connectrpc/connect";
import fastifyCors from "@fastify/cors";
import { fastifyConnectPlugin } from "@connectrpc/connect-fastify";
import Fastify, { type FastifyBaseLogger, type FastifyInstance, type FastifyServerOptions } from "fastify";
import http from "node:http";
import http2 from "node:http2";
import type { Gateway } from "../../core/gateway.ts";
import { ErrorCode } from "../../gen/gateway/catalogue/v1/status_pb.js";
import { legacyFormats } from "../../render/legacy-formats.ts";
import { legacyResponse } from "../../render/legacy-response.ts";
import { operations } from "../../contract/operations.ts";
import type { UniversalHandler } from "@connectrpc/connect/protocol";
import { adminRoutes, type AdminPorts } from "../connect/admin-service.ts";
import { undecodableIsInvalidArgument } from "../connect/undecodable-request.ts";
import { catalogueRoutes } from "../connect/catalogue-services.ts";
import { clientIpKey, requestIdKey } from "../connect/context.ts";
import { logInternalErrors } from "../connect/internal-errors.ts";
import { credentialHeaders } from "../credentials.ts";
import { legacyBodyTypes, legacyMethods, legacyShim, sendLegacy, unroutableHandler } from "../legacy/legacy-shim.ts";
import { createOnePortServer, type OnePortServerOptions } from "./one-port-server.ts";
import { AddressLockout } from "../../core/address-lockout.ts";
import { createLogger, type Logger } from "./logger.ts";

export interface AppOptions {
  readonly gateway: Gateway;
  /** The logger to share with the runtime; without one, the app makes its own from `logLevel` and `logStream`. */
  readonly logger?: Logger;
  /** Log level, or false for no logging. */
  readonly logLevel?: string | false;
  /** Where log lines go (default stdout). */
  readonly logStream?: NodeJS.WritableStream;
  /** PEM certificate and key: serve TLS with ALPN (h2, http/1.1) instead of cleartext. */
  readonly tls?: { readonly cert: string | Buffer; readonly key: string | Buffer };
  /** Largest request body on any path, legacy or RPC. */
  readonly maxBodyBytes?: number;
  /** Header, timeout and connection limits of the server. */
  readonly limits?: Partial<Omit<OnePortServerOptions, "http2SessionTimeoutMs">>;
  /** The AdminService's ports and the bearer token it requires (empty: the admin API answers Unauthenticated). */
  readonly admin?: { readonly ports: AdminPorts; readonly token: string };
  /** Failed admin-token guesses count here, as failed account credentials do (default: the admin API's own). */
  readonly lockout?: AddressLockout;
  /** Origins browsers may call from: a list, or ["*"] for any. Empty turns CORS off. */
  readonly corsOrigins?: readonly string[];
}

/** What the app does when its options leave a setting out: the one place these defaults live. */
export const defaultAppSettings = {
  maxBodyBytes: 1_048_576,
  corsOrigins: ["*"] as readonly string[],
  limits: {
    keepAliveTimeoutMs: 72_000,
    requestTimeoutMs: 30_000,
    http2SessionTimeoutMs: 120_000,
    maxHeaderBytes: 16_384,
    maxConnections: 10_000,
    firstRequestTimeoutMs: 5000,
  } satisfies OnePortServerOptions as OnePortServerOptions,
};

/**
 * Builds the gateway's one Fastify app: the legacy query-string shim and the
 * Connect, gRPC-Web and gRPC services, all on one port. Tests build the same
 * app, so what is tested is what runs.
 */
function callerFaultReason(code: string | undefined, maxBodyBytes: number): string {
  switch (code) {
    case "FST_ERR_CTP_BODY_TOO_LARGE":
      return `the request body is larger than ${maxBodyBytes} bytes`;
    case "FST_ERR_CTP_INVALID_MEDIA_TYPE":
      return `a body must be sent as ${legacyBodyTypes.join(" or ")}`;
    case "FST_ERR_CTP_EMPTY_JSON_BODY":
      return "the JSON body is empty";
    case "FST_ERR_CTP_INVALID_CONTENT_LENGTH":
      return "the Content-Length does not match the body";
    case "FST_ERR_CTP_INVALID_JSON_BODY":
      return "the request body is not valid JSON";
    default:
      return "the request could not be read";
  }
}

export async function buildApp(options: AppOptions): Promise<FastifyInstance> {
  const { gateway } = options;
  const maxBodyBytes = options.maxBodyBytes ?? defaultAppSettings.maxBodyBytes;
  const tls = options.tls;
  const limits = { ...defaultAppSettings.limits, ...options.limits };
  const serverFactory: FastifyServerOptions["serverFactory"] = tls
    ? (handler) => http2.createSecureServer({ allowHTTP1: true, cert: tls.cert, key: tls.key }, handler as never) as never
    : (handler) => createOnePortServer(handler, limits) as never;
  const app = Fastify({
    serverFactory,
    routerOptions: { ignoreTrailingSlash: true },
    bodyLimit: maxBodyBytes,
    // Requests on open connections are still answered while in-flight calls drain.
    return503OnClosing: false,
    ...(options.logger !== undefined
      ? { loggerInstance: options.logger as FastifyBaseLogger }
      : options.logLevel === false
        ? { logger: false }
        : { loggerInstance: createLogger({ level: options.logLevel ?? "info", stream: options.logStream }) as FastifyBaseLogger }),
    // A request the HTTP parser refuses (bad syntax, headers too large, too slow) still gets a status block.
    clientErrorHandler: (error: Error & { code?: string }, socket) => {
      if (!socket.writable) return;
      // The head was read and a handler owns the answer (the fault is in the body,
      // e.g. cut short): once that answer has started, let it finish, then close.
      const answering = (socket as unknown as { _httpMessage?: import("node:http").ServerResponse })._httpMessage;
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
      );
    },
    // A path Fastify cannot decode still gets a status block; the reason never quotes the URL, which may hold credentials.
    frameworkErrors: (error, req, reply) => {
      const reason = error.code === "FST_ERR_BAD_URL" ? "the request path is not valid percent-encoding" : "the request could not be read";
      void gateway.refuse(ErrorCode.PARAM_ERROR, "", reason, { clientIp: req.ip, transport: "legacy" }).then((outcome) => sendLegacy(reply, outcome, "json"));
    },
  });

  // A reason names what is wrong with a request, never quotes it: a body or URL may hold credentials.
  app.setErrorHandler(async (error: Error & { statusCode?: number; code?: string }, req, reply) => {
    const callerFault = error.statusCode !== undefined && error.statusCode >= 400 && error.statusCode < 500;
    const outcome = await (callerFault
      ? gateway.refuse(ErrorCode.PARAM_ERROR, "", callerFaultReason(error.code, maxBodyBytes), { clientIp: req.ip, transport: "legacy" })
      : gateway.refuse(ErrorCode.SERVER_INTERNAL_ERROR, "", "internal error", { clientIp: req.ip, transport: "legacy" }, error));
    return sendLegacy(reply, outcome, "json");
  });
  app.setNotFoundHandler(unroutableHandler(gateway));

  // OPTIONS: say what each path allows; CORS (below) answers the request itself.
  const legacyPaths = new Set(operations.flatMap((op) => [op.path, op.path.replace(/\/$/, "")]));
  app.addHook("onRequest", async (req, reply) => {
    if (req.method === "OPTIONS") reply.header("allow", legacyPaths.has(req.url.split("?")[0]!) ? legacyMethods : "GET, POST, OPTIONS");
  });
  const corsOrigins = options.corsOrigins ?? defaultAppSettings.corsOrigins;
  await app.register(fastifyCors, {
    origin: corsOrigins.length === 0 ? false : corsOrigins.includes("*") ? "*" : [...corsOrigins],
    methods: ["GET", "HEAD", "POST", "OPTIONS"],
    allowedHeaders: [...connectCors.allowedHeaders, ...Object.values(credentialHeaders), "Authorization"],
    exposedHeaders: [...connectCors.exposedHeaders],
    maxAge: 7200,
    // A plain OPTIONS (no Origin) is answered too, with its Allow header.
    strictPreflight: false,
  });
  await app.register(legacyShim(gateway));
  const logInternal = logInternalErrors(app.log);
  const lockout = options.lockout ?? new AddressLockout();
  await app.register(fastifyConnectPlugin, {
    interceptors: [logInternal],
    routes: (router) => {
      catalogueRoutes(gateway)(router);
      if (options.admin) adminRoutes(options.admin.ports, { token: options.admin.token, lockout, interceptors: [logInternal] })(router);
      const handlers = router.handlers as UniversalHandler[];
      handlers.forEach((h, i) => (handlers[i] = undecodableIsInvalidArgument(h)));
    },
    readMaxBytes: maxBodyBytes,
    contextValues: (req) => createContextValues().set(clientIpKey, req.ip).set(requestIdKey, req.id),
  });
  return app;
}
