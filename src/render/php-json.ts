import type { KeyedDocument } from "./keyed-document.ts";
import { PhpFloat, PhpFragment, type PhpValue } from "./php-value.ts";
import { charCode, sliceOf, wellFormed } from "./string-calls.ts";

export interface PhpJsonOptions {
  /** JSON_UNESCAPED_UNICODE: write non-ASCII characters as UTF-8 (`jsonu`). */
  readonly unescapedUnicode: boolean;
}

const hex = "0123456789abcdef";

function u4(code: number): string {
  return `\\u${hex[(code >> 12) & 15]}${hex[(code >> 8) & 15]}${hex[(code >> 4) & 15]}${hex[code & 15]}`;
}

const shortEscapes: Record<number, string> = { 8: "\\b", 9: "\\t", 10: "\\n", 12: "\\f", 13: "\\r", 34: '\\"', 47: "\\/", 92: "\\\\" };

// Characters that need no escape in either mode: printable ASCII but `"`, `/`, `\`.
const plainAscii = /^[\x20-\x21\x23-\x2e\x30-\x5b\x5d-\x7f]*$/;

/**
 * A string as PHP's json_encode writes it with default flags: `/` as `\/`,
 * control characters escaped, non-ASCII as `\uXXXX` UTF-16 units (surrogate
 * pairs beyond the BMP), or, with JSON_UNESCAPED_UNICODE, literal except
 * U+2028 and U+2029, which PHP still escapes. Lone surrogates, which PHP
 * could not have read as UTF-8, become U+FFFD.
 */
export function phpJsonString(s: string, options: PhpJsonOptions): string {
  if (plainAscii.test(s)) return `"${s}"`;
  s = wellFormed(s);
  if (!options.unescapedUnicode) return escapedJsonString(s);
  let out = '"';
  let start = 0;
  for (let i = 0; i < s.length; i++) {
    const c = charCode(s, i);
    let escape: string | undefined;
    if (c < 0x80) {
      escape = shortEscapes[c] ?? (c < 0x20 ? u4(c) : undefined);
    } else if (!options.unescapedUnicode || c === 0x2028 || c === 0x2029) {
      escape = u4(c);
    }
    if (escape !== undefined) {
      out += sliceOf(s, start, i) + escape;
      start = i + 1;
    }
  }
  return out + sliceOf(s, start) + '"';
}

/** The byte each short escape's letter is, by the character it escapes. */
const shortEscapeLetters = new Uint8Array(128);
for (const [code, text] of Object.entries(shortEscapes)) shortEscapeLetters[Number(code)] = text.charCodeAt(1);
const hexBytes = new Uint8Array([...hex].map((c) => c.charCodeAt(0)));
let scratch = Buffer.allocUnsafe(64 * 1024);

/**
 * The default mode's string, written as bytes: everything it writes is
 * ASCII (non-ASCII as `\uXXXX`), so the text is built in a scratch buffer a
 * byte at a time and read back once, rather than joined from a slice and an
 * escape string per character (the cost of a Chinese description).
 */
function escapedJsonString(s: string): string {
  const need = 6 * s.length + 2;
  if (scratch.length < need) scratch = Buffer.allocUnsafe(Math.max(need, 2 * scratch.length));
  const b = scratch;
  let p = 0;
  b[p++] = 34;
  for (let i = 0; i < s.length; i++) {
    const c = charCode(s, i);
    if (c < 0x80) {
      const letter = shortEscapeLetters[c]!;
      if (letter !== 0) {
        b[p++] = 92;
        b[p++] = letter;
        continue;
      }
      if (c >= 0x20) {
        b[p++] = c;
        continue;
      }
    }
    b[p++] = 92;
    b[p++] = 117;
    b[p++] = hexBytes[(c >> 12) & 15]!;
    b[p++] = hexBytes[(c >> 8) & 15]!;
    b[p++] = hexBytes[(c >> 4) & 15]!;
    b[p++] = hexBytes[c & 15]!;
  }
  b[p++] = 34;
  return b.toString("latin1", 0, p);
}

