import type { FastifyInstance, FastifyReply, FastifyRequest } from "fastify";
import type { IncomingHttpHeaders, OutgoingHttpHeaders } from "node:http";
import { unspecifiedApiNames } from "../../contract/operations.ts";
import type { Operation } from "../../core/operation.ts";
import { operations } from "../../operations/index.ts";
import type { CallInput, Gateway, Outcome } from "../../core/gateway.ts";
import { ErrorCode } from "../../gen/gateway/catalogue/v1/status_pb.js";
import { bodyByteLength, bodyParts, isLegacyFormat, isSpliced, joinedBody, legacyFormats, renderOutcome, type LegacyBody, type LegacyFormatName } from "../../render/legacy-formats.ts";
import { goneOf } from "../server/caller-gone.ts";
import { retryAfterSeconds } from "../retry-hints.ts";
import { traceContextOf, type TraceContext } from "../../core/trace-context.ts";
import { callHeaderPairs } from "../replay-headers.ts";
import { endInParts } from "../server/end-in-parts.ts";
import { callLogOf } from "../server/access-log.ts";
import { credentialFields, readCredentials } from "../credentials.ts";
import { compress, negotiateEncoding } from "./legacy-compression.ts";
import { legacyParams, repeatedJsonName, RepeatedJsonName, type LegacyParams } from "./legacy-params.ts";

const operationList = operations.map((op) => op.id).join(", ");
const formatList = Object.keys(legacyFormats).join(", ");

/** Methods each legacy path answers (for `Allow`). */
export const legacyMethods = "GET, HEAD, POST, OPTIONS";

/** The route of every two-segment path no operation has (answered 4010). */
export const unroutablePath = "/:catalogue/:apiName/";

/** The paths a legacy caller reaches an operation on: its own, and the same without the trailing slash. */
export function legacyPathsOf(operation: Operation): readonly string[] {
  return [operation.path, operation.path.replace(/\/$/, "")];
}

/** Content types a legacy POST body may have. */
export const legacyBodyTypes = ["application/json", "application/x-www-form-urlencoded"];

/** The error code of a legacy body sent with a content coding (compressed), which the legacy paths do not read. */
export const encodedBodyCode = "GW_LEGACY_BODY_ENCODED";

function formatOf(params: LegacyParams): { format: LegacyFormatName; rejection?: string } {
  const asked = params.get("result_type") ?? "";
  if (asked === "") return { format: "json" };
  if (isLegacyFormat(asked)) return { format: asked };
  return { format: "json", rejection: `result_type must be one of ${formatList}` };
}

/** A legacy answer as it leaves: its content type, its encoding and its body. */
export interface LegacyAnswer {
  readonly contentType: string;
  /** `br`, `gzip` or `deflate` when the body is compressed. */
  readonly encoding: string | undefined;
  /** A spliced body (see LegacyBody) only when it is not compressed. */
  readonly body: LegacyBody;
  /** `Retry-After`, in seconds, for a call a limit refused with a known wait (src/transports/retry-hints.ts). */
  readonly retryAfter: string | undefined;
  /** `RateLimit` and `RateLimit-Policy`, for a call whose account was identified (src/transports/quota-headers.ts). */
  readonly quota: readonly (readonly [string, string])[];
}

/**
 * An outcome rendered in a legacy format, compressed as `Accept-Encoding`
 * asks (br, gzip or deflate); a HEAD answer has no body to compress (its
 * headers are the uncompressed body's). The one rendering of a legacy
 * answer, whichever path serves the request.
 */
export function legacyAnswer(outcome: Outcome, format: LegacyFormatName, method: string, acceptEncoding: string | undefined): LegacyAnswer {
  const { contentType } = legacyFormats[format];
  const body = renderOutcome(format, outcome);
  const encoding = method === "HEAD" ? undefined : negotiateEncoding(acceptEncoding);
  const retryAfter = outcome.kind === "error" ? retryAfterSeconds(outcome.refusedBy) : undefined;
  const quota = callHeaderPairs(outcome);
  if (encoding === undefined) return { contentType, encoding, body, retryAfter, quota };
  return { contentType, encoding, body: compress(encoding, joinedBody(body)), retryAfter, quota };
}

/**
 * Renders an outcome in a legacy format, compressed as `Accept-Encoding`
 * asks. Business errors travel as HTTP 200: legacy clients decide on
 * error_code.
 */
