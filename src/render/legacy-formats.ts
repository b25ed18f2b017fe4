import type { Outcome } from "../core/gateway.ts";
import { legacyKeys, legacyResponse, legacyValue } from "./legacy-response.ts";
import { phpJsonEncode, type PhpJsonOptions } from "./php-json.ts";
import { jsonKeySteps } from "./status-json.ts";
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
 * A rendered response: text (which is written as UTF-8, the bytes PHP
 * wrote), bytes, or a cached item's bytes with the text around them, the
 * three written one after the other: joining them would copy the item into
 * a new block every call (off-heap, which V8's collector then runs for at
 * the rate of cache hits: a serialize hit took 29-32 µs of CPU written in
 * parts against 39-51 joined, in alternating runs), or, as text, encode it
 * again on every write.
 */
export type LegacyBody = string | Buffer | SplicedBody;

/** The item's bytes between the text before and after it. */
export interface SplicedBody {
  readonly head: string;
  readonly item: Buffer;
  readonly tail: string;
}

export const isSpliced = (body: LegacyBody): body is SplicedBody => typeof body !== "string" && !Buffer.isBuffer(body);

/** The body's length in bytes, as written. */
export function bodyByteLength(body: LegacyBody): number {
  return isSpliced(body) ? Buffer.byteLength(body.head) + body.item.byteLength + Buffer.byteLength(body.tail) : Buffer.byteLength(body);
}

/** The body's parts in the order they are written (one, unless it is spliced). */
export const bodyParts = (body: LegacyBody): readonly (string | Buffer)[] => (isSpliced(body) ? [body.head, body.item, body.tail] : [body]);

/** The body as one string or one block of bytes (for compression, which takes one). */
export function joinedBody(body: LegacyBody): string | Buffer {
  return isSpliced(body) ? Buffer.concat(bodyParts(body).map((p) => (typeof p === "string" ? Buffer.from(p, "utf8") : p))) : body;
}

/**
 * The response rendered. When its item is a cached fragment, the rest is
 * rendered around a placeholder and the item's rendering (made on first use
 * in this format, kept for the next, as bytes) is put in its place, so a
 * cache hit encodes only the status block: a SplicedBody, the same bytes as
 * rendering the whole value.
 */
export function renderLegacy(format: LegacyFormatName, response: PhpMap): LegacyBody {
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
  return { head: text.slice(0, at), item: kept, tail: text.slice(at + marker.length) };
}

export function isLegacyFormat(name: string): name is LegacyFormatName {
  return Object.hasOwn(legacyFormats, name);
}

/**
 * An outcome in json or jsonu, written key by key: the same text as
 * phpJsonEncode(legacyResponse(outcome)), each value written as that
 * writes it, without the response's PHP map and the placeholder in between
 * (a hit renders only its status block, and those cost about 0.7 µs of a
 * 26 µs json hit in alternating runs). A cached item is its kept bytes (a
 * SplicedBody), as renderLegacy splices them.
 */
function renderJson(outcome: Outcome, options: PhpJsonOptions): LegacyBody {
  const status = outcome.status;
  let text = "";
  let head: string | undefined;
  let item: Buffer | undefined;
  for (const step of jsonKeySteps(legacyKeys(outcome), options)) {
    text += step.prefix;
    if (step.write !== undefined) {
      text += step.write(status);
      continue;
    }
    const value = legacyValue(outcome, "item");
    if (value instanceof PhpFragment) {
      // The rendering phpJsonEncode would make of the fragment, under the same name, kept as it keeps it.
      const name = options.unescapedUnicode ? "jsonu" : "json";
      value.prepare(name, () => phpJsonEncode(value.value, options));
      head = text;
      item = value.rendering(name)!;
      text = "";
    } else {
      text += phpJsonEncode(value, options);
    }
  }
  text += "}";
  return head === undefined || item === undefined ? text : { head, item, tail: text };
}

const escaped: PhpJsonOptions = { unescapedUnicode: false };
const unescaped: PhpJsonOptions = { unescapedUnicode: true };

/** An outcome rendered in a legacy format (json and jsonu written directly, the others from its PHP value). */
export function renderOutcome(format: LegacyFormatName, outcome: Outcome): LegacyBody {
  if (format === "json" || format === "jsonu") return renderJson(outcome, format === "json" ? escaped : unescaped);
  return renderLegacy(format, legacyResponse(outcome));
}
