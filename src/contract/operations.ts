import { getOption, type DescMethod, type DescService } from "@bufbuild/protobuf";
import { http } from "../gen/google/api/annotations_pb.js";
import { RetailService } from "../gen/gateway/catalogue/v1/retail_pb.js";
import { WholesaleService } from "../gen/gateway/catalogue/v1/wholesale_pb.js";

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

export type OperationId = "wholesale/item_search_peerbuy" | "retail/item_get";

export interface Operation {
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
}

const numIid: OperationArg = { name: "num_iid", required: true, accepts: "numeric", maxLength: 20 };

function define(service: DescService, methodName: string, args: OperationArg[]): Operation {
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
  return { id: `${catalogue}/${apiName}` as OperationId, catalogue, apiName, path: path.value, service, method, args };
}

/** Every operation the gateway serves. */
export const operations: readonly Operation[] = [
  define(WholesaleService, "ItemSearchPeerbuy", [numIid, { name: "sid", required: true, accepts: "token", maxLength: 64 }]),
  define(RetailService, "ItemGet", [numIid, { name: "is_promotion", required: false, accepts: ["", "0", "1"], maxLength: 1 }]),
];

export const operationById: ReadonlyMap<string, Operation> = new Map(operations.map((op) => [op.id, op]));

/** `api_name` values the spec lists without specifying them: they answer 4010. */
export const unspecifiedApiNames: readonly string[] = ["item_search", "item_search_shop"];

/** Finds an operation by a full id (`retail/item_get`) or a bare api name (`item_get`). */
export function findOperation(name: string): Operation | undefined {
  return operationById.get(name) ?? operations.find((op) => op.apiName === name);
}
