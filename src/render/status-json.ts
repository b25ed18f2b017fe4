import type { LegacyStatusKey } from "../contract/legacy-layout.ts";
import type { StatusBlock } from "../gen/gateway/catalogue/v1/status_pb.js";
import { statusValue } from "./legacy-response.ts";
import { jsonKey, phpJsonEncode, phpJsonString, type PhpJsonOptions } from "./php-json.ts";

/**
 * The value of one key of the status block as json and jsonu write it: the
 * text of `phpJsonEncode(statusValue(key, s))`.
 * Most of a hit's status is the same call after call (the entry's cache
 * token and date, the empty error, the caller's arguments), so each key
 * remembers the text of its last value and writes it again when the value
 * is the same, rather than escaping it again. `call_args` and `language`
 * are written from the block's own fields, not from the PHP maps
 * statusValue makes of them, with the same text.
 */
export class StatusJsonKey {
  private readonly key: LegacyStatusKey;
  private readonly options: PhpJsonOptions;
  /** The last value written (a string or number: the values compared by ===), and its text. */
  private last: unknown = undefined;
  private lastText = "";
  /** call_args and language: the last values written (call_args as name, value, name, value…), none before the first. */
  private lastArgs: string[] | undefined = undefined;

  constructor(key: LegacyStatusKey, options: PhpJsonOptions) {
    this.key = key;
    this.options = options;
  }

  /** The value's text. */
  value(s: StatusBlock): string {
    if (this.key === "call_args") return this.callArgs(s.callArgs);
    if (this.key === "language") return this.language(s.language?.currentLang ?? "", s.language?.sourceLang ?? "");
    const v = statusValue(this.key, s);
    if (v === this.last) return this.lastText;
    const text = phpJsonEncode(v, this.options);
    if (typeof v === "string" || typeof v === "number") {
      this.last = v;
      this.lastText = text;
    }
    return text;
  }

  /** As phpJsonEncode writes the map of the arguments: `[]` when there are none (a PHP empty array). */
  private callArgs(args: Readonly<Record<string, string>>): string {
    const last = this.lastArgs;
    if (last !== undefined) {
      let n = 0;
      let same = true;
      for (const name in args) {
        if (same && (last[n] !== name || last[n + 1] !== args[name])) same = false;
        n += 2;
      }
      if (same && n === last.length) return this.lastText;
    }
    const pairs: string[] = [];
    let text = "";
    for (const name in args) {
      const value = args[name]!;
      pairs.push(name, value);
      text += (text === "" ? "{" : ",") + jsonKey(name, this.options) + phpJsonString(value, this.options);
    }
    text = text === "" ? "[]" : `${text}}`;
    this.lastArgs = pairs;
    this.lastText = text;
    return text;
  }

  private language(current: string, source: string): string {
    const last = this.lastArgs;
    if (last !== undefined && last[0] === current && last[1] === source) return this.lastText;
    this.lastArgs = [current, source];
    this.lastText = `{${jsonKey("current_lang", this.options)}${phpJsonString(current, this.options)},${jsonKey("source_lang", this.options)}${phpJsonString(source, this.options)}}`;
    return this.lastText;
  }
}

/** One key of a layout as json writes it: `"key":`, after `{` or `,`, and its value's writer (none for `item`). */
export interface JsonKeyStep {
  readonly prefix: string;
  readonly status: StatusJsonKey | undefined;
}

/** Each layout's steps, per json option: made once each. */
const plans = { escaped: new Map<readonly string[], readonly JsonKeyStep[]>(), unescaped: new Map<readonly string[], readonly JsonKeyStep[]>() };

/** A layout's keys as json (or jsonu) writes them, in order. */
export function jsonKeySteps(layout: readonly (LegacyStatusKey | "item")[], options: PhpJsonOptions): readonly JsonKeyStep[] {
  const byLayout = options.unescapedUnicode ? plans.unescaped : plans.escaped;
  let steps = byLayout.get(layout);
  if (steps === undefined) {
    steps = layout.map((key, i) => ({ prefix: (i === 0 ? "{" : ",") + jsonKey(key, options), status: key === "item" ? undefined : new StatusJsonKey(key, options) }));
    byLayout.set(layout, steps);
  }
  return steps;
}