export function sendLegacy(reply: FastifyReply, outcome: Outcome, format: LegacyFormatName): FastifyReply {
  const answer = legacyAnswer(outcome, format, reply.request.method, reply.request.headers["accept-encoding"]);
  // Vary on every answer, compressed or not, so no cache serves a compressed body to a client that did not ask for one.
  reply.code(200).header("content-type", answer.contentType).header("vary", "accept-encoding");
  if (answer.encoding !== undefined) reply.header("content-encoding", answer.encoding);
  if (answer.retryAfter !== undefined) reply.header("retry-after", answer.retryAfter);
  for (const [name, value] of answer.quota) reply.header(name, value);
  const body = answer.body;
  if (!isSpliced(body)) return reply.send(body);
  // A cached item's kept bytes, written as they are between the call's text, as the path before
  // Fastify writes them: not joined into a new block a call. Fastify writes a reply's headers in the
  // order they were set, content-length last; its access line and onResponse hooks follow the
  // response's end as for any reply.
  reply.header("content-length", String(bodyByteLength(body)));
  reply.hijack();
  reply.raw.writeHead(200, reply.getHeaders() as OutgoingHttpHeaders);
  endInParts(reply.raw, bodyParts(body));
  return reply;
}

/** What a legacy request says besides its parameters. */
export interface LegacyRequest {
  readonly method: string;
  readonly authorization: string | undefined;
  readonly clientIp: string;
  readonly requestId: string;
  /** Whether the caller has gone (CallInput.gone). */
  readonly gone: CallInput["gone"];
  /** The caller's trace context (CallInput.trace). */
  readonly trace: CallInput["trace"];
  /** What the core tells the access line of the call (CallInput.logFields). */
  readonly logFields: CallInput["logFields"];
  /** Its `Idempotency-Key` header (CallInput.idempotencyKey). */
  readonly idempotencyKey: string | undefined;
}

/** A request header as one text: Node joins a repeated header it does not know with ", ", and gives a list only for a few it does. */
export function headerText(value: string | string[] | undefined): string | undefined {
  return Array.isArray(value) ? value.join(", ") : value;
}

/** The caller's trace context from a request's headers as Node has them (trace-context.ts). */
export function traceContextOfHeaders(headers: IncomingHttpHeaders): TraceContext | undefined {
  return traceContextOf(headerText(headers.traceparent), headerText(headers.tracestate));
}

/**
 * A legacy request as one call of the core: its operation's arguments, the
 * common options and the credentials read from the parameters (query
 * string, and body for POST), and the result_type it asked for.
 */
export function legacyCall(operation: Operation, params: LegacyParams, req: LegacyRequest): { readonly input: CallInput; readonly format: LegacyFormatName } {
  const { format, rejection } = formatOf(params);
  const args: Record<string, string | undefined> = {};
  for (const arg of operation.args) args[arg.name] = params.get(arg.name);
  const input: CallInput = {
    args,
    cache: params.get("cache"),
    lang: params.get("lang"),
    credentials: readCredentials({
      field: (name) => params.get(credentialFields[name].param),
      authorization: req.authorization,
      method: req.method === "HEAD" ? "GET" : req.method,
      path: operation.path,
      params: () => params.all(),
    }),
    transport: "legacy",
    clientIp: req.clientIp,
    requestId: req.requestId,
    gone: req.gone,
    trace: req.trace,
    logFields: req.logFields,
    idempotencyKey: req.idempotencyKey,
    malformed: params.problem,
    rejection,
  };
  return { input, format };
}

/**
 * A request that reached no operation, answered as a legacy status block in
 * JSON: the one way every refusal outside an operation is written (a path
 * that names none, a body or URL that cannot be read, an internal fault).
 */
export async function refuseLegacy(
  gateway: Gateway,
  req: FastifyRequest,
  reply: FastifyReply,
  refusal: { readonly code: ErrorCode; readonly reason: string; readonly apiType?: string; readonly cause?: unknown },
): Promise<FastifyReply> {
  const outcome = await gateway.refuse(refusal.code, refusal.apiType ?? "", refusal.reason, { clientIp: req.clientIp, transport: "legacy", requestId: req.id, logFields: callLogOf(req) }, refusal.cause);
  return sendLegacy(reply, outcome, "json");
}

