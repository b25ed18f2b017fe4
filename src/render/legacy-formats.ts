import { phpJsonEncode } from "./php-json.ts";
import { phpSerialize } from "./php-serialize.ts";
import { randomBytes } from "node:crypto";
import { PhpFragment, PhpPlaceholder, type PhpMap } from "./php-value.ts";
import { phpVarExport } from "./php-var-export.ts";
import { legacyXml } from "./legacy-xml.ts";

export interface LegacyFormat {
  readonly contentType: string;
  render(response: PhpMap): string;
}

/** Every legacy `result_type`, each rendered from the same PHP value of the response. */
export const legacyFormats = {
  json: { contentType: "application/json; charset=utf-8", render: (r) => phpJsonEncode(r, { unescapedUnicode: false }) },
  jsonu: { contentType: "application/json; charset=utf-8", render: (r) => phpJsonEncode(r, { unescapedUnicode: true }) },
  xml: { contentType: "application/xml; charset=utf-8", render: legacyXml },
  serialize: { contentType: "text/plain; charset=utf-8", render: phpSerialize },
  var_export: { contentType: "text/plain; charset=utf-8", render: phpVarExport },
} as const satisfies Record<string, LegacyFormat>;

export type LegacyFormatName = keyof typeof legacyFormats;

/** Unguessable, so no caller-supplied text can contain it. */
const marker = `\u0000gateway-item-${randomBytes(16).toString("hex")}\u0000`;

/**
 * The response, as text (which Fastify writes as UTF-8, the bytes PHP wrote)
 * or as those bytes. When its item is a cached fragment, the rest is
 * rendered around a placeholder and the item's rendering (made on first use
 * in this format, kept for the next) is put in its place, so a cache hit
 * encodes only the status block: text around a rendering kept as text, bytes
 * around one kept as bytes (php-value.ts says which). Either way the bytes
 * are the same as rendering the whole value.
 */
export function renderLegacy(format: LegacyFormatName, response: PhpMap): string | Buffer {
  const item = response.get("item");
  const render = legacyFormats[format].render;
  if (!(item instanceof PhpFragment) || item instanceof PhpPlaceholder) return render(response);
  const placeholder = new PhpPlaceholder(marker, item);
  response.set("item", placeholder);
  const text = render(response);
  response.set("item", item);
  const kept = placeholder.asked === undefined ? undefined : item.rendering(placeholder.asked);
  const at = text.indexOf(marker);
  // A renderer that did not ask for the item as a fragment: render it whole.
  if (kept === undefined || at < 0) return render(response);
  if (typeof kept === "string") return text.slice(0, at) + kept + text.slice(at + marker.length);
  // Decoding the bytes to join them as text, for Node to encode again, costs more than one Buffer.
  return Buffer.concat([Buffer.from(text.slice(0, at), "utf8"), kept, Buffer.from(text.slice(at + marker.length), "utf8")]);
}

export function isLegacyFormat(name: string): name is LegacyFormatName {
  return Object.hasOwn(legacyFormats, name);
}
