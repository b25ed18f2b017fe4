import { ScalarType, type DescField, type DescMessage } from "@bufbuild/protobuf";
import type { FastifyInstance } from "fastify";
import { packageVersion } from "../../package-version.ts";
import { legacyKeyOfField } from "../../contract/legacy-layout.ts";
import { errorCodes, fourDigits } from "../../contract/error-codes.ts";
import type { Operation } from "../../core/operation.ts";
import { legacyFormats } from "../../render/legacy-formats.ts";
import { credentialFields } from "../credentials.ts";

type Schema = Record<string, unknown>;

/** Where component schemas are referred to from. */
const ref = (name: string) => ({ $ref: `#/components/schemas/${name}` });

function scalarSchema(type: ScalarType): Schema {
  switch (type) {
    case ScalarType.STRING:
      return { type: "string" };
    case ScalarType.BOOL:
      return { type: "boolean" };
    case ScalarType.BYTES:
      return { type: "string", contentEncoding: "base64" };
    case ScalarType.DOUBLE:
    case ScalarType.FLOAT:
      return { type: "number" };
    case ScalarType.INT32:
    case ScalarType.UINT32:
    case ScalarType.SINT32:
    case ScalarType.FIXED32:
    case ScalarType.SFIXED32:
      return { type: "integer" };
    default:
      // 64-bit integers: a JSON number loses precision past 2^53, so they may travel as text.
      return { type: ["integer", "string"], pattern: "^-?[0-9]+$" };
  }
}

/**
 * A record message as its legacy JSON shape: legacy key names, every field of
 * the contract present (an optional one may be null); nested records
 * become their own component schemas (`into`). PHP writes an empty map or
 * record as `[]`, which the schemas allow.
 */
function messageSchema(message: DescMessage, into: Map<string, Schema>): Schema {
  const name = message.typeName.split(".").slice(-1)[0]!;
  if (!into.has(name)) {
    into.set(name, {}); // placeholder against recursion
    const properties: Record<string, Schema> = {};
    const required: string[] = [];
    for (const field of message.fields) {
      const key = legacyKeyOfField[field.name] ?? field.name;
      // An optional field is always present: null when unset (as PHP writes it).
      const optional = field.proto.proto3Optional === true;
      properties[key] = optional ? { anyOf: [fieldSchema(field, into), { type: "null" }] } : fieldSchema(field, into);
      required.push(key);
    }
    into.set(name, { type: "object", description: `${message.typeName} in legacy key names`, properties, required });
  }
  return ref(name);
}

const phpEmptyArray: Schema = { type: "array", maxItems: 0, description: "PHP's empty array" };

function fieldSchema(field: DescField, into: Map<string, Schema>): Schema {
  switch (field.fieldKind) {
    case "scalar":
      return scalarSchema(field.scalar);
    case "enum":
      return { type: ["integer", "string"] };
    case "message":
      return { anyOf: [messageSchema(field.message, into), phpEmptyArray] };
    case "list":
      return { type: "array", items: field.listKind === "message" ? messageSchema(field.message, into) : field.listKind === "enum" ? { type: ["integer", "string"] } : scalarSchema(field.scalar) };
    case "map":
      return {
        anyOf: [
          { type: "object", additionalProperties: field.mapKind === "message" ? messageSchema(field.message, into) : field.mapKind === "enum" ? { type: ["integer", "string"] } : scalarSchema(field.scalar) },
          phpEmptyArray,
        ],
      };
  }
}

const codeList = [...errorCodes.entries()].map(([code, info]) => ({ code: fourDigits(code), ...info }));

/** The status block every legacy answer carries, success or not (legacy-wire-notes.md). */
function statusProperties(): Record<string, Schema> {
  return {
    error: { type: "string", description: "empty on success, else the code's label (e.g. `api-not-found`)" },
    reason: { type: "string", description: "why, in words; never quotes credentials" },
    error_code: { type: "string", enum: codeList.map((c) => c.code), description: "the four-digit code; see ErrorCode" },
    success: { type: "integer", enum: [0], description: "present (0) only on errors" },
    cache: { type: "integer", enum: [0, 1], description: "1 when answered from the cache" },
    api_info: { type: "string", description: "the account's usage today, yesterday and before" },
    execution_time: { type: "string", pattern: "^[0-9]+\\.[0-9]{3}$", description: "seconds" },
    server_time: { type: "string", description: "zone label / local time" },
    client_ip: { type: "string", description: "the caller's address (behind trusted proxies, the forwarded one)" },
    call_args: { anyOf: [{ type: "object", additionalProperties: { type: "string" } }, phpEmptyArray], description: "the operation's arguments as received" },
    api_type: { type: "string", description: "the catalogue" },
    translate_language: { type: "string" },
    translate_engine: { type: "string" },
    translate_status: { type: "string" },
    translate_time: { type: ["number", "string"] },
    language: { type: "object", properties: { current_lang: { type: "string" }, source_lang: { type: "string" } } },
    server_memory: { type: "string", description: "e.g. `36.68MB`" },
    request_id: { type: "string", description: "quote it when reporting a problem; the access log and the ledger row carry it" },
    last_id: { type: "string" },
    secache: { type: "string", description: "the cached answer's token" },
    secache_time: { type: ["integer", "string"], description: "when the answer was stored (Unix seconds)" },
    secache_date: { type: "string" },
    _ddf: { type: "string", description: "the source that served the answer" },
  };
}