function unroutableReason(catalogue: string, apiName: string): string {
  const known = unspecifiedApiNames.includes(apiName) ? `${apiName} is not available on this gateway` : `no operation ${catalogue}/${apiName}`;
  return `${known}; operations: ${operationList}`;
}

/**
 * The legacy query-string surface: `GET /<catalogue>/<api_name>/?key=…`
 * (or POST with the same parameters as a JSON or form body), with or without
 * the trailing slash, on the paths the proto annotations declare. Each
 * request is one call of the same core the RPCs use; the answer is rendered
 * in the `result_type` asked for and compressed as `Accept-Encoding` allows.
 *
 * Installed on the root app, before CORS: an OPTIONS request learns from
 * `Allow` what each path takes (CORS answers the request itself), and any
 * request no route serves gets a 4010 status block.
 */
export function installLegacyShim(root: FastifyInstance, gateway: Gateway): void {
  const legacyPaths = new Set(operations.flatMap(legacyPathsOf));
  root.addHook("onRequest", (req, reply, done) => {
    if (req.method === "OPTIONS") reply.header("allow", legacyPaths.has(req.url.split("?")[0]!) ? legacyMethods : "GET, POST, OPTIONS");
    done();
  });
  root.setNotFoundHandler(async (req, reply) => {
    const path = req.url.split("?")[0]!.slice(0, 200);
    const reason = `${req.method} ${path} is not an operation of this gateway; operations: ${operationList}`;
    return refuseLegacy(gateway, req, reply, { code: ErrorCode.API_NOT_FOUND, reason, apiType: path.split("/")[1] ?? "" });
  });
  // Encapsulated, so its body parsers touch only the legacy paths.
  void root.register(async function legacyRoutes(app: FastifyInstance): Promise<void> {
    // A body is JSON or a form, sent as it is. A compressed one was read as if it were text: a gzipped form
    // answered 4014 "missing url param: key" with the key inside it. Refused before it is read (RFC 9110, 8.4.1).
    app.addHook("preParsing", (req, _reply, payload, done) => {
      const coding = req.headers["content-encoding"]?.trim().toLowerCase();
      const body = req.headers["transfer-encoding"] !== undefined || (req.headers["content-length"] ?? "0") !== "0";
      if (!body || coding === undefined || coding === "" || coding === "identity") return done(null, payload);
      done(Object.assign(new Error("content-encoding"), { statusCode: 415, code: encodedBodyCode }));
    });
    // Fastify's text/plain parser would let other text through.
    app.removeContentTypeParser("text/plain");
    app.addContentTypeParser("application/x-www-form-urlencoded", { parseAs: "string" }, (_req, body, done) => done(null, body));
    // JSON as Fastify parses it, but a name given twice is refused as in the query string, not the last one kept.
    const json = app.getDefaultJsonParser("error", "error");
    app.removeContentTypeParser("application/json");
    app.addContentTypeParser("application/json", { parseAs: "string" }, (req, body, done) => {
      const repeated = repeatedJsonName(body as string);
      if (repeated !== undefined) done(null, new RepeatedJsonName(repeated));
      else json(req, body as string, done);
    });

    const handle = (operation: Operation) => async (req: FastifyRequest, reply: FastifyReply) => {
      const { input, format } = legacyCall(operation, legacyParams(req.url, req.body), {
        method: req.method,
        authorization: req.headers.authorization,
        clientIp: req.clientIp,
        requestId: req.id,
        gone: goneOf(reply.raw),
        trace: traceContextOfHeaders(req.headers),
        logFields: callLogOf(req),
        idempotencyKey: headerText(req.headers["idempotency-key"]),
      });
      return sendLegacy(reply, await gateway.call(operation, input), format);
    };
    for (const operation of operations) {
      app.get(operation.path, handle(operation));
      app.post(operation.path, handle(operation));
    }

    const unroutable = async (req: FastifyRequest, reply: FastifyReply) => {
      const { catalogue, apiName } = req.params as { catalogue: string; apiName: string };
      return refuseLegacy(gateway, req, reply, { code: ErrorCode.API_NOT_FOUND, reason: unroutableReason(catalogue, apiName), apiType: catalogue });
    };
    app.get(unroutablePath, unroutable);
    app.post(unroutablePath, unroutable);
  });
}
