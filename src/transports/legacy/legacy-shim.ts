import type { FastifyInstance, FastifyReply, FastifyRequest } from "fastify";
import { operations, unspecifiedApiNames, type Operation } from "../../contract/operations.ts";
import type { Gateway, Outcome } from "../../core/gateway.ts";
import { ErrorCode } from "../../gen/gateway/catalogue/v1/status_pb.js";
import { legacyResponse } from "../../render/legacy-response.ts";
import { phpJsonEncode } from "../../render/php-json.ts";
import { legacyQuery, type LegacyQuery } from "./legacy-query.ts";

/** The result formats the legacy path renders today, by `result_type`. */
const formats = {
  json: { unescapedUnicode: false },
  jsonu: { unescapedUnicode: true },
} as const;
type Format = keyof typeof formats;

/** Formats the spec names that this gateway does not render yet. */
const plannedFormats = ["xml", "serialize", "var_export"];

const operationList = operations.map((op) => op.id).join(", ");

function formatOf(query: LegacyQuery): { format: Format; rejection?: string } {
  const asked = query.get("result_type") ?? "";
  if (asked === "") return { format: "json" };
  if (asked in formats) return { format: asked as Format };
  const accepted = Object.keys(formats).join(", ");
  if (plannedFormats.includes(asked)) return { format: "json", rejection: `result_type ${asked} is not available yet; accepted: ${accepted}` };
  return { format: "json", rejection: `result_type must be one of ${accepted}` };
}

export function sendLegacy(reply: FastifyReply, outcome: Outcome, format: Format): FastifyReply {
  const body = phpJsonEncode(legacyResponse(outcome), formats[format]);
  // Business errors travel as HTTP 200: legacy clients decide on error_code.
  return reply.code(200).header("content-type", "application/json; charset=utf-8").send(body);
}

function unroutableReason(catalogue: string, apiName: string): string {
  const known = unspecifiedApiNames.includes(apiName) ? `${apiName} is not available on this gateway` : `no operation ${catalogue}/${apiName}`;
  return `${known}; operations: ${operationList}`;
}

/**
 * The legacy query-string surface: `GET /<catalogue>/<api_name>/?key=…`,
 * with or without the trailing slash, on the paths the proto annotations
 * declare. Each request is one call of the same core the RPCs use.
 */
export function legacyShim(gateway: Gateway) {
  return async function plugin(app: FastifyInstance): Promise<void> {
    const handle = (operation: Operation) => async (req: FastifyRequest, reply: FastifyReply) => {
      const query = legacyQuery(req.url);
      const { format, rejection } = formatOf(query);
      const args: Record<string, string | undefined> = {};
      for (const arg of operation.args) args[arg.name] = query.get(arg.name);
      const outcome = await gateway.call(operation, {
        args,
        cache: query.get("cache"),
        lang: query.get("lang"),
        credentials: { key: query.get("key"), secret: query.get("secret") },
        transport: "legacy",
        clientIp: req.ip,
        rejection: query.problem ?? rejection,
      });
      return sendLegacy(reply, outcome, format);
    };
    for (const operation of operations) app.get(operation.path, handle(operation));

    app.get("/:catalogue/:apiName/", async (req, reply) => {
      const { catalogue, apiName } = req.params as { catalogue: string; apiName: string };
      return sendLegacy(reply, gateway.refuse(ErrorCode.API_NOT_FOUND, catalogue, unroutableReason(catalogue, apiName), { clientIp: req.ip }), "json");
    });
  };
}

/** Any request no route serves: a 4010 status block, so every answer has one. */
export function unroutableHandler(gateway: Gateway) {
  return (req: FastifyRequest, reply: FastifyReply) => {
    const path = req.url.split("?")[0]!.slice(0, 200);
    const reason = `${req.method} ${path} is not an operation of this gateway; operations (GET): ${operationList}`;
    return sendLegacy(reply.code(200), gateway.refuse(ErrorCode.API_NOT_FOUND, path.split("/")[1] ?? "", reason, { clientIp: req.ip }), "json");
  };
}