/** The `Idempotency-Key` request header (src/core/idempotency.ts), on GET and POST alike. */
const idempotencyKeyParameter: Schema = {
  name: "Idempotency-Key",
  in: "header",
  required: false,
  description:
    "names the call, so a copy of it (a retry after a lost answer) is charged once: the same key again within 24 hours, with the same request, is answered again and not charged (`Idempotent-Replayed: true`); while the first call runs, 4008; with another request, 4003. Keys are the account's own: 1 to 255 printable ASCII characters, bare (no comma) or as a quoted string. Only a charged call keeps its key; after any other answer a retry runs for real",
  schema: { type: "string", maxLength: 257 },
};

function parameters(op: Operation): Schema[] {
  const args = op.args.map((arg) => ({
    name: arg.name,
    in: "query",
    required: arg.required,
    description: `an argument of ${op.id}; a missing required one answers 4014, a malformed one 4003`,
    schema:
      typeof arg.accepts === "string"
        ? { type: "string", maxLength: arg.maxLength, pattern: arg.accepts === "numeric" ? "^[0-9]*$" : "^[A-Za-z0-9_-]*$" }
        : { type: "string", enum: [...arg.accepts] },
  }));
  const credential = (name: keyof typeof credentialFields, description: string) => ({
    name: credentialFields[name].param,
    in: "query",
    required: false,
    description: `${description} (or the \`${credentialFields[name].header}\` header)`,
    schema: { type: "string" },
  });
  return [
    ...args,
    credential("key", "the account key; without it the answer is 4014"),
    credential("secret", "the account secret (plain form)"),
    credential("dateline", "legacy signed form: the local time the sign covers"),
    credential("sign", "legacy signed form: MD5 over the sorted parameters"),
    credential("timestamp", "browser-safe form: Unix seconds"),
    credential("nonce", "browser-safe form: a one-time value"),
    credential("signature", "browser-safe form: HMAC-SHA256"),
    { name: "result_type", in: "query", required: false, description: "the answer's format", schema: { type: "string", enum: Object.keys(legacyFormats), default: "json" } },
    { name: "lang", in: "query", required: false, description: "the language of the answer's texts", schema: { type: "string", enum: ["cn", "en", "ru"], default: "cn" } },
    { name: "cache", in: "query", required: false, description: "`no` asks the source again (and refreshes the cache)", schema: { type: "string", enum: ["yes", "no"], default: "yes" } },
  ];
}

/**
 * An OpenAPI 3.1 description of the legacy query-string surface, made from
 * the operation table, whose paths come from the protos' `google.api.http`
 * annotations: every path, every parameter with its allowed values, the
 * status block and item schemas from the response messages, and the error
 * codes. Business errors travel as HTTP 200 with their four-digit code, as
 * legacy clients expect; the document says so.
 */
