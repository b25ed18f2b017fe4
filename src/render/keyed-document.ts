import { randomBytes } from "node:crypto";
import type { LegacyStatusKey } from "../contract/legacy-layout.ts";
import type { StatusBlock } from "../gen/gateway/catalogue/v1/status_pb.js";
import { statusValue } from "./legacy-response.ts";
import { PhpFragment, PhpPlaceholder, type PhpValue } from "./php-value.ts";

/**
 * A legacy response as one format writes it at the top level, key by key:
 * `open(count)`, each key with its value (`entry`) with `between` between
 * two, then `close(count)`. Every format's entry at the top level depends
 * only on its key and value (not on what came before it), so the text of a
 * status key whose value has not changed since the last call can be written
 * again as it is (statusKeyWriter), and a cached item's kept rendering put
 * between the rest (itemSplice).
 */
export interface KeyedDocument {
  open(count: number): string;
  readonly between: string;
  close(count: number): string;
  /** One key and its value, as the format writes them at the top level. */
  entry(key: string, value: PhpValue): string;
}

const nothing = Symbol("nothing");

/**
 * The writer of one status key's entry: the text of
 * `document.entry(key, statusValue(key, s))`. Most of a hit's status is the
 * same call after call (the entry's cache token and date, the empty error,
 * the caller's arguments), so the writer remembers the text of its last
 * value and writes it again when the value is the same, rather than
 * building and escaping it again. `call_args` and `language`, which
 * statusValue makes into new maps, are compared by the block's own fields.
 */
export function statusKeyWriter(key: LegacyStatusKey, document: KeyedDocument): (s: StatusBlock) => string {
  const text = (s: StatusBlock) => document.entry(key, statusValue(key, s));
  let lastText = "";
  if (key === "call_args") {
    // The last arguments written, as name, value, name, value…; none before the first.
    let last: string[] | undefined;
    return (s) => {
      if (last === undefined || !sameEntries(last, s.callArgs)) {
        last = Object.entries(s.callArgs).flat();
        lastText = text(s);
      }
      return lastText;
    };
  }
  if (key === "language") {
    let last: readonly [string, string] | undefined;
    return (s) => {
      const current = s.language?.currentLang ?? "";
      const source = s.language?.sourceLang ?? "";
      if (last === undefined || last[0] !== current || last[1] !== source) {
        last = [current, source];
        lastText = text(s);
      }
      return lastText;
    };
  }
  // The last value written (a string or number: the values === compares by value).
  let last: unknown = nothing;
  return (s) => {
    const v = statusValue(key, s);
    if (v === last) return lastText;
    const t = document.entry(key, v);
    if (typeof v === "string" || typeof v === "number") {
      last = v;
      lastText = t;
    }
    return t;
  };
}

/** Whether a record holds the same entries, in the same order, as `entries` (name, value, name, value…). */
function sameEntries(entries: readonly string[], record: Readonly<Record<string, string>>): boolean {
  let n = 0;
  for (const name in record) {
    if (entries[n] !== name || entries[n + 1] !== record[name]) return false;
    n += 2;
  }
  return n === entries.length;
}

/** One key of a layout as a document writes it: the text before it (`open` or `between`), and its entry's writer (none for `item`). */
export interface KeyStep {
  readonly prefix: string;
  readonly write: ((s: StatusBlock) => string) | undefined;
}

/** Each document's steps, per layout: made once each. */
const plans = new WeakMap<KeyedDocument, Map<readonly string[], readonly KeyStep[]>>();

/** A layout's keys as `document` writes them, in order. */
export function keySteps(document: KeyedDocument, layout: readonly (LegacyStatusKey | "item")[]): readonly KeyStep[] {
  let byLayout = plans.get(document);
  if (byLayout === undefined) plans.set(document, (byLayout = new Map()));
  let steps = byLayout.get(layout);
  if (steps === undefined) {
    steps = layout.map((key, i) => ({
      prefix: i === 0 ? document.open(layout.length) : document.between,
      write: key === "item" ? undefined : statusKeyWriter(key, document),
    }));
    byLayout.set(layout, steps);
  }
  return steps;
}

/** Unguessable, so no caller-supplied text can contain it. */
const marker = `\u0000gateway-item-${randomBytes(16).toString("hex")}\u0000`;

/**
 * How a document writes a fragment under `item`: the text before the
 * fragment's rendering, the rendering's name (the one the format keeps it
 * under: json, `xml:item`, `var_export:3`…), the text after.
 */
export interface ItemSplice {
  readonly before: string;
  readonly name: string;
  readonly after: string;
}

const splices = new WeakMap<KeyedDocument, ItemSplice | null>();

/**
 * The document's `item` entry split around its fragment, found once by
 * writing the entry of a placeholder; none when the format does not write
 * a fragment through its kept renderings.
 */
export function itemSplice(document: KeyedDocument): ItemSplice | undefined {
  let splice = splices.get(document);
  if (splice === undefined) {
    const placeholder = new PhpPlaceholder(marker, new PhpFragment(null));
    const text = document.entry("item", placeholder);
    const at = text.indexOf(marker);
    splice = placeholder.asked === undefined || at < 0 ? null : { before: text.slice(0, at), name: placeholder.asked, after: text.slice(at + marker.length) };
    splices.set(document, splice);
  }
  return splice ?? undefined;
}

/**
 * A fragment's kept rendering as `document` writes it under `item` (made
 * and kept now if it is not yet), with the text around it.
 */
export function keptItem(document: KeyedDocument, fragment: PhpFragment): { readonly splice: ItemSplice; readonly bytes: Buffer } | undefined {
  const splice = itemSplice(document);
  if (splice === undefined) return undefined;
  let bytes = fragment.rendering(splice.name);
  if (bytes === undefined) {
    // Writing the entry makes the rendering and keeps it in the fragment.
    document.entry("item", fragment);
    bytes = fragment.rendering(splice.name);
  }
  return bytes === undefined ? undefined : { splice, bytes };
}
