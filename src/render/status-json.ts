import type { LegacyStatusKey } from "../contract/legacy-layout.ts";
import type { StatusBlock } from "../gen/gateway/catalogue/v1/status_pb.js";
import { statusValue } from "./legacy-response.ts";
import { jsonKey, phpJsonEncode, type PhpJsonOptions } from "./php-json.ts";

const nothing = Symbol("nothing");

/**
 * The writer of one key's value of the status block as json and jsonu write
 * it: the text of `phpJsonEncode(statusValue(key, s))`. Most of a hit's
 * status is the same call after call (the entry's cache token and date, the
 * empty error, the caller's arguments), so the writer remembers the text of
 * its last value and writes it again when the value is the same, rather
 * than building and escaping it again. `call_args` and `language`, which
 * statusValue makes into new maps, are compared by the block's own fields.
 */
export function statusJsonWriter(key: LegacyStatusKey, options: PhpJsonOptions): (s: StatusBlock) => string {
  const text = (s: StatusBlock) => phpJsonEncode(statusValue(key, s), options);
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
    const t = phpJsonEncode(v, options);
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

/** One key of a layout as json writes it: `"key":`, after `{` or `,`, and its value's writer (none for `item`). */
export interface JsonKeyStep {
  readonly prefix: string;
  readonly write: ((s: StatusBlock) => string) | undefined;
}

/** Each layout's steps, per json option: made once each. */
const plans = { escaped: new Map<readonly string[], readonly JsonKeyStep[]>(), unescaped: new Map<readonly string[], readonly JsonKeyStep[]>() };

/** A layout's keys as json (or jsonu) writes them, in order. */
export function jsonKeySteps(layout: readonly (LegacyStatusKey | "item")[], options: PhpJsonOptions): readonly JsonKeyStep[] {
  const byLayout = options.unescapedUnicode ? plans.unescaped : plans.escaped;
  let steps = byLayout.get(layout);
  if (steps === undefined) {
    steps = layout.map((key, i) => ({ prefix: (i === 0 ? "{" : ",") + jsonKey(key, options), write: key === "item" ? undefined : statusJsonWriter(key, options) }));
    byLayout.set(layout, steps);
  }
  return steps;
}
