import { create, toBinary, type DescField, type DescMessage, type Message, type UnknownField } from "@bufbuild/protobuf";
import { BinaryReader } from "@bufbuild/protobuf/wire";
import type { DescMethodUnary } from "@bufbuild/protobuf";
import { Code, ConnectError, type ConnectRouter, type HandlerContext } from "@connectrpc/connect";
import type { CallInput, Gateway, Outcome, Transport } from "../../core/gateway.ts";
import type { Operation } from "../../core/operation.ts";
import { CacheMode, Lang } from "../../gen/gateway/catalogue/v1/status_pb.js";
import { credentialFields, readCredentials } from "../credentials.ts";
import { callerGoneKey, callReachedKey, callLogKey, clientIpKey, requestIdKey } from "./context.ts";
import { rpcTransportOf, statusError } from "./status-error.ts";
import { callHeaderPairs } from "../replay-headers.ts";
import type { AccessFields } from "../server/access-log.ts";
import { traceContextOf } from "../../core/trace-context.ts";

/** What a catalogue handler reads of a call besides its message: the same whichever path the call took. */
export interface CallSource {
  header(name: string): string | undefined;
  readonly clientIp: string;
  readonly requestId: string | undefined;
  readonly signal: AbortSignal | undefined;
  /** When the caller stops waiting, as `performance.now()` reads (CallInput.deadline). */
  readonly deadline?: number | undefined;
  /** Whether the caller has gone (CallInput.gone). */
  readonly gone?: CallInput["gone"];
  readonly transport: Transport;
  /** The messages travel in the protobuf binary format (Connect proto, gRPC, gRPC-Web), not JSON. */
  readonly binary: boolean;
  /** What the core and the RPC layer tell the access line of the call (CallInput.logFields, AccessFields.rpcCode). */
  readonly logFields?: AccessFields | undefined;
}

/** A CallSource's header reader over Node's request headers (the fast paths'): repeated headers joined with ", ", as fetch's Headers join them. */
export function headerReader(headers: Readonly<Record<string, string | string[] | undefined>>): CallSource["header"] {
  return (name) => {
    const v = headers[name];
    return Array.isArray(v) ? v.join(", ") : v;
  };
}

/** A connect-es handler context as a CallSource. */
function sourceOfContext(ctx: HandlerContext): CallSource {
  const contentType = ctx.requestHeader.get("content-type") ?? "";
  const timeoutMs = ctx.timeoutMs();
  return {
    header: (name) => ctx.requestHeader.get(name) ?? undefined,
    clientIp: ctx.values.get(clientIpKey),
    requestId: ctx.values.get(requestIdKey) || undefined,
    signal: ctx.signal,
    deadline: timeoutMs === undefined ? undefined : performance.now() + timeoutMs,
    // connect-node aborts the signal at the deadline (the deadline's own check may be microseconds behind its
    // timer) and when the caller goes: its HTTP/1.1 response closes or its HTTP/2 stream is reset. A reset that
    // has come back but not yet been read is looked for as the HTTP/1.x server's other paths do (caller-gone.ts).
    gone: () =>
      ctx.signal.aborted ? (ConnectError.from(ctx.signal.reason).code === Code.DeadlineExceeded ? "deadline" : "hung_up") : ctx.values.get(callerGoneKey)() ? "hung_up" : undefined,
    transport: rpcTransportOf(contentType),
    binary: binaryCall(ctx),
    logFields: ctx.values.get(callLogKey),
  };
}

// Typed options become the legacy strings; an enum number this server does not
// know becomes a value the core rejects with 4003.
const cacheText: Record<number, string | undefined> = { [CacheMode.UNSPECIFIED]: undefined, [CacheMode.YES]: "yes", [CacheMode.NO]: "no" };
const langText: Record<number, string | undefined> = { [Lang.UNSPECIFIED]: undefined, [Lang.CN]: "cn", [Lang.EN]: "en", [Lang.RU]: "ru" };

function option(table: Record<number, string | undefined>, value: number): string | undefined {
  return value in table ? table[value] : `enum value ${value}`;
}

