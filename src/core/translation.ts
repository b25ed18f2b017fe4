import { LRUCache } from "lru-cache";

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

/**
 * Translates the texts an operation's `translate` hands it and nothing else
 * (which texts, and how compound fields are rebuilt, is the operation's
 * business). Records are copied, never changed (cached records are shared).
 * Translated segments are kept in a translation memory, so each text goes
 * to the engine once.
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

  /**
   * A translated copy made by `build`, which passes every translatable text
   * through the function it is given (an operation's `translate`). `build`
   * runs twice: once to learn which texts it asks for, then, after one engine
   * call for the ones not in memory, to build the result with them.
   */
  async translate<T>(target: TargetLanguage, signal: AbortSignal, build: (t: (text: string) => string) => T): Promise<{ value: T; report: TranslationReport }> {
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
