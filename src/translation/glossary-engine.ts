import type { TargetLanguage, TranslationEngine } from "../core/translation.ts";
import { glossaryTerms } from "./glossary-terms.ts";

const punctuation: Record<string, string> = { "【": "[", "】": "]", "，": ",", "。": ".", "：": ":", "；": ";", "（": "(", "）": ")", "、": ",", "！": "!", "“": '"', "”": '"' };
const han = /\p{Script=Han}/u;

/**
 * The built-in engine: the bundled glossary applied term by term, longest
 * term first, with no network. Text it does not cover stays as it was, and
 * the segment is reported as partly translated.
 */
export class GlossaryEngine implements TranslationEngine {
  readonly label = "glossary";
  private readonly longest: number;

  constructor() {
    this.longest = Math.max(...Object.keys(glossaryTerms).map((t) => [...t].length));
  }

  async translate(segments: readonly string[], target: TargetLanguage): Promise<{ texts: string[]; partial: ReadonlySet<number> }> {
    const partial = new Set<number>();
    const texts = segments.map((s, i) => {
      const { text, covered } = this.one(s, target);
      if (!covered) partial.add(i);
      return text;
    });
    return { texts, partial };
  }

  private one(segment: string, target: TargetLanguage): { text: string; covered: boolean } {
    const chars = [...segment];
    const words: string[] = [];
    let raw = "";
    let covered = true;
    const flush = () => {
      if (raw.trim() !== "") words.push(raw.trim());
      raw = "";
    };
    for (let i = 0; i < chars.length; ) {
      let matched = false;
      for (let n = Math.min(this.longest, chars.length - i); n > 0; n--) {
        const term = glossaryTerms[chars.slice(i, i + n).join("")];
        if (term !== undefined) {
          flush();
          words.push(term[target]);
          i += n;
          matched = true;
          break;
        }
      }
      if (matched) continue;
      const c = chars[i]!;
      if (punctuation[c] !== undefined) {
        flush();
        words.push(punctuation[c]);
      } else {
        if (han.test(c)) covered = false;
        raw += c;
      }
      i++;
    }
    flush();
    const text = words.join(" ").replace(/ ([,.;:!)\]])/g, "$1").replace(/([([]) /g, "$1");
    return { text, covered };
  }
}