export interface PhpFloatStyle {
  /** The exponent letter: json_encode writes `e`, serialize and var_export `E`. */
  readonly exponent: "e" | "E";
  /** Append `.0` to an integral value, as var_export does (`30.0`). */
  readonly zeroFraction: boolean;
}

const jsonFloat: PhpFloatStyle = { exponent: "e", zeroFraction: false };

/**
 * A float as PHP writes it with serialize_precision = -1: the shortest text
 * that reads back the same, in exponent form (`1.0e+25`) when the decimal
 * point would sit more than 17 places right or 3 places left of the first
 * digit, as php_gcvt does in its shortest (mode 0, precision 17) form.
 */
export function phpFloatText(n: number, style: PhpFloatStyle = jsonFloat): string {
  if (!Number.isFinite(n)) throw new RangeError("PHP's encoders cannot write INF or NAN");
  let text: string;
  if (n === 0) {
    text = Object.is(n, -0) ? "-0" : "0";
  } else {
    const [mantissa, exp] = n.toExponential().split("e") as [string, string];
    const exponent = Number(exp);
    const digitsOnly = mantissa.replace("-", "").replace(".", "");
    const decpt = exponent + 1;
    if (decpt < -3 || decpt > 17) {
      const frac = digitsOnly.length > 1 ? digitsOnly.slice(1) : "0";
      text = `${digitsOnly[0]}.${frac}${style.exponent}${exponent < 0 ? "-" : "+"}${Math.abs(exponent)}`;
    } else if (decpt <= 0) {
      text = `0.${"0".repeat(-decpt)}${digitsOnly}`;
    } else if (decpt >= digitsOnly.length) {
      text = digitsOnly + "0".repeat(decpt - digitsOnly.length);
    } else {
      text = `${digitsOnly.slice(0, decpt)}.${digitsOnly.slice(decpt)}`;
    }
    if (n < 0) text = `-${text}`;
  }
  return style.zeroFraction && !/[.eE]/.test(text) ? `${text}.0` : text;
}

/** What PHP's json_encode($value) prints (compact, default flags or JSON_UNESCAPED_UNICODE). */
export function phpJsonEncode(value: PhpValue, options: PhpJsonOptions): string {
  if (typeof value === "string") return phpJsonString(value, options);
  if (typeof value === "number") return String(value);
  if (typeof value === "boolean") return value ? "true" : "false";
  if (value === null) return "null";
  if (value instanceof PhpFloat) return phpFloatText(value.value);
  if (value instanceof PhpFragment) return value.text(options.unescapedUnicode ? "jsonu" : "json", () => phpJsonEncode(value.value, options));
  if (Array.isArray(value)) {
    let out = "[";
    for (let i = 0; i < value.length; i++) out += (i === 0 ? "" : ",") + phpJsonEncode(value[i]!, options);
    return out + "]";
  }
  if (value.size === 0) return "[]";
  let out = "{";
  let first = true;
  for (const [k, v] of value) {
    out += (first ? "" : ",") + jsonKey(k, options) + phpJsonEncode(v, options);
    first = false;
  }
  return out + "}";
}

/** Keys seen, with their colon, per mode: the same few dozen (the status block's, the records' fields) come again every call. */
const keyTexts = { escaped: new Map<string, string>(), unescaped: new Map<string, string>() };
/** Past this many distinct keys in a mode (keys of caller-supplied maps, say), new ones are written each time. */
const maxKeyTexts = 4096;

/** A key as json_encode writes it, with its colon (`"key":`). */
export function jsonKey(key: string, options: PhpJsonOptions): string {
  const texts = options.unescapedUnicode ? keyTexts.unescaped : keyTexts.escaped;
  let text = texts.get(key);
  if (text === undefined) {
    text = `${phpJsonString(key, options)}:`;
    if (texts.size < maxKeyTexts) texts.set(key, text);
  }
  return text;
}

/** A response as json_encode writes it, key by key (an empty one is `[]`, as PHP's empty array). */
export function jsonDocument(options: PhpJsonOptions): KeyedDocument {
  return {
    open: (count) => (count === 0 ? "[" : "{"),
    between: ",",
    close: (count) => (count === 0 ? "]" : "}"),
    entry: (key, value) => jsonKey(key, options) + phpJsonEncode(value, options),
  };
}
