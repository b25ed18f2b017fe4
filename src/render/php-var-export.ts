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
  const inner = " ".repeat(level + 1);
  const entries: [string, PhpValue][] = Array.isArray(value) ? value.map((v, i) => [String(i), v]) : [...value].map(([k, v]) => [exportKey(k), v]);
  for (const [k, v] of entries) out += `${inner}${k} => ${exportValue(v, level + 2)},\n`;
  return `${out}${level > 1 ? indent : ""})`;
}

/** What PHP's var_export($value, true) prints. */
export function phpVarExport(value: PhpValue): string {
  return exportValue(value, 1);
}
