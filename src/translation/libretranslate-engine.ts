import type { TargetLanguage, TranslationEngine } from "../core/translation.ts";

export interface LibreTranslateOptions {
  /** Base URL of a LibreTranslate-compatible server. */
  readonly url: string;
  readonly apiKey: string;
  /** The server's code for the source language (LibreTranslate: "zh"). */
  readonly source: string;
  /** Limit of one translation, its wait for a place among the requests in flight included. */
  readonly timeoutMs: number;
  /** Requests in flight at once; more wait their turn, within their limit. */
  readonly concurrency: number;
}

export const defaultLibreTranslateOptions: Omit<LibreTranslateOptions, "url"> = {
  apiKey: "",
  source: "zh",
  timeoutMs: 2000,
  concurrency: 4,
};

/** The longest translation taken of a text: longer, and the server's answer is not one (it would be cached, and remembered). */
function longestTranslation(source: string): number {
  return 16 * source.length + 256;
}

/**
 * A self-hosted LibreTranslate-compatible server: every segment of one
 * response in one `POST /translate` batch, under a cap on requests in flight
 * and one time limit for the whole translation, the wait for a place among
 * them included. Its answer is read as it comes and never past what the
 * segments could translate to (`longestTranslation`, each character escaped
 * in JSON). Failures throw; the translator answers untranslated.
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
    const until = performance.now() + this.options.timeoutMs;
    const limit = AbortSignal.any([signal, AbortSignal.timeout(this.options.timeoutMs)]);
    await this.slot(limit);
    // A place that came free at the very end of the limit (a request in flight timed out, and this one's own timer, due in
    // the same moment, has not run yet) is given on: a request sent now would be cut off before any answer could come.
    if (until - performance.now() < leastTimeToAskMs) {
      this.release();
      throw new Error(this.noPlace());
    }
    try {
      const res = await fetch(new URL("translate", this.options.url.endsWith("/") ? this.options.url : `${this.options.url}/`), {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ q: segments, source: this.options.source, target, format: "text", ...(this.options.apiKey ? { api_key: this.options.apiKey } : {}) }),
        signal: limit,
      });
      if (!res.ok) {
        await res.body?.cancel();
        throw new Error(`the translation server answered HTTP ${res.status}`);
      }
      const most = 1024 + 6 * segments.reduce((n, s) => n + longestTranslation(s), 0);
      const body = JSON.parse(await readAtMost(res, most)) as { translatedText?: unknown };
      const texts = body.translatedText;
      if (!Array.isArray(texts) || texts.length !== segments.length || !texts.every((t, i) => typeof t === "string" && t.length <= longestTranslation(segments[i]!))) {
        throw new Error("the translation server's answer does not hold one text per segment");
      }
      return { texts: texts as string[], partial: new Set() };
    } finally {
      this.release();
    }
  }

  /** A place among the requests in flight, waited for until `limit` ends (then the translation fails, having sent nothing). */
  private async slot(limit: AbortSignal): Promise<void> {
    if (this.running < this.options.concurrency) {
      this.running++;
      return;
    }
    limit.throwIfAborted();
    await new Promise<void>((resolve, reject) => {
      const waiter = () => {
        limit.removeEventListener("abort", giveUp);
        resolve();
      };
      const giveUp = () => {
        const at = this.waiting.indexOf(waiter);
        if (at >= 0) this.waiting.splice(at, 1);
        reject(new Error(this.noPlace()));
      };
      this.waiting.push(waiter);
      limit.addEventListener("abort", giveUp, { once: true });
    });
  }

  private noPlace(): string {
    return `no place among the ${this.options.concurrency} translation requests in flight came free in time`;
  }

  private release(): void {
    const next = this.waiting.shift();
    if (next) next();
    else this.running--;
  }
}

/** The least time left for which a translation request is sent: less cannot see an answer. */
const leastTimeToAskMs = 10;

/** A response's body as text, refused (and its connection dropped) once it is longer than `most` bytes. */
async function readAtMost(res: Response, most: number): Promise<string> {
  const chunks: Uint8Array[] = [];
  let size = 0;
  for await (const chunk of res.body ?? []) {
    size += chunk.length;
    // Leaving the loop cancels the body, which drops its connection.
    if (size > most) {
      throw new Error(`the translation server's answer is longer than its segments could translate to (${most} bytes)`);
    }
    chunks.push(chunk);
  }
  return Buffer.concat(chunks, size).toString("utf8");
}
