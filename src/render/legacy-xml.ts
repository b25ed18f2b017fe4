import type { KeyedDocument } from "./keyed-document.ts";
import { phpFloatText } from "./php-json.ts";
import { PhpFloat, PhpFragment, type PhpMap, type PhpValue } from "./php-value.ts";
import { wellFormed } from "./string-calls.ts";

// The XML mapping of a legacy response (README, "result_type=xml"):
// - the document is `<?xml version="1.0" encoding="UTF-8"?>` and one `<response>` element
//   holding the top-level keys in order;
// - a key that is a plain XML name becomes the element name; any other key
//   (e.g. `1627207:28320`) becomes `<entry key="…">`, or `<entry key-base64="…">`
//   (base64 of its UTF-8) when it holds a character XML 1.0 cannot carry;
// - text is a string; other types say so in `type`: int, float, bool
//   (`true`/`false`), null (empty element), map (child elements are its keys),
//   list (child elements are `<value>`, one per element, in order);
// - a string holding a character XML 1.0 cannot carry is base64 of its UTF-8,
//   marked `encoding="base64"`.

const plainName = /^[A-Za-z_][A-Za-z0-9_.-]*$/;
const notXml10 = /[^\t\n\r\x20-\uD7FF\uE000-\uFFFD\u{10000}-\u{10FFFF}]/u;

function text(s: string): string {
  return s.replace(/[&<>\r]/g, (c) => (c === "&" ? "&amp;" : c === "<" ? "&lt;" : c === ">" ? "&gt;" : "&#13;"));
}

function attribute(s: string): string {
  return s.replace(/[&<>"\t\n\r]/g, (c) => `&#${c.charCodeAt(0)};`);
}

function element(tag: string, attrs: string, value: PhpValue): string {
  if (value instanceof PhpFragment) return value.text(`xml:${tag}${attrs}`, () => element(tag, attrs, value.value));
  if (typeof value === "string") {
    const s = wellFormed(value);
    if (s === "") return `<${tag}${attrs}/>`;
    if (notXml10.test(s)) return `<${tag}${attrs} encoding="base64">${Buffer.from(s, "utf8").toString("base64")}</${tag}>`;
    return `<${tag}${attrs}>${text(s)}</${tag}>`;
  }
  if (typeof value === "number") return `<${tag}${attrs} type="int">${value}</${tag}>`;
  if (typeof value === "boolean") return `<${tag}${attrs} type="bool">${value}</${tag}>`;
  if (value === null) return `<${tag}${attrs} type="null"/>`;
  if (value instanceof PhpFloat) return `<${tag}${attrs} type="float">${phpFloatText(value.value)}</${tag}>`;
  const [type, inner] = Array.isArray(value) ? ["list", value.map((v) => element("value", "", v)).join("")] : ["map", children(value)];
  return inner === "" ? `<${tag}${attrs} type="${type}"/>` : `<${tag}${attrs} type="${type}">${inner}</${tag}>`;
}

function children(map: PhpMap): string {
  let out = "";
  for (const [key, value] of map) out += entry(key, value);
  return out;
}

/** One key of a map and its value. */
function entry(key: string, value: PhpValue): string {
  const k = wellFormed(key);
  if (plainName.test(k) && !/^xml/i.test(k)) return element(k, "", value);
  if (notXml10.test(k)) return element("entry", ` key-base64="${Buffer.from(k, "utf8").toString("base64")}"`, value);
  return element("entry", ` key="${attribute(k)}"`, value);
}

const open = `<?xml version="1.0" encoding="UTF-8"?>\n<response>`;
const close = "</response>\n";

/** The legacy response as XML (mapping above). */
export function legacyXml(response: PhpMap): string {
  return open + children(response) + close;
}

/** The legacy response as XML, key by key. */
export const xmlDocument: KeyedDocument = { open: () => open, between: "", close: () => close, entry };