/** Reads an operation's request message as the core's input: its argument fields by their proto names, the common options as legacy strings. */
function requestReader(operation: Operation): (req: Message, src: CallSource) => CallInput {
  const fields = operation.method.input.fields;
  const argFields = operation.args.map((arg) => [arg.name, fields.find((f) => f.name === arg.name)!.localName] as const);
  const local = (name: string) => (fields.find((f: DescField) => f.name === name) as DescField).localName;
  const cacheField = local("cache");
  const langField = local("lang");
  const path = `/${operation.service.typeName}/${operation.method.name}`;
  return (req, src) => {
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
        field: (name) => src.header(credentialFields[name].header),
        authorization: src.header("authorization"),
        method: "RPC",
        path,
        params: () => ({ ...given, ...options }),
      }),
      transport: src.transport,
      clientIp: src.clientIp,
      requestId: src.requestId,
      signal: src.signal,
      deadline: src.deadline,
      gone: src.gone,
      trace: traceContextOf(src.header("traceparent"), src.header("tracestate")),
      logFields: src.logFields,
      idempotencyKey: src.header("idempotency-key"),
    };
  };
}

/** Whether the call's messages travel in the protobuf binary format (Connect proto, gRPC, gRPC-Web), not JSON. */
function binaryCall(ctx: HandlerContext): boolean {
  if (ctx.requestMethod === "GET") return new URL(ctx.url, "http://x").searchParams.get("encoding") === "proto";
  const contentType = ctx.requestHeader.get("content-type") ?? "";
  return contentType !== "" && !contentType.includes("json");
}

const itemFieldsMemo = "rpc-item-fields";

/**
 * The response's `item` field (or fields, for a list) as encoded bytes, kept
 * in the cache entry's memo: every binary answer from that entry sends them
 * as they are instead of encoding the item again. They ride in the message's
 * unknown fields, which the binary writer copies verbatim after the known
 * ones: the bytes a client decodes are the same message, with `item` after
 * `status` on the wire (field order is free in protobuf).
 */
export function itemFields(operation: Operation, outcome: Extract<Outcome, { kind: "success" }>): UnknownField[] | undefined {
  const memo = outcome.memo;
  if (memo === undefined) return undefined;
  let fields = memo.get(itemFieldsMemo) as UnknownField[] | undefined;
  if (fields === undefined) {
    const bytes = toBinary(operation.method.output, create(operation.method.output, { item: outcome.item } as never));
    const reader = new BinaryReader(bytes);
    fields = [];
    while (reader.pos < reader.len) {
      const [no, wireType] = reader.tag();
      fields.push({ no, wireType, data: reader.skip(wireType, no) });
    }
    memo.set(itemFieldsMemo, fields);
  }
  return fields;
}

/**
 * The catalogue services: one generic handler per operation of the table,
 * each RPC one call of the core. A success is the operation's response
 * message (`item` and `status`); anything else is an error with the status
 * block as detail. A binary answer from the cache sends the item's bytes
 * encoded once per cache entry (itemFields); JSON answers encode it each time.
 */
export function catalogueRoutes(gateway: Gateway, operations: readonly Operation[]): (router: ConnectRouter) => void {
  return (router) => {
    for (const operation of operations) {
      const call = operationCall(gateway, operation);
      router.rpc(operation.method as DescMethodUnary<DescMessage, DescMessage>, (req, ctx) => {
        ctx.values.set(callReachedKey, true);
        return call(req, sourceOfContext(ctx), ctx.responseHeader) as never;
      });
    }
  };
}

/** One call of an operation: its successful outcome, or a ConnectError with the status block as detail. */
export function operationAnswer(gateway: Gateway, operation: Operation): (req: Message, src: CallSource) => Promise<Extract<Outcome, { kind: "success" }>> {
  if (operation.method.methodKind !== "unary") throw new Error(`${operation.method.name} must be unary`);
  const read = requestReader(operation);
  return async (req, src) => {
    const outcome = await gateway.call(operation, read(req, src));
    if (outcome.kind !== "success") throw statusError(outcome.status, { unauthenticated: outcome.unauthenticated, refusedBy: outcome.refusedBy, transport: src.transport, quota: outcome.quota, replayOf: outcome.replayOf });
    return outcome;
  };
}

/**
 * One call of an operation as an RPC: the request message and what else the
 * call says (CallSource) in, the response message out (and its headers:
 * RateLimit, src/transports/quota-headers.ts), or a ConnectError with the
 * status block as detail.
 */
export function operationCall(gateway: Gateway, operation: Operation): (req: Message, src: CallSource, responseHeader: Headers) => Promise<Message> {
  const answer = operationAnswer(gateway, operation);
  const output = operation.method.output;
  return async (req, src, responseHeader) => {
    const outcome = await answer(req, src);
    for (const [name, value] of callHeaderPairs(outcome)) responseHeader.set(name, value);
    const fields = src.binary ? itemFields(operation, outcome) : undefined;
    if (fields === undefined) return create(output, { item: outcome.item, status: outcome.status } as never) as Message;
    const message = create(output, { status: outcome.status } as never) as Message;
    message.$unknown = fields;
    return message;
  };
}
