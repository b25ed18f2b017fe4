import type { StoredRecord } from "../core/catalogue-store.ts";
import type { RecordKind } from "../core/operation.ts";
import { catalogues, operations, recordKinds } from "../operations/index.ts";
import { isObject } from "./legacy-message.ts";

/**
 * One line of a catalogue import (NDJSON), in the legacy field names, as
 * one of the record kinds the operations read (their descriptors say how
 * each is read and keyed):
 * - `{"kind":"item_detail","catalogue":"retail","item":{…item detail record…},"obtainable":true}`
 * - `{"kind":"peer_viewed","num_iid":"…","sid":"…","item":[{…peer-viewed item…}]}`
 * `catalogue` may be left out: each kind has its own default.
 */
export type CatalogueRecord = StoredRecord;

/** The catalogues whose operations read a record kind. */
function cataloguesOf(kind: RecordKind): string[] {
  return catalogues.filter((c) => operations.some((op) => op.catalogue === c && op.record === kind));
}

/** Validates one parsed line; throws an Error whose message says what is wrong. */
export function readCatalogueRecord(value: unknown): CatalogueRecord {
  if (!isObject(value)) throw new Error("a record must be a JSON object");
  const kind = typeof value.kind === "string" ? recordKinds.get(value.kind) : undefined;
  if (kind === undefined) throw new Error(`kind must be ${[...recordKinds.keys()].map((k) => `"${k}"`).join(" or ")}, not ${JSON.stringify(value.kind)}`);
  const catalogue = value.catalogue ?? kind.defaultCatalogue;
  const known = cataloguesOf(kind);
  if (typeof catalogue !== "string" || !known.includes(catalogue)) {
    throw new Error(`catalogue of a ${kind.name} record must be ${known.map((c) => `"${c}"`).join(" or ")}, not ${JSON.stringify(catalogue)}`);
  }
  const { key, bytes, obtainable } = kind.read(value);
  return { kind, catalogue, key, bytes, obtainable };
}
