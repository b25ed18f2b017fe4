import { createContextValues } from "@connectrpc/connect";
import { fastifyConnectPlugin } from "@connectrpc/connect-fastify";
import type { UniversalHandler } from "@connectrpc/connect/protocol";
import type { FastifyInstance } from "fastify";
import type { AddressLockout } from "../../core/address-lockout.ts";
import type { Gateway } from "../../core/gateway.ts";
import type { Readiness } from "../../core/health.ts";
import type { Telemetry } from "../../core/telemetry.ts";
import { Health } from "../../gen/grpc/health/v1/health_pb.js";
import { operations } from "../../operations/index.ts";
import { adminRoutes, type AdminPorts } from "./admin-service.ts";
import { catalogueRoutes } from "./catalogue-services.ts";
import { clientIpKey, requestIdKey } from "./context.ts";
import { healthRoutes } from "./health-service.ts";
import { DescriptorIndex, reflectionRoutes, reflectionServices } from "./reflection-service.ts";
import { logInternalErrors } from "./internal-errors.ts";
import { undecodableIsInvalidArgument } from "./undecodable-request.ts";

export interface ConnectOptions {
  readonly gateway: Gateway;
  /** The AdminService's ports and bearer token; absent, the service is not mounted. */
  readonly admin?: { readonly ports: AdminPorts; readonly token: string } | undefined;
  /** Where failed admin-token guesses count. */
  readonly lockout: AddressLockout;
  /** Largest request message, in bytes. */
  readonly readMaxBytes: number;
  /** What `grpc.health.v1.Health` reports. */
  readonly readiness: Readiness;
  /** Where failed admin tokens are counted. */
  readonly telemetry?: Telemetry | undefined;
}

/**
 * The Connect, gRPC-Web and gRPC services on the app: the catalogue services,
 * the AdminService, gRPC health and server reflection (v1 and v1alpha), every
 * handler wrapped so an undecodable request is `invalid_argument`, internal
 * errors logged once, and each call told the caller's address and the
 * request id.
 */
export async function registerConnect(app: FastifyInstance, options: ConnectOptions): Promise<void> {
  const logInternal = logInternalErrors(app.log);
  await app.register(fastifyConnectPlugin, {
    interceptors: [logInternal],
    routes: (router) => {
      catalogueRoutes(options.gateway, operations)(router);
      // Service interceptors replace the router's, so the admin service is given the logger again.
      if (options.admin) adminRoutes(options.admin.ports, { token: options.admin.token, lockout: options.lockout, interceptors: [logInternal], ...(options.telemetry ? { telemetry: options.telemetry } : {}) })(router);
      // Every service on the port, these two included, is named by health and listed by reflection.
      const mounted = [...new Map(router.handlers.map((h) => [h.service.typeName, h.service])).values(), Health, ...reflectionServices];
      const names = mounted.map((s) => s.typeName);
      healthRoutes(options.readiness, () => names)(router);
      reflectionRoutes(new DescriptorIndex(mounted))(router);
      const handlers = router.handlers as UniversalHandler[];
      handlers.forEach((h, i) => (handlers[i] = undecodableIsInvalidArgument(h)));
    },
    readMaxBytes: options.readMaxBytes,
    contextValues: (req) => createContextValues().set(clientIpKey, req.clientIp).set(requestIdKey, req.id),
  });
}
