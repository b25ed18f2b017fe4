import type { Outcome } from "../core/gateway.ts";
import { keptItem, keySteps, type KeyedDocument } from "./keyed-document.ts";
import { legacyKeys, legacyValue } from "./legacy-response.ts";
import { jsonDocument, phpJsonEncode } from "./php-json.ts";
import { phpSerialize, serializeDocument } from "./php-serialize.ts";
import { PhpFragment, type PhpMap } from "./php-value.ts";
import { phpVarExport, varExportDocument } from "./php-var-export.ts";
import { legacyXml, xmlDocument } from "./legacy-xml.ts";

export interface LegacyFormat {
  readonly contentType: string;
  /** The response's text. */
  render(response: PhpMap): string;
  /** The same text, written key by key (renderOutcome, renderLegacy). */
  readonly document: KeyedDocument;
}

const escaped = { unescapedUnicode: false } as const;
const unescaped = { unescapedUnicode: true } as const;

/** Every legacy `result_type`, each rendered from the same PHP value of the response. */
export const legacyFormats = {
  json: { contentType: "application/json; charset=utf-8", render: (r) => phpJsonEncode(r, escaped), document: jsonDocument(escaped) },
  jsonu: { contentType: "application/json; charset=utf-8", render: (r) => phpJsonEncode(r, unescaped), document: jsonDocument(unescaped) },
  xml: { contentType: "application/xml; charset=utf-8", render: legacyXml, document: xmlDocument },
  serialize: { contentType: "text/plain; charset=utf-8", render: phpSerialize, document: serializeDocument },
  var_export: { contentType: "text/plain; charset=utf-8", render: phpVarExport, document: varExportDocument },
} as const satisfies Record<string, LegacyFormat>;

export type LegacyFormatName = keyof typeof legacyFormats;

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
 * A response rendered key by key: the same text as the format's render.
 * Its `item`, when a cached fragment, is that fragment's kept rendering
 * (made on first use in this format, kept for the next, as bytes) between
 * the text of the rest, so a cache hit encodes only the status block: a
 * SplicedBody.
 */
export function renderLegacy(format: LegacyFormatName, response: PhpMap): LegacyBody {
  const document = legacyFormats[format].document;
  const text = new Spliced();
  let i = 0;
  for (const [key, value] of response) {
    text.add(i++ === 0 ? document.open(response.size) : document.between);
    if (key !== "item" || !(value instanceof PhpFragment) || !text.splice(document, value)) text.add(document.entry(key, value));
  }
  text.add(document.close(response.size));
  return text.body();
}

export function isLegacyFormat(name: string): name is LegacyFormatName {
  return Object.hasOwn(legacyFormats, name);
}

/** Text, and at most one block of an item's kept bytes in it. */
class Spliced {
  private text = "";
  private head: string | undefined;
  private item: Buffer | undefined;

  add(text: string): void {
    this.text += text;
  }

  /** Puts in the fragment's kept rendering; false when the format keeps none. */
  splice(document: KeyedDocument, fragment: PhpFragment): boolean {
    if (this.item !== undefined) return false;
    const kept = keptItem(document, fragment);
    if (kept === undefined) return false;
    this.head = this.text + kept.splice.before;
    this.item = kept.bytes;
    this.text = kept.splice.after;
    return true;
  }

  body(): LegacyBody {
    return this.item === undefined ? this.text : { head: this.head!, item: this.item, tail: this.text };
  }
}

/**
 * An outcome rendered in a legacy format, key by key: the same text as
 * rendering legacyResponse(outcome), each status key's entry written as the
 * format writes it, or again as it was written last time when its value is
 * the same (keySteps), without the response's PHP map in between. A cached
 * item is its kept bytes (a SplicedBody). A json hit's status cost about
 * 0.7 µs of a 26 µs call this way, against the map's.
 */
export function renderOutcome(format: LegacyFormatName, outcome: Outcome): LegacyBody {
  const document = legacyFormats[format].document;
  const status = outcome.status;
  const text = new Spliced();
  const keys = legacyKeys(outcome);
  for (const step of keySteps(document, keys)) {
    text.add(step.prefix);
    if (step.write !== undefined) {
      text.add(step.write(status));
      continue;
    }
    const value = legacyValue(outcome, "item");
    if (!(value instanceof PhpFragment) || !text.splice(document, value)) text.add(document.entry("item", value));
  }
  text.add(document.close(keys.length));
  return text.body();
}
