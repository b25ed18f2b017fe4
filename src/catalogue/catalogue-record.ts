import { fromJson, type DescMessage, type JsonObject } from "@bufbuild/protobuf";
import { ItemDetailSchema, type ItemDetail } from "../gen/gateway/catalogue/v1/retail_pb.js";
import { PeerViewedItemSchema, type PeerViewedItem } from "../gen/gateway/catalogue/v1/wholesale_pb.js";

/**
 * One line of a catalogue import (NDJSON), in the legacy field names:
 * - `{"kind":"item_detail","item":{…item detail record…},"obtainable":true}`
 *   (`obtainable` defaults to true; false makes item_get answer 2000)
 * - `{"kind":"peer_viewed","num_iid":"…","sid":"…","item":[{…peer-viewed item…}]}`
 *   (an empty `item` list makes the lookup answer 2000)
 */
export type CatalogueRecord =
  | { readonly kind: "item_detail"; readonly item: ItemDetail; readonly obtainable: boolean }
  | { readonly kind: "peer_viewed"; readonly numIid: string; readonly sid: string; readonly items: PeerViewedItem[] };

const numericId = /^[0-9]{1,20}$/;
const shopId = /^[A-Za-z0-9_-]{1,64}$/;

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

/**
 * Legacy records come from PHP, where an empty object and an empty list are
 * the same array: `[]` stands for an empty map or message. Drop those so the
 * protobuf JSON reader sees the field as unset.
 */
function withoutPhpEmptyArrays(desc: DescMessage, value: Record<string, unknown>): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const [name, v] of Object.entries(value)) {
    const field = desc.fields.find((f) => f.name === name || f.jsonName === name);
    if (field === undefined) {
      out[name] = v; // the JSON reader reports the unknown name
    } else if ((field.fieldKind === "map" || field.fieldKind === "message") && Array.isArray(v) && v.length === 0) {
      continue;
    } else if (field.fieldKind === "message" && isObject(v)) {
      out[name] = withoutPhpEmptyArrays(field.message, v);
    } else if (field.fieldKind === "list" && field.listKind === "message" && Array.isArray(v)) {
      out[name] = v.map((e) => (isObject(e) ? withoutPhpEmptyArrays(field.message, e) : e));
    } else {
      out[name] = v;
    }
  }
  return out;
}

/** A record in legacy field names (as legacy responses carry it) as its protobuf message. */
export function readLegacyMessage<D extends DescMessage>(desc: D, value: unknown, where: string) {
  if (!isObject(value)) throw new Error(`${where} must be an object`);
  try {
    return fromJson(desc, withoutPhpEmptyArrays(desc, value) as JsonObject);
  } catch (e) {
    throw new Error(`${where}: ${(e as Error).message}`);
  }
}

/**
 * The first field of the contract the record leaves out, as a path
 * (`item.seller_info.sid`), or undefined when every one is there. Fields
 * declared `optional` in the proto (promo_type) may be left out; PHP's empty
 * array stands for an empty message or map.
 */
export function missingField(desc: DescMessage, value: Record<string, unknown>, where: string): string | undefined {
  for (const field of desc.fields) {
    if (field.proto.proto3Optional === true) continue;
    const name = field.name in value ? field.name : field.jsonName in value ? field.jsonName : undefined;
    if (name === undefined) return `${where}.${field.name}`;
    const v = value[name];
    if (field.fieldKind === "message" && isObject(v)) {
      const inner = missingField(field.message, v, `${where}.${field.name}`);
      if (inner !== undefined) return inner;
    } else if (field.fieldKind === "list" && field.listKind === "message" && Array.isArray(v)) {
      for (const [i, e] of v.entries()) {
        const inner = isObject(e) ? missingField(field.message, e, `${where}.${field.name}[${i}]`) : undefined;
        if (inner !== undefined) return inner;
      }
    }
  }
  return undefined;
}

function requireComplete(desc: DescMessage, value: unknown, where: string): void {
  if (!isObject(value)) return; // the reader says what is wrong with it
  const missing = missingField(desc, value, where);
  if (missing !== undefined) throw new Error(`${missing} is missing; a record carries every field of the contract`);
}

function requireId(value: unknown, name: string, form: RegExp): string {
  if (typeof value !== "string" || !form.test(value)) throw new Error(`${name} must be a string matching ${form.source}`);
  return value;
}

/** Validates one parsed line; throws an Error whose message says what is wrong. */
export function readCatalogueRecord(value: unknown): CatalogueRecord {
  if (!isObject(value)) throw new Error("a record must be a JSON object");
  switch (value.kind) {
    case "item_detail": {
      const item = readLegacyMessage(ItemDetailSchema, value.item, "item");
      requireId(item.numIid, "item.num_iid", numericId);
      if (value.obtainable !== undefined && typeof value.obtainable !== "boolean") throw new Error("obtainable must be true or false");
      const obtainable = value.obtainable !== false;
      // An item that cannot be obtained answers 2000 and never shows its fields: its id is enough.
      if (obtainable) requireComplete(ItemDetailSchema, value.item, "item");
      return { kind: "item_detail", item, obtainable };
    }
    case "peer_viewed": {
      const numIid = requireId(value.num_iid, "num_iid", numericId);
      const sid = requireId(value.sid, "sid", shopId);
      if (!Array.isArray(value.item)) throw new Error("item must be a list of peer-viewed items");
      const items = value.item.map((e, i) => readLegacyMessage(PeerViewedItemSchema, e, `item[${i}]`));
      value.item.forEach((e, i) => requireComplete(PeerViewedItemSchema, e, `item[${i}]`));
      return { kind: "peer_viewed", numIid, sid, items };
    }
    default:
      throw new Error(`kind must be "item_detail" or "peer_viewed", not ${JSON.stringify(value.kind)}`);
  }
}
