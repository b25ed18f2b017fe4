import { clone } from "@bufbuild/protobuf";
import { LRUCache } from "lru-cache";
import { ItemDetailSchema, type ItemDetail } from "../gen/gateway/catalogue/v1/retail_pb.js";
import { PeerViewedItemSchema, type PeerViewedItem } from "../gen/gateway/catalogue/v1/wholesale_pb.js";

export type TargetLanguage = "en" | "ru";

/** A translation service: the built-in glossary, or an HTTP engine. */
export interface TranslationEngine {
  /** Reported as `translate_engine`. */
  readonly label: string;
  /**
   * The segments translated, in order. `partial` lists the segments the
   * engine could not fully translate (left as they were where not covered).
   * Throws when the engine fails.
   */
  translate(segments: readonly string[], target: TargetLanguage, signal: AbortSignal): Promise<{ texts: string[]; partial: ReadonlySet<number> }>;
}

/** How a translation went: `""` fine, `"partial"` some text left untranslated, `"error"` the engine failed. */
export interface TranslationReport {
  readonly status: "" | "partial" | "error";
  readonly engine: string;
  readonly seconds: number;
}

const han = /\p{Script=Han}/u;

/** Splits `a:b:c` into its first `n - 1` parts and the rest. */
function parts(text: string, separator: string, n: number): string[] {
  const all = text.split(separator);
  return all.length <= n ? all : [...all.slice(0, n - 1), all.slice(n - 1).join(separator)];
}

/**
 * Translates the text of records and nothing else: titles, property names and
 * values, aliases, SKU property names, the shop title and the location.
 * Numbers, ids, URLs and `<pid>:<vid>` codes are never touched, and the
 * `;`/`:`/`,` structure of the compound fields is rebuilt exactly. Records
 * are copied, never changed (cached records are shared). Translated segments
 * are kept in a translation memory, so each text goes to the engine once.
 */
export class Translator {
  private readonly engine: TranslationEngine | undefined;
  private readonly memory: LRUCache<string, string>;

  constructor(engine: TranslationEngine | undefined, memoryEntries = 50_000) {
    this.engine = engine;
    this.memory = new LRUCache({ max: memoryEntries });
  }

  get label(): string {
    return this.engine?.label ?? "";
  }

  itemDetail(item: ItemDetail, target: TargetLanguage, signal: AbortSignal): Promise<{ value: ItemDetail; report: TranslationReport }> {
    return this.run(target, signal, (t) => {
      const out = clone(ItemDetailSchema, item);
      const entries = (text: string, translatable: number[]) =>
        text
          .split(";")
          .map((entry) => {
            const p = parts(entry, ":", Math.max(...translatable) + 1);
            return p.map((x, i) => (translatable.includes(i) ? t(x) : x)).join(":");
          })
          .join(";");
      out.title = t(item.title);
      out.location = t(item.location);
      if (out.sellerInfo) out.sellerInfo.title = t(out.sellerInfo.title);
      for (const prop of out.props) {
        prop.name = t(prop.name);
        prop.value = prop.value.split(",").map(t).join(",");
      }
      out.propsName = item.propsName === "" ? "" : entries(item.propsName, [2, 3]);
      out.propertyAlias = item.propertyAlias === "" ? "" : entries(item.propertyAlias, [2]);
      for (const code of Object.keys(out.propsList)) out.propsList[code] = parts(out.propsList[code]!, ":", 2).map(t).join(":");
      for (const sku of out.skus?.sku ?? []) sku.propertiesName = sku.propertiesName === "" ? "" : entries(sku.propertiesName, [2, 3]);
      return out;
    });
  }

  peerViewed(items: readonly PeerViewedItem[], target: TargetLanguage, signal: AbortSignal): Promise<{ value: PeerViewedItem[]; report: TranslationReport }> {
    return this.run(target, signal, (t) =>
      items.map((i) => {
        const out = clone(PeerViewedItemSchema, i);
        out.title = t(i.title);
        return out;
      }),
    );
  }

  /**
   * Runs `build` twice: once to learn which texts it asks for, then, after one
   * engine call for the ones not in memory, to build the result with them.
   */
  private async run<T>(target: TargetLanguage, signal: AbortSignal, build: (t: (text: string) => string) => T): Promise<{ value: T; report: TranslationReport }> {
    const started = performance.now();
    const label = this.label;
    const key = (text: string) => `${label}\u0000${target}\u0000${text}`;
    const wanted = new Set<string>();
    const untranslated = build((text) => {
      if (han.test(text) && !this.memory.has(key(text))) wanted.add(text);
      return text;
    });
    let status: TranslationReport["status"] = "";
    const fresh = new Map<string, string>();
    if (wanted.size > 0) {
      if (this.engine === undefined) return { value: untranslated, report: { status: "error", engine: "", seconds: 0 } };
      const segments = [...wanted];
      try {
        const { texts, partial } = await this.engine.translate(segments, target, signal);
        segments.forEach((s, i) => {
          fresh.set(s, texts[i] ?? s);
          if (partial.has(i)) status = "partial";
          this.memory.set(key(s), texts[i] ?? s);
        });
      } catch {
        return { value: untranslated, report: { status: "error", engine: label, seconds: (performance.now() - started) / 1000 } };
      }
    }
    const value = build((text) => {
      if (!han.test(text)) return text;
      const done = fresh.get(text) ?? this.memory.get(key(text)) ?? text;
      if (han.test(done)) status = "partial";
      return done;
    });
    return { value, report: { status, engine: label, seconds: (performance.now() - started) / 1000 } };
  }
}
