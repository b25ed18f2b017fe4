import { getOption, type DescMessage, type DescMethod, type DescService } from "@bufbuild/protobuf";
import { http } from "../gen/google/api/annotations_pb.js";

/** One argument of an operation: a string field of its request message. */
export interface OperationArg {
  /** Query parameter name, which is also the request field's proto name. */
  readonly name: string;
  readonly required: boolean;
  /** Accepted values: digits ("numeric"), letters, digits, `_` and `-` ("token"), or a list. */
  readonly accepts: "numeric" | "token" | readonly string[];
  /** Longest accepted value, in characters. */
  readonly maxLength: number;
}

/** `<catalogue>/<api_name>`, read from the method's legacy path. */
export type OperationId = string;

/** What the proto contract says of an operation: its RPC, its legacy path, its arguments and the shape of its answer. */
export interface OperationContract {
  readonly id: OperationId;
  /** First path segment, reported as `api_type`. */
  readonly catalogue: string;
  /** Second path segment. */
  readonly apiName: string;
  /** The legacy path, read from the method's `google.api.http` annotation. */
  readonly path: string;
  readonly service: DescService;
  readonly method: DescMethod;
  /** The operation's own arguments, in echo order (`call_args`). */
  readonly args: readonly OperationArg[];
  /** The response's `item` field: one record, or a list of records, of this message. */
  readonly item: { readonly message: DescMessage; readonly list: boolean };
}

/**
 * An operation's contract, read from its proto method: the legacy path from
 * the `google.api.http` annotation, each argument checked against a string
 * field of the request, and the answer's `item` field. Throws when the proto
 * does not fit, so a wrong declaration fails at start, not on a call.
 */
export function operationContract(service: DescService, methodName: string, args: readonly OperationArg[]): OperationContract {
  const method = service.methods.find((m) => m.name === methodName);
  if (method === undefined) throw new Error(`${service.typeName} has no method ${methodName}`);
  const path = getOption(method, http).pattern;
  if (path.case !== "get") throw new Error(`${method.name} needs a google.api.http get path`);
  const [catalogue, apiName, extra] = path.value.split("/").filter((s) => s !== "");
  if (catalogue === undefined || apiName === undefined || extra !== undefined) throw new Error(`${method.name}: the path must be /<catalogue>/<api_name>/`);
  for (const arg of args) {
    const field = method.input.fields.find((f) => f.name === arg.name);
    if (field?.fieldKind !== "scalar") throw new Error(`${method.input.typeName} has no scalar field ${arg.name}`);
  }
  for (const name of ["cache", "lang"]) {
    if (method.input.fields.find((f) => f.name === name)?.fieldKind !== "enum") throw new Error(`${method.input.typeName} needs the common field ${name}`);
  }
  const item = method.output.fields.find((f) => f.name === "item");
  const status = method.output.fields.find((f) => f.name === "status");
  if (status?.fieldKind !== "message") throw new Error(`${method.output.typeName} needs a status field`);
  const shape =
    item?.fieldKind === "message"
      ? { message: item.message, list: false }
      : item?.fieldKind === "list" && item.listKind === "message"
        ? { message: item.message, list: true }
        : undefined;
  if (shape === undefined) throw new Error(`${method.output.typeName} needs an item field holding a message or a list of messages`);
  return { id: `${catalogue}/${apiName}`, catalogue, apiName, path: path.value, service, method, args, item: shape };
}

/** `api_name` values the spec lists without specifying them: they answer 4010. */
export const unspecifiedApiNames: readonly string[] = ["item_search", "item_search_shop"];
