import { createConnectRouter, createContextValues, type ContextValues } from "@connectrpc/connect";
import { fastifyConnectPlugin } from "@connectrpc/connect-fastify";
import type { UniversalHandler } from "@connectrpc/connect/protocol";
import type { FastifyInstance, FastifyRequest } from "fastify";
import { Http2ServerRequest } from "node:http2";
import type { AddressLockout } from "../../core/address-lockout.ts";
import type { Gateway } from "../../core/gateway.ts";
import type { Readiness } from "../../core/health.ts";
import type { Telemetry } from "../../core/telemetry.ts";
import { Health } from "../../gen/grpc/health/v1/health_pb.js";
import { operations } from "../../operations/index.ts";
import { accountRoutes } from "./account-service.ts";
import { adminRoutes, type AdminPorts, type ServerConnections } from "./admin-service.ts";
import { catalogueRoutes } from "./catalogue-services.ts";
import { answeredByServerKey, callerEndedKey, callerGoneKey, callLogKey, clientIpKey, requestIdKey } from "./context.ts";
import { callLogOf, type AccessFields, type AccessLogMode } from "../server/access-log.ts";
import { healthRoutes } from "./health-service.ts";
import { DescriptorIndex, reflectionRoutes, reflectionServices } from "./reflection-service.ts";
import { recordRpcCode } from "./rpc-outcome.ts";
import { logInternalErrors } from "./internal-errors.ts";
import { refusedRequests, unreadRequestRefusal } from "./refused-requests.ts";
import { acceptCompression, answerWithConnectNode, connectRequestPath, unaryFastPath } from "./unary-fast-path.ts";
import { grpcStreamPath } from "./grpc-stream-path.ts";
import type { ClientAddress } from "../server/client-address.ts";
import type { RequestClaims } from "../server/one-port-server.ts";
import { streamGone } from "../server/caller-gone.ts";
import { answeredByServer } from "../server/client-errors.ts";
import { callerEndedSignal } from "../server/hang-up-check.ts";

export interface ConnectOptions {
  readonly gateway: Gateway;
  /** The AdminService's ports and bearer token; absent, the service is not mounted. */
  readonly admin?: { readonly ports: AdminPorts; readonly token: string } | undefined;
  /** How often a quiet stream says it is there (AppOptions.streamHeartbeatMs). */
  readonly streamHeartbeatMs?: number | undefined;
  /** Where failed admin-token guesses count. */
  readonly lockout: AddressLockout;
  /** Largest request message, in bytes. */
  readonly readMaxBytes: number;
  /** What `grpc.health.v1.Health` reports. */
  readonly readiness: Readiness;
  /** Where failed admin tokens are counted. */
  readonly telemetry?: Telemetry | undefined;
  /** Serve Connect and gRPC unary calls of the catalogue without connect-node where it can (default true; off, every call takes connect-node's path). */
  readonly rpcFastPath?: boolean | undefined;
  /** The caller's address, as the app's requests have it (for the gRPC fast path, which runs before them). */
  readonly clientAddress: ClientAddress;
  /** Headers the app adds to every answer to a request without `Origin` (CORS), for the gRPC fast path. */
  readonly answerHeaders: Readonly<Record<string, string>>;
  /** Which access lines the fast paths write, as Fastify's (access-log.ts). */
  readonly accessLogMode?: AccessLogMode | undefined;
  /** The server's connections and caps, for AdminService.GetConnections. */
  readonly connections?: ServerConnections | undefined;
}

/**
 * The Connect, gRPC-Web and gRPC services on the app: the catalogue services,
 * the AccountService (a team's own account), the AdminService, gRPC health and server reflection (v1 and v1alpha), every
 * handler wrapped so an undecodable request is `invalid_argument` and a
 * catalogue request connect-node refuses carries its status block, internal
 * errors logged once, and each call told the caller's address and the
 * request id. Returns the fast paths before Fastify, for the server to give
 * its HTTP/2 streams (gRPC) and HTTP/1.1 requests (Connect) to, unless the
 * fast path is off.
 */
