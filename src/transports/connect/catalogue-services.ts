import { ConnectError, createContextKey, type ConnectRouter, type HandlerContext } from "@connectrpc/connect";
import { errorCodeInfo, fourDigits } from "../../contract/error-codes.ts";
import { operationById, type Operation, type OperationId } from "../../contract/operations.ts";
import type { Credentials } from "../../core/authentication.ts";
import type { CallInput, Gateway, Transport } from "../../core/gateway.ts";
import { parseAuthorization } from "../authorization-header.ts";
import { RetailService } from "../../gen/gateway/catalogue/v1/retail_pb.js";
import { CacheMode, Lang, StatusBlockSchema, type StatusBlock } from "../../gen/gateway/catalogue/v1/status_pb.js";
import { WholesaleService } from "../../gen/gateway/catalogue/v1/wholesale_pb.js";

/** The caller's address, put into the handler context by the HTTP server. */
export const clientIpKey = createContextKey<string>("", { description: "caller's network address" });

/** Request headers (gRPC metadata) that carry an RPC caller's credentials. */
export const credentialHeaders = {
  key: "x-api-key",
  secret: "x-api-secret",
  /** The legacy signed form. */
  dateline: "x-api-dateline",
  sign: "x-api-sign",
  /** The browser-safe form (also accepted as an Authorization header). */
  timestamp: "x-api-timestamp",
  nonce: "x-api-nonce",
  signature: "x-api-signature",
} as const;

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

/**
 * An RPC caller's credentials, in the same forms as the legacy path's, from
 * headers: the HMAC form in the Authorization header or in x-api-timestamp,
 * x-api-nonce and x-api-signature (method RPC, path /<service>/<method>); the
 * legacy signed form in x-api-dateline and x-api-sign (signing the request's
 * own arguments, key, dateline and api_name); or key and secret. A
 * `Gateway-Key` Authorization header may carry the key.
 */
function credentialsOf(ctx: HandlerContext, operation: Operation, args: Record<string, string | undefined>): Credentials {
  const get = (name: string) => ctx.requestHeader.get(name) ?? undefined;
  const header = parseAuthorization(get("authorization"));
  const key = get(credentialHeaders.key) ?? header?.key;
  const path = `/${operation.service.typeName}/${operation.method.name}`;
  if (header?.scheme === "hmac") {
    return { kind: "hmac", key: header.key ?? key, timestamp: header.timestamp, nonce: header.nonce, signature: header.signature, method: "RPC", path };
  }
  const sign = get(credentialHeaders.sign);
  if (sign !== undefined) {
    const dateline = get(credentialHeaders.dateline);
    const params: Record<string, string> = {};
    for (const [name, value] of Object.entries(args)) if (value !== undefined) params[name] = value;
    if (key !== undefined) params.key = key;
    if (dateline !== undefined) params.dateline = dateline;
    return { kind: "legacy-signed", key, dateline, sign, params };
  }
  const signature = get(credentialHeaders.signature);
  if (signature !== undefined) {
    return { kind: "hmac", key, timestamp: get(credentialHeaders.timestamp), nonce: get(credentialHeaders.nonce), signature, method: "RPC", path };
  }
  return { kind: "plain", key, secret: get(credentialHeaders.secret) };
}

function callInput(ctx: HandlerContext, operation: Operation, args: Record<string, string>, cache: CacheMode, lang: Lang): CallInput {
  const given: Record<string, string | undefined> = {};
  for (const [name, value] of Object.entries(args)) given[name] = value === "" ? undefined : value;
  return {
    args: given,
    cache: option(cacheText, cache),
    lang: option(langText, lang),
    credentials: credentialsOf(ctx, operation, given),
    transport: transportOf(ctx),
    clientIp: ctx.values.get(clientIpKey),
    signal: ctx.signal,
  };
}

/** A non-success outcome as an RPC error: the matching Code, and the status block as detail. */
export function statusError(status: StatusBlock): ConnectError {
  const code = errorCodeInfo(status.errorCode).connectCode;
  return new ConnectError(`${fourDigits(status.errorCode)} ${status.reason}`, code, undefined, [{ desc: StatusBlockSchema, value: status }]);
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
        if (outcome.kind !== "item-detail") throw statusError(outcome.status);
        return { item: outcome.item, status: outcome.status };
      },
    });
    router.service(WholesaleService, {
      async itemSearchPeerbuy(req, ctx) {
        const outcome = await gateway.call(peerbuy, callInput(ctx, peerbuy, { num_iid: req.numIid, sid: req.sid }, req.cache, req.lang));
        if (outcome.kind !== "peer-viewed") throw statusError(outcome.status);
        return { item: outcome.item, status: outcome.status };
      },
    });
  };
}
