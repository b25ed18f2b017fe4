import type { KeyedDocument } from "./keyed-document.ts";
import { phpFloatText } from "./php-json.ts";
import { PhpFloat, PhpFragment, phpArrayKey, type PhpValue } from "./php-value.ts";
import { wellFormed } from "./string-calls.ts";

const floatStyle = { exponent: "E", zeroFraction: true } as const;

/** A PHP single-quoted literal: `\` and `'` escaped, NUL spliced in as "\0". */
function quoted(s: string): string {
  const text = wellFormed(s);
  return `'${text.replace(/[\\']/g, "\\$&").replaceAll("\0", `' . "\\0" . '`)}'`;
}

function exportKey(k: string): string {
  const stored = phpArrayKey(k);
  return typeof stored === "bigint" ? String(stored) : quoted(stored);
}

function exportValue(value: PhpValue, level: number): string {
  if (typeof value === "string") return quoted(value);
  if (typeof value === "number") return String(value);
  if (typeof value === "boolean") return value ? "true" : "false";
  if (value === null) return "NULL";
  if (value instanceof PhpFloat) return phpFloatText(value.value, floatStyle);
  if (value instanceof PhpFragment) return value.text(`var_export:${level}`, () => exportValue(value.value, level));
  // php_var_export_ex: a nested array starts on its own line, indented.
  const indent = " ".repeat(level - 1);
  let out = level > 1 ? `\n${indent}array (\n` : "array (\n";
  if (Array.isArray(value)) for (let i = 0; i < value.length; i++) out += entry(String(i), value[i]!, level);
  else for (const [k, v] of value) out += entry(exportKey(k), v, level);
  return `${out}${level > 1 ? indent : ""})`;
}

/** One key (as written) and its value inside an array at `level`. */
function entry(key: string, value: PhpValue, level: number): string {
  return `${" ".repeat(level + 1)}${key} => ${exportValue(value, level + 2)},\n`;
}

/** A response as var_export writes it, key by key. */
export const varExportDocument: KeyedDocument = { open: () => "array (\n", between: "", close: () => ")", entry: (key, value) => entry(exportKey(key), value, 1) };

/** What PHP's var_export($value, true) prints. */
export function phpVarExport(value: PhpValue): string {
  return exportValue(value, 1);
}
