import type { TargetLanguage, TranslationEngine } from "../core/translation.ts";

export interface LibreTranslateOptions {
  /** Base URL of a LibreTranslate-compatible server. */
  readonly url: string;
  readonly apiKey: string;
  /** The server's code for the source language (LibreTranslate: "zh"). */
  readonly source: string;
  readonly timeoutMs: number;
  /** Requests in flight at once; more wait their turn. */
  readonly concurrency: number;
}

export const defaultLibreTranslateOptions: Omit<LibreTranslateOptions, "url"> = {
  apiKey: "",
  source: "zh",
  timeoutMs: 2000,
  concurrency: 4,
};

/**
 * A self-hosted LibreTranslate-compatible server: every segment of one
 * response in one `POST /translate` batch, under a timeout and a cap on
 * requests in flight. Failures throw; the translator answers untranslated.
 */
export class LibreTranslateEngine implements TranslationEngine {
  readonly label = "libretranslate";
  private readonly options: LibreTranslateOptions;
  private running = 0;
  private readonly waiting: (() => void)[] = [];

  constructor(options: Partial<LibreTranslateOptions> & Pick<LibreTranslateOptions, "url">) {
    this.options = { ...defaultLibreTranslateOptions, ...options };
  }

  async translate(segments: readonly string[], target: TargetLanguage, signal: AbortSignal): Promise<{ texts: string[]; partial: ReadonlySet<number> }> {
    await this.slot();
    try {
      const res = await fetch(new URL("translate", this.options.url.endsWith("/") ? this.options.url : `${this.options.url}/`), {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ q: segments, source: this.options.source, target, format: "text", ...(this.options.apiKey ? { api_key: this.options.apiKey } : {}) }),
        signal: AbortSignal.any([signal, AbortSignal.timeout(this.options.timeoutMs)]),
      });
      if (!res.ok) throw new Error(`the translation server answered HTTP ${res.status}`);
      const body = (await res.json()) as { translatedText?: unknown };
      const texts = body.translatedText;
      if (!Array.isArray(texts) || texts.length !== segments.length || !texts.every((t) => typeof t === "string")) {
        throw new Error("the translation server's answer does not hold one text per segment");
      }
      return { texts: texts as string[], partial: new Set() };
    } finally {
      this.release();
    }
  }

  private async slot(): Promise<void> {
    if (this.running < this.options.concurrency) {
      this.running++;
      return;
    }
    await new Promise<void>((resolve) => this.waiting.push(resolve));
  }

  private release(): void {
    const next = this.waiting.shift();
    if (next) next();
    else this.running--;
  }
}
