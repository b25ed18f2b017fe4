import type { KeyedDocument } from "./keyed-document.ts";
import { phpFloatText } from "./php-json.ts";
import { PhpFloat, PhpFragment, phpArrayKey, type PhpValue } from "./php-value.ts";
import { wellFormed } from "./string-calls.ts";

const floatStyle = { exponent: "E", zeroFraction: false } as const;

function str(s: string): string {
  const text = wellFormed(s);
  return `s:${Buffer.byteLength(text, "utf8")}:"${text}";`;
}

function key(k: string | number): string {
  const stored = typeof k === "number" ? BigInt(k) : phpArrayKey(k);
  return typeof stored === "bigint" ? `i:${stored};` : str(stored);
}

/** What PHP's serialize($value) prints; lengths are UTF-8 byte counts. */
export function phpSerialize(value: PhpValue): string {
  if (typeof value === "string") return str(value);
  if (typeof value === "number") return `i:${value};`;
  if (typeof value === "boolean") return value ? "b:1;" : "b:0;";
  if (value === null) return "N;";
  if (value instanceof PhpFloat) return `d:${phpFloatText(value.value, floatStyle)};`;
  if (value instanceof PhpFragment) return value.text("serialize", () => phpSerialize(value.value));
  if (Array.isArray(value)) {
    let out = `a:${value.length}:{`;
    for (let i = 0; i < value.length; i++) out += `i:${i};${phpSerialize(value[i]!)}`;
    return `${out}}`;
  }
  let out = `a:${value.size}:{`;
  for (const [k, v] of value) out += entry(k, v);
  return `${out}}`;
}

function entry(k: string, v: PhpValue): string {
  return key(k) + phpSerialize(v);
}

/** A response as serialize writes it, key by key. */
export const serializeDocument: KeyedDocument = { open: (count) => `a:${count}:{`, between: "", close: () => "}", entry };