export function legacyOpenApi(operations: readonly Operation[], version: string): Record<string, unknown> {
  const schemas = new Map<string, Schema>();
  const paths: Record<string, unknown> = {};
  const status = statusProperties();
  for (const op of operations) {
    const itemSchema = op.item.list ? { type: "array", items: messageSchema(op.item.message, schemas) } : messageSchema(op.item.message, schemas);
    const success = `${op.method.name}${op.service.name.replace(/Service$/, "")}Answer`;
    schemas.set(success, {
      type: "object",
      description: `a found answer of ${op.id}: keys in this order: ${op.legacyLayout.join(", ")}`,
      properties: Object.fromEntries(op.legacyLayout.map((k) => [k, k === "item" ? itemSchema : (status[k] ?? {})])),
      required: op.legacyLayout.filter((k) => k !== "success"),
    });
    const content = Object.fromEntries(
      [...new Set(Object.values(legacyFormats).map((f) => f.contentType.split(";")[0]!))].map((type) => [
        type,
        type === "application/json" ? { schema: { oneOf: [ref(success), ref("StatusBlock")] } } : { schema: { type: "string", description: `result_type ${Object.entries(legacyFormats).filter(([, f]) => f.contentType.startsWith(type)).map(([n]) => n).join(" or ")}` } },
      ]),
    );
    const operation = {
      operationId: op.id.replace("/", "_"),
      summary: `${op.id} (RPC ${op.service.typeName}/${op.method.name})`,
      parameters: [...parameters(op), idempotencyKeyParameter],
      responses: {
        "200": {
          description: "every answer, found or not: `error_code` says which (0000 found, 2000 not found, 4xxx refused)",
          headers: {
            "Retry-After": {
              description: "on a call a limit refused with a known wait (the account's rate or daily maximum, or an address locked out for failed authentications): whole seconds until it admits a call again",
              schema: { type: "integer", minimum: 1 },
            },
            RateLimit: {
              description:
                'on every answer to a call whose account was identified: what its limits still admit, as draft-ietf-httpapi-ratelimit-headers-10 writes it, e.g. `"daily";r=9998;t=30137, "rate";r=9;t=1`: `r` calls the daily maximum (`"daily"`) or the rate (`"rate"`) still admits, `t` whole seconds until the day ends or the rate\'s burst is whole again; a limit the call did not reach is left out',
              schema: { type: "string" },
            },
            "RateLimit-Policy": {
              description: 'with RateLimit: the account\'s limits, e.g. `"daily";q=10000;w=86400, "rate";q=10;w=1`: `q` calls every `w` seconds',
              schema: { type: "string" },
            },
            "Idempotent-Replayed": {
              description: "`true` on the answer to a copy of a charged call (its Idempotency-Key): answered again, not charged",
              schema: { type: "string", enum: ["true"] },
            },
            "Original-Request-Id": {
              description: "with Idempotent-Replayed: the request id of the charged call this answer repeats",
              schema: { type: "string" },
            },
          },
          content,
        },
      },
    };
    paths[op.path] = {
      get: operation,
      post: {
        ...operation,
        operationId: `${operation.operationId}_post`,
        parameters: [idempotencyKeyParameter],
        requestBody: {
          description: "the same parameters as a JSON object or a form",
          content: {
            "application/x-www-form-urlencoded": { schema: { type: "object", properties: Object.fromEntries(parameters(op).map((p) => [p.name as string, p.schema])) } },
            "application/json": { schema: { type: "object", properties: Object.fromEntries(parameters(op).map((p) => [p.name as string, p.schema])) } },
          },
        },
      },
    };
  }
  schemas.set("StatusBlock", {
    type: "object",
    description: "an answer with no item: a refusal or a 2000, keys in legacy wire order",
    properties: status,
    required: ["error", "reason", "error_code", "success", "cache", "execution_time", "server_time", "api_type", "request_id"],
  });
  schemas.set("ErrorCode", {
    type: "string",
    enum: codeList.map((c) => c.code),
    description: codeList.map((c) => `- \`${c.code}\` ${c.statusText}${c.label === "" ? "" : ` (\`${c.label}\`)`}: ${c.charge}; RPC status \`${c.rpcStatus}\``).join("\n"),
  });
  return {
    openapi: "3.1.0",
    info: {
      title: "Product-data gateway: legacy query-string API",
      version,
      description:
        "The query-string surface legacy callers use, byte-compatible with the original service. Every call answers HTTP 200 with a status block; `error_code` (see ErrorCode) says what happened. The same operations are gRPC/Connect methods on the same port (reflection lists them).",
    },
    paths,
    components: {
      schemas: Object.fromEntries([...schemas.entries()].sort(([a], [b]) => a.localeCompare(b))),
      securitySchemes: {
        key: { type: "apiKey", in: "query", name: credentialFields.key.param },
        keyHeader: { type: "apiKey", in: "header", name: credentialFields.key.header },
      },
    },
    security: [{ key: [] }, { keyHeader: [] }],
  };
}

/**
 * `GET /openapi.json`: the description above, made once. Not a call: neither metered nor ledgered.
 * Its bytes are one Buffer every answer shares: a string body is encoded anew for each answer, and a client that
 * opens HTTP/2 streams it never reads (a window of 0) held a copy per stream: 714 MB under 10,000 of them, where one
 * shared Buffer holds 269 MB (the streams' own cost: 286 MB for a 404).
 */
export function installOpenApi(app: FastifyInstance, operations: readonly Operation[]): void {
  const body = Buffer.from(JSON.stringify(legacyOpenApi(operations, packageVersion())), "utf8");
  app.get("/openapi.json", { logLevel: "warn" }, async (_req, reply) => reply.code(200).header("content-type", "application/json; charset=utf-8").header("cache-control", "public, max-age=300").send(body));
}