export async function registerConnect(app: FastifyInstance, options: ConnectOptions): Promise<RequestClaims> {
  const logInternal = logInternalErrors(app.log);
  const context = (clientIp: string, requestId: string, logFields: AccessFields | undefined) => createContextValues().set(clientIpKey, clientIp).set(requestIdKey, requestId).set(callLogKey, logFields);
  const contextValues = (req: FastifyRequest) => {
    const values = context(req.clientIp, req.id, callLogOf(req));
    // Over HTTP/2 a reset is in the stream's state before connect-node's signal hears of it (as the request closes).
    if (req.raw instanceof Http2ServerRequest) {
      const stream = req.raw.stream;
      values.set(callerGoneKey, () => streamGone(stream));
    } else {
      const raw = req.raw;
      values.set(answeredByServerKey, () => answeredByServer(raw));
      values.set(callerEndedKey, () => callerEndedSignal(raw));
    }
    return values;
  };
  // The catalogue services have routes of their own (catalogueConnectRoutes), with a fast path for their hottest shape.
  const catalogue = createConnectRouter({ interceptors: [recordRpcCode, logInternal], readMaxBytes: options.readMaxBytes, acceptCompression });
  catalogueRoutes(options.gateway, operations)(catalogue);
  // The services connect-fastify mounts, as it mounts them: their gRPC unary and server-streaming calls are also served on the stream path.
  let mountedHandlers: readonly UniversalHandler[] = [];
  await app.register(fastifyConnectPlugin, {
    interceptors: [recordRpcCode, logInternal],
    routes: (router) => {
      // Service interceptors replace the router's, so these two services are given the logger again.
      accountRoutes(options.gateway, { interceptors: [recordRpcCode, logInternal] })(router);
      if (options.admin) adminRoutes(options.admin.ports, {
          token: options.admin.token,
          lockout: options.lockout,
          interceptors: [recordRpcCode, logInternal],
          ...(options.telemetry ? { telemetry: options.telemetry } : {}),
          ...(options.streamHeartbeatMs !== undefined ? { watchHeartbeatMs: options.streamHeartbeatMs } : {}),
          node: options.gateway.nodeLabel,
          connections: options.connections,
        })(router);
      // Every service on the port, these two included, is named by health and listed by reflection.
      const services = [...catalogue.handlers, ...router.handlers].map((h) => [h.service.typeName, h.service] as const);
      const mounted = [...new Map(services).values(), Health, ...reflectionServices];
      const names = mounted.map((s) => s.typeName);
      healthRoutes(options.readiness, () => names, options.streamHeartbeatMs)(router);
      reflectionRoutes(new DescriptorIndex(mounted))(router);
      const handlers = router.handlers as UniversalHandler[];
      handlers.forEach((h, i) => (handlers[i] = refusedRequests(h)));
      mountedHandlers = handlers;
    },
    readMaxBytes: options.readMaxBytes,
    contextValues,
  });
  await app.register(async (scope) => catalogueConnectRoutes(scope, catalogue.handlers as UniversalHandler[], options, contextValues));
  if (options.rpcFastPath === false) return {};
  const routes = (catalogue.handlers as UniversalHandler[]).flatMap((h) => {
    const operation = operations.find((op) => `/${op.service.typeName}/${op.method.name}` === h.requestPath);
    return operation === undefined ? [] : [{ operation, handler: refusedRequests(h, unreadRequestRefusal(options.gateway, operation)) }];
  });
  const paths = { gateway: options.gateway, routes, readMaxBytes: options.readMaxBytes, log: app.log, clientAddress: options.clientAddress, answerHeaders: options.answerHeaders, accessLogMode: options.accessLogMode, contextValues: context, services: mountedHandlers };
  return { http2Stream: grpcStreamPath(paths), http1Request: connectRequestPath(paths) };
}

/**
 * The catalogue services' routes, each as connect-fastify would mount it (the
 * universal handler on every method, Connect's content types read by the
 * handler itself), with a fast path in front: a Connect unary call it can
 * serve (unary-fast-path.ts) never reaches connect-node; anything else is
 * handed to connect-node unchanged, with the body bytes the fast path read.
 */
function catalogueConnectRoutes(scope: FastifyInstance, handlers: UniversalHandler[], options: ConnectOptions, contextValues: (req: FastifyRequest) => ContextValues): void {
  // Every content type reaches the handler unparsed, as in connect-fastify's scope.
  scope.removeAllContentTypeParsers();
  scope.addContentTypeParser("*", (_req, _payload, done) => done(null, undefined));
  for (const handler of handlers) {
    const operation = operations.find((op) => `/${op.service.typeName}/${op.method.name}` === handler.requestPath);
    const fast = operation === undefined || options.rpcFastPath === false ? undefined : unaryFastPath(options.gateway, operation, { readMaxBytes: options.readMaxBytes, log: scope.log });
    const universal = operation === undefined ? refusedRequests(handler) : refusedRequests(handler, unreadRequestRefusal(options.gateway, operation));
    scope.all(handler.requestPath, async (req, reply) => {
      const declined = fast === undefined ? {} : await fast(req, reply);
      if (declined === undefined) return reply; // answered
      // Headers Fastify holds (CORS) go out with connect-node's answer, as connect-fastify does it.
      await answerWithConnectNode(universal, req.raw, reply.raw, { headers: reply.getHeaders(), contextValues: contextValues(req), body: declined.body, log: scope.log, requestId: req.id });
    });
  }
}
