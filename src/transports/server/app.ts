import { cors as connectCors } from "@connectrpc/connect";
import fastifyCors from "@fastify/cors";
import Fastify, { type FastifyBaseLogger, type FastifyInstance, type FastifyRequest, type FastifyServerOptions } from "fastify";
import type { Gateway } from "../../core/gateway.ts";
import { ErrorCode } from "../../gen/gateway/catalogue/v1/status_pb.js";
import type { AdminPorts } from "../connect/admin-service.ts";
import type { OpenFilesFit } from "../../open-files.ts";
import { registerConnect } from "../connect/connect-plugin.ts";
import { credentialHeaders } from "../credentials.ts";
import { installLegacyShim, encodedBodyCode, legacyBodyTypes, refuseLegacy, unroutablePath } from "../legacy/legacy-shim.ts";
import { clientErrorHandler, http2RequestTimedOut } from "./client-errors.ts";
import { corsHeaders, corsSettings } from "./cors-headers.ts";
import { createOnePortServer, createTlsServer, warnedHolders, type Http1RequestClaim, type OnePortServerExtras, type OnePortServerOptions, type RequestClaims } from "./one-port-server.ts";
import { legacyFastPath } from "../legacy/legacy-fast-path.ts";
import { MemoryAddressLockout, type AddressLockout } from "../../core/address-lockout.ts";
import { defaultMemoryMb, memoryPlan } from "../../memory-budget.ts";
import { createLogger, type Logger } from "./logger.ts";
import { AccessLogController, type AccessLogMode } from "./access-log.ts";
import { Readiness } from "../../core/health.ts";
import { clientAddressResolver, trustedProxyTest } from "./client-address.ts";
import { installMetrics, type PrometheusTelemetry } from "./metrics.ts";
import { installProbes } from "./probes.ts";
import { installOpenApi } from "../legacy/openapi.ts";
import { installConsole } from "../console/console-route.ts";
import { operations } from "../../operations/index.ts";
import { answerUnknownRpc, rpcProtocolOf } from "./unknown-rpc.ts";
import type { Server as TlsServer } from "node:tls";
import { TlsCertificateFiles, type TlsCredentials } from "./tls-certificate.ts";

export interface AppOptions {
  readonly gateway: Gateway;
  /** The logger to share with the runtime; without one, the app makes its own from `logLevel` and `logStream`. */
  readonly logger?: Logger;
  /** Log level, or false for no logging. */
  readonly logLevel?: string | false;
  /** Where log lines go (default stdout). */
  readonly logStream?: NodeJS.WritableStream;
  /** Which access lines are written (access-log.ts; default both: `incoming request` and `request completed`). */
  readonly accessLog?: AccessLogMode;
  /** PEM certificate and key: serve TLS with ALPN (h2, http/1.1) instead of cleartext; from files, read again when they change (tls-certificate.ts). */
  readonly tls?: TlsCredentials | TlsCertificateFiles;
  /** Largest request body on any path, legacy or RPC. */
  readonly maxBodyBytes?: number;
  /** Header, timeout and connection limits of the server. */
  readonly limits?: Partial<Omit<OnePortServerOptions, "http2SessionTimeoutMs">>;
  /** The AdminService's ports and the bearer token it requires (empty: the admin API answers Unauthenticated). */
  readonly admin?: { readonly ports: AdminPorts; readonly token: string };
  /**
   * How often a quiet stream says it is there (15 s): WatchCalls' heartbeat, and health Watch's status sent
   * again to an HTTP/1.x caller that ended its side (the only way to find whether it has gone).
   */
  readonly streamHeartbeatMs?: number;
  /** The open-files limit `gateway serve` found, and GATEWAY_MAX_CONNECTIONS as set if it lowered `limits.maxConnections` to fit (AdminService.GetConnections says both). */
  readonly openFiles?: OpenFilesFit | undefined;
  /** Failed admin-token guesses count here, as failed account credentials do (default: the admin API's own). */
  readonly lockout?: AddressLockout;
  /** Origins browsers may call from: a list, or ["*"] for any. Empty turns CORS off. */
  readonly corsOrigins?: readonly string[];
  /** What `/readyz` and gRPC health report (default: ready while the app runs). */
  readonly readiness?: Readiness;
  /** The metrics `/metrics` serves (the runtime's telemetry), and the bearer token a scrape needs (empty: none). */
  readonly metrics?: { readonly telemetry: PrometheusTelemetry; readonly token: string };
  /** Proxies (addresses, CIDRs) whose `Forwarded` / `X-Forwarded-For` name the client; empty trusts none. */
  readonly trustedProxies?: readonly string[];
  /** Serve the web console at /console/ (default off). */
  readonly console?: boolean;
  /** The Connect and gRPC unary fast path of the catalogue services (default on; the differential test turns it off to compare). */
  readonly rpcFastPath?: boolean;
  /** The legacy GET fast path before Fastify (legacy-fast-path.ts; default on; the differential test turns it off to compare). */
  readonly legacyFastPath?: boolean;
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
    maxConnectionsPerAddress: 0,
    http2MaxStreams: 100,
    firstRequestTimeoutMs: 5000,
    sendTimeoutMs: 30_000,
    hangUpCheck: true,
    waitingAnswerBytes: memoryPlan(defaultMemoryMb).waitingAnswerBytes,
  } satisfies OnePortServerOptions as OnePortServerOptions,
};

