import type { DescField, DescMessage, Message } from "@bufbuild/protobuf";
import type { DescMethodUnary } from "@bufbuild/protobuf";
import type { ConnectRouter, HandlerContext } from "@connectrpc/connect";
import type { CallInput, Gateway, Transport } from "../../core/gateway.ts";
import type { Operation } from "../../core/operation.ts";
import { CacheMode, Lang } from "../../gen/gateway/catalogue/v1/status_pb.js";
import { credentialFields, readCredentials } from "../credentials.ts";
import { clientIpKey, requestIdKey } from "./context.ts";
import { statusError } from "./status-error.ts";

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

/** Reads an operation's request message as the core's input: its argument fields by their proto names, the common options as legacy strings. */
function requestReader(operation: Operation): (req: Message, ctx: HandlerContext) => CallInput {
  const fields = operation.method.input.fields;
  const argFields = operation.args.map((arg) => [arg.name, fields.find((f) => f.name === arg.name)!.localName] as const);
  const local = (name: string) => (fields.find((f: DescField) => f.name === name) as DescField).localName;
  const cacheField = local("cache");
  const langField = local("lang");
  const path = `/${operation.service.typeName}/${operation.method.name}`;
  return (req, ctx) => {
    const r = req as unknown as Record<string, unknown>;
    const given: Record<string, string | undefined> = {};
    for (const [name, field] of argFields) {
      const value = r[field] as string;
      given[name] = value === "" ? undefined : value;
    }
    const options = { cache: option(cacheText, r[cacheField] as number), lang: option(langText, r[langField] as number) };
    return {
      args: given,
      ...options,
      // What the RPC sends, under the legacy names: what a signature covers.
      credentials: readCredentials({
        field: (name) => ctx.requestHeader.get(credentialFields[name].header) ?? undefined,
        authorization: ctx.requestHeader.get("authorization") ?? undefined,
        method: "RPC",
        path,
        params: () => ({ ...given, ...options }),
      }),
      transport: transportOf(ctx),
      clientIp: ctx.values.get(clientIpKey),
      requestId: ctx.values.get(requestIdKey) || undefined,
      signal: ctx.signal,
    };
  };
}

/**
 * The catalogue services: one generic handler per operation of the table,
 * each RPC one call of the core. A success is the operation's response
 * message (`item` and `status`); anything else is an error with the status
 * block as detail.
 */
export function catalogueRoutes(gateway: Gateway, operations: readonly Operation[]): (router: ConnectRouter) => void {
  return (router) => {
    for (const operation of operations) {
      const read = requestReader(operation);
      if (operation.method.methodKind !== "unary") throw new Error(`${operation.method.name} must be unary`);
      router.rpc(operation.method as DescMethodUnary<DescMessage, DescMessage>, async (req, ctx) => {
        const outcome = await gateway.call(operation, read(req, ctx));
        if (outcome.kind !== "success") throw statusError(outcome.status, outcome.unauthenticated === true);
        return { item: outcome.item, status: outcome.status } as never;
      });
    }
  };
}
