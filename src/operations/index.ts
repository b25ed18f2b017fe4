import type { OperationId } from "../contract/operations.ts";
import type { Operation, RecordKind } from "../core/operation.ts";
import { retailItemGet } from "./retail-item-get.ts";
import { wholesaleItemGet } from "./wholesale-item-get.ts";
import { wholesaleItemSearchPeerbuy } from "./wholesale-item-search-peerbuy.ts";

/**
 * Every operation the gateway serves, one line each: adding an operation is
 * its descriptor file, its proto messages and this line. Everything else
 * (routes, RPC handlers, cache, renderers, stores, import, accounts, the
 * banner) reads this table.
 */
export const operations: readonly Operation[] = [
  retailItemGet,
  wholesaleItemSearchPeerbuy,
  wholesaleItemGet,
];

export const operationById: ReadonlyMap<OperationId, Operation> = new Map(operations.map((op) => [op.id, op]));

/** The operations a name means: a full id (`<catalogue>/<api_name>`) means one, a bare api name every operation that has it. */
export function operationsNamed(name: string): Operation[] {
  const exact = operationById.get(name);
  return exact !== undefined ? [exact] : operations.filter((op) => op.apiName === name);
}

/** The record kinds the embedded catalogue stores: those the operations read. */
export const recordKinds: ReadonlyMap<string, RecordKind> = new Map(operations.map((op) => [op.record.name, op.record]));

/** The catalogues the operations name, in table order. */
export const catalogues: readonly string[] = [...new Set(operations.map((op) => op.catalogue))];
