import type { ConnectRouter, HandlerContext } from "@connectrpc/connect";
import { operationById, type Operation, type OperationId } from "../../contract/operations.ts";
import type { CallInput, Gateway, Transport } from "../../core/gateway.ts";
import { credentialFields, readCredentials } from "../credentials.ts";
import { clientIpKey } from "./context.ts";
import { statusError } from "./status-error.ts";
import { RetailService } from "../../gen/gateway/catalogue/v1/retail_pb.js";
import { CacheMode, Lang } from "../../gen/gateway/catalogue/v1/status_pb.js";
import { WholesaleService } from "../../gen/gateway/catalogue/v1/wholesale_pb.js";

function transportOf(ctx: HandlerContext): Transport {
  const contentType = ctx.requestHeader.get("content-type") ?? "";
  if (contentType.startsWith("application/grpc-web")) return "grpc-web";
  if (contentType.startsWith("application/grpc")) return "grpc";
  return "connect";
}

// Typed options become the legacy strings; an enum number this server does not
// know becomes a value the core rejects with 4003.
const cacheText: Record<number, string | undefined> = { [CacheMode.UNSPECIFIED]: undefined, [CacheMode.YES]: "yes", [CacheMode.NO]: "no" };
const langText: Record<number, string | undefined> = { [Lang.UNSPECIFIED]: undefined, [Lang.CN]: "cn", [Lang.EN]: "en", [Lang.RU]: "ru" };

function option(table: Record<number, string | undefined>, value: number): string | undefined {
  return value in table ? table[value] : `enum value ${value}`;
}

function callInput(ctx: HandlerContext, operation: Operation, args: Record<string, string>, cache: CacheMode, lang: Lang): CallInput {
  const given: Record<string, string | undefined> = {};
  for (const [name, value] of Object.entries(args)) given[name] = value === "" ? undefined : value;
  const options = { cache: option(cacheText, cache), lang: option(langText, lang) };
  return {
    args: given,
    ...options,
    // What the RPC sends, under the legacy names: what a signature covers.
    credentials: readCredentials({
      field: (name) => ctx.requestHeader.get(credentialFields[name].header) ?? undefined,
      authorization: ctx.requestHeader.get("authorization") ?? undefined,
      method: "RPC",
      path: `/${operation.service.typeName}/${operation.method.name}`,
      params: () => ({ ...given, ...options }),
    }),
    transport: transportOf(ctx),
    clientIp: ctx.values.get(clientIpKey),
    signal: ctx.signal,
  };
}

function operation(id: OperationId): Operation {
  return operationById.get(id)!;
}

/** The catalogue services, each RPC one call of the core. */
export function catalogueRoutes(gateway: Gateway): (router: ConnectRouter) => void {
  const itemGet = operation("retail/item_get");
  const peerbuy = operation("wholesale/item_search_peerbuy");
  return (router) => {
    router.service(RetailService, {
      async itemGet(req, ctx) {
        const outcome = await gateway.call(itemGet, callInput(ctx, itemGet, { num_iid: req.numIid, is_promotion: req.isPromotion }, req.cache, req.lang));
        if (outcome.kind !== "item-detail") throw statusError(outcome.status, outcome.kind === "error" && outcome.unauthenticated === true);
        return { item: outcome.item, status: outcome.status };
      },
    });
    router.service(WholesaleService, {
      async itemSearchPeerbuy(req, ctx) {
        const outcome = await gateway.call(peerbuy, callInput(ctx, peerbuy, { num_iid: req.numIid, sid: req.sid }, req.cache, req.lang));
        if (outcome.kind !== "peer-viewed") throw statusError(outcome.status, outcome.kind === "error" && outcome.unauthenticated === true);
        return { item: outcome.item, status: outcome.status };
      },
    });
  };
}
