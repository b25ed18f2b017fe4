import type { DescMessage, JsonObject } from "@bufbuild/protobuf";
import { messageFromJson } from "../core/message-shape.ts";

/**
 * Reading records in their legacy form (as legacy responses and import
 * files carry them) into protobuf messages, strictly: every field of the
 * contract present, ids of the right form.
 */

export const numericId = /^[0-9]{1,20}$/;
export const shopId = /^[A-Za-z0-9_-]{1,64}$/;

export function isObject(v: unknown): v is Record<string, unknown> {
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
    return messageFromJson(desc, withoutPhpEmptyArrays(desc, value) as JsonObject);
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

/** Throws when the record leaves out a field of the contract. */
export function requireComplete(desc: DescMessage, value: unknown, where: string): void {
  if (!isObject(value)) return; // the reader says what is wrong with it
  const missing = missingField(desc, value, where);
  if (missing !== undefined) throw new Error(`${missing} is missing; a record carries every field of the contract`);
}

/** The value as an id of the given form, or throws naming it. */
export function requireId(value: unknown, name: string, form: RegExp): string {
  if (typeof value !== "string" || !form.test(value)) throw new Error(`${name} must be a string matching ${form.source}`);
  return value;
}