/** Why Fastify refused a request, in words that never quote it. */
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
    case encodedBodyCode:
      return "the request body is sent with a Content-Encoding; a legacy call's body must be sent uncompressed";
    default:
      return "the request could not be read";
  }
}

/**
 * Builds the gateway's one Fastify app: the legacy query-string shim and the
 * Connect, gRPC-Web and gRPC services, all on one port. Tests build the same
 * app, so what is tested is what runs.
 */
export async function buildApp(options: AppOptions): Promise<FastifyInstance> {
  const { gateway } = options;
  const maxBodyBytes = options.maxBodyBytes ?? defaultAppSettings.maxBodyBytes;
  const tlsFiles = options.tls instanceof TlsCertificateFiles ? options.tls : undefined;
  const tls = tlsFiles?.credentials ?? (options.tls as TlsCredentials | undefined);
  const limits = { ...defaultAppSettings.limits, ...options.limits };
  // A trusted proxy carries many clients' connections: the cap per address is not its.
  const serverLimits = { ...limits, uncappedAddress: trustedProxyTest(options.trustedProxies ?? []) };
  // Retry-After is not a header a page may read unless exposed: a refused call's (src/transports/retry-hints.ts).
  const cors = corsSettings(options.corsOrigins ?? defaultAppSettings.corsOrigins, [...connectCors.exposedHeaders, "Retry-After", "RateLimit", "RateLimit-Policy", "Idempotent-Replayed", "Original-Request-Id"]);
  // The fast paths take their requests before Fastify (gRPC streams, Connect and legacy HTTP/1.1 requests); they exist once the routes do.
  let rpcRequests: RequestClaims = {};
  let legacyRequests: Http1RequestClaim | undefined;
  const claims: RequestClaims = {
    http2Stream: (stream, headers) => rpcRequests.http2Stream?.(stream, headers) ?? false,
    http1Request: (req, res) => (legacyRequests?.(req, res) || rpcRequests.http1Request?.(req, res)) ?? false,
    http2RequestTimedOut: http2RequestTimedOut(gateway, limits, cors),
  };
  const serverFactory: FastifyServerOptions["serverFactory"] = tls
    ? (handler) => createTlsServer(handler, serverLimits, tls, claims) as never
    : (handler) => createOnePortServer(handler, serverLimits, claims) as never;
  const app = Fastify({
    serverFactory,
    routerOptions: { ignoreTrailingSlash: true },
    bodyLimit: maxBodyBytes,
    // Requests on open connections are still answered while in-flight calls drain.
    return503OnClosing: false,
    // One id per request, the core's own: the access line, any error line and the ledger row carry the same one.
    genReqId: () => gateway.newRequestId(),
    logController: new AccessLogController({ requestIdLogLabel: "requestId", mode: options.accessLog }),
    ...(options.logger !== undefined
      ? { loggerInstance: options.logger as FastifyBaseLogger }
      : options.logLevel === false
        ? { logger: false }
        : { loggerInstance: createLogger({ level: options.logLevel ?? "info", stream: options.logStream }) as FastifyBaseLogger }),
    // A request the HTTP parser refuses (bad syntax, headers too large, too slow) still gets a status block.
    clientErrorHandler: clientErrorHandler(gateway, limits, cors),
    // A path Fastify cannot decode still gets a status block; the reason never quotes the URL, which may hold credentials.
    frameworkErrors: (error, req, reply) => {
      const reason = error.code === "FST_ERR_BAD_URL" ? "the request path is not valid percent-encoding" : "the request could not be read";
      void refuseLegacy(gateway, req, reply, { code: ErrorCode.PARAM_ERROR, reason });
    },
  });

  // A reason names what is wrong with a request, never quotes it: a body or URL may hold credentials.
  app.setErrorHandler(async (error: Error & { statusCode?: number; code?: string }, req, reply) => {
    const callerFault = error.statusCode !== undefined && error.statusCode >= 400 && error.statusCode < 500;
    return callerFault
      ? refuseLegacy(gateway, req, reply, { code: ErrorCode.PARAM_ERROR, reason: callerFaultReason(error.code, maxBodyBytes) })
      : refuseLegacy(gateway, req, reply, { code: ErrorCode.SERVER_INTERNAL_ERROR, reason: "internal error", cause: error });
  });
  const clientAddress = clientAddressResolver(options.trustedProxies ?? []);
  app.decorateRequest("callLog", null);
  app.decorateRequest("accessRequest", null);
  app.decorateRequest("accessGone", false);
  app.decorateRequest("clientIp", {
    getter(this: FastifyRequest) {
      return clientAddress(this.ip, this.headers);
    },
  });
  // A request for an RPC this server lacks is answered in its own protocol, before any body parser sees it.
  // A callback hook, not an async one: every request passes here, and a promise per request costs.
  app.addHook("onRequest", (req, reply, done) => {
    const transport = req.is404 || req.routeOptions.url === unroutablePath ? rpcProtocolOf(req) : undefined;
    if (transport === undefined) return done();
    answerUnknownRpc(gateway, req, reply, transport).catch((e: unknown) => reply.send(e));
  });
  if (tlsFiles !== undefined) {
    // The server is the TLS one the factory made; renewed files reach it while it serves.
    tlsFiles.serve(app.server as unknown as TlsServer, { log: app.log, ...(options.metrics ? { telemetry: options.metrics.telemetry } : {}) });
    app.addHook("onClose", (_app, done) => {
      tlsFiles.stop();
      done();
    });
  }
  // The server's own counts for /metrics: what it cut under slow readers, what the connection cap holds and refused
  // (each refusal logged too, repeats folded as every warning's).
  const { slowReadersCut, connections } = app.server as unknown as OnePortServerExtras;
  options.metrics?.telemetry.watchSlowReaders(slowReadersCut);
  options.metrics?.telemetry.watchConnections(connections, limits.maxConnections);
  connections.onRefused = (what) =>
    app.log.warn(
      { what, maxConnections: limits.maxConnections, maxConnectionsPerAddress: limits.maxConnectionsPerAddress, heldMostBy: connections.heldMostBy(warnedHolders) },
      what === "connection"
        ? "a connection was refused: GATEWAY_MAX_CONNECTIONS connections were open (raise it, or add replicas; heldMostBy names the addresses holding the most)"
        : what === "address"
          ? "a connection was refused: its address already held GATEWAY_MAX_CONNECTIONS_PER_ADDRESS connections"
          : "an HTTP/2 stream was refused (REFUSED_STREAM): GATEWAY_MAX_CONNECTIONS streams were open across all connections (raise it, or add replicas)",
    );
  const readiness = options.readiness ?? new Readiness([]);
  installProbes(app, readiness);
  installOpenApi(app, operations);
  if (options.console === true) await installConsole(app);
  if (options.metrics !== undefined) installMetrics(app, options.metrics.telemetry, options.metrics.token);
  // Before CORS, whose hook answers OPTIONS itself: the shim's hook adds what each path allows.
  installLegacyShim(app, gateway);
  await app.register(fastifyCors, {
    origin: cors.origin as string | string[] | false,
    exposedHeaders: [...cors.exposedHeaders],
    methods: ["GET", "HEAD", "POST", "OPTIONS"],
    // A page's own tracing adds traceparent and tracestate to a call it is told to trace (trace-context.ts).
    allowedHeaders: [...connectCors.allowedHeaders, ...Object.values(credentialHeaders), "Authorization", "Idempotency-Key", "traceparent", "tracestate"],
    maxAge: 7200,
    // A plain OPTIONS (no Origin) is answered too, with its Allow header.
    strictPreflight: false,
  });
  const answerHeaders = corsHeaders(cors, undefined);
  rpcRequests = await registerConnect(app, {
    gateway,
    admin: options.admin,
    streamHeartbeatMs: options.streamHeartbeatMs,
    lockout: options.lockout ?? new MemoryAddressLockout(),
    readMaxBytes: maxBodyBytes,
    readiness,
    telemetry: options.metrics?.telemetry,
    rpcFastPath: options.rpcFastPath,
    clientAddress,
    answerHeaders,
    accessLogMode: options.accessLog,
    connections: { counts: connections, maxConnections: limits.maxConnections, maxConnectionsPerAddress: limits.maxConnectionsPerAddress, openFiles: options.openFiles },
  });
  if (options.legacyFastPath !== false) legacyRequests = legacyFastPath(gateway, { clientAddress, answerHeaders, log: app.log, accessLogMode: options.accessLog });
  return app;
}
