/** The parameters of a legacy call, and what is wrong with their form, if anything. */
export interface LegacyParams {
  get(name: string): string | undefined;
  /** Every parameter, as received (for the legacy signature). */
  all(): Record<string, string>;
  /** Set when the parameters cannot be read unambiguously: answered 4003. */
  readonly problem: string | undefined;
}

/** Parameters that may come from the query string and the body, the query winning. */
const credentials = new Set(["key", "secret"]);

function short(name: string): string {
  return name.slice(0, 40);
}

/** Reads `a=1&b=2`, refusing names that repeat or use PHP's array form (`num_iid[]=…`). */
function readPairs(pairs: Iterable<[string, string]>, into: Map<string, string>): string | undefined {
  for (const [name, value] of pairs) {
    if (into.has(name)) return `parameter ${short(name)} is given more than once`;
    if (name.includes("[")) return `parameter ${short(name)} uses the array form; give it once, as a plain value`;
    into.set(name, value);
  }
  return undefined;
}

/**
 * A JSON body that gives a name twice, as its parser hands it on: a JSON
 * parser keeps the last, where the query string refuses the repeat, and a
 * gateway that bills per call must not pick one of two item ids either way.
 */
export class RepeatedJsonName {
  readonly name: string;
  constructor(name: string) {
    this.name = name;
  }
}

/**
 * The first name a JSON object's text gives twice at its top level, or
 * undefined: none repeats, or the text is not an object (the JSON parser
 * then says what is wrong with it). A name is compared as the parser reads
 * it, escapes decoded (`"k\u0065y"` is `key`). Linear in the text.
 */
export function repeatedJsonName(text: string): string | undefined {
  let i = 0;
  const space = () => {
    while (i < text.length && (text[i] === " " || text[i] === "\t" || text[i] === "\n" || text[i] === "\r")) i++;
  };
  /** Past a string that starts at i: its text with the quotes, or undefined where it does not end. */
  const string = (): string | undefined => {
    const start = i++;
    while (i < text.length) {
      const c = text[i];
      if (c === "\\") i += 2;
      else if (c === '"') return text.slice(start, ++i);
      else i++;
    }
    return undefined;
  };
  space();
  if (text[i] !== "{") return undefined;
  i++;
  const seen = new Set<string>();
  for (;;) {
    space();
    if (text[i] !== '"') return undefined; // `}`: the end; anything else the parser refuses
    const quoted = string();
    if (quoted === undefined) return undefined;
    let name: string;
    try {
      name = JSON.parse(quoted) as string;
    } catch {
      return undefined;
    }
    if (seen.has(name)) return name;
    seen.add(name);
    space();
    if (text[i] !== ":") return undefined;
    i++;
    // Past the value: a string whole, brackets counted, up to the comma or brace that ends it.
    let depth = 0;
    while (i < text.length) {
      const c = text[i];
      if (c === '"') {
        if (string() === undefined) return undefined;
        continue;
      }
      if (c === "{" || c === "[") depth++;
      else if (c === "}" || c === "]") {
        if (depth === 0) break;
        depth--;
      } else if (c === "," && depth === 0) break;
      i++;
    }
    if (text[i] !== ",") return undefined;
    i++;
  }
}

function readJsonBody(body: unknown, into: Map<string, string>): string | undefined {
  if (body instanceof RepeatedJsonName) return `parameter ${short(body.name)} is given more than once`;
  if (typeof body !== "object" || body === null || Array.isArray(body)) return "the JSON body must be an object of parameters";
  for (const [name, value] of Object.entries(body)) {
    if (typeof value === "string") into.set(name, value);
    else if (typeof value === "number" && Number.isSafeInteger(value)) into.set(name, String(value));
    else return `parameter ${short(name)} in the JSON body must be a string`;
  }
  return undefined;
}

/**
 * The parameters of a legacy request: the query string, and for POST the
 * body (a parsed JSON object or a form-encoded string). `key` and `secret`
 * in the query win over the body; any other name given in both places with
 * different values is refused rather than guessed at, because a gateway that
 * bills per call must not pick one of two item ids.
 */
export function legacyParams(url: string, body?: unknown): LegacyParams {
  const q = url.indexOf("?");
  const query = new Map<string, string>();
  let problem = q < 0 ? undefined : readPairs(new URLSearchParams(url.slice(q + 1)), query);
  // The query's own map, unless a body adds to it.
  let values = query;
  if (problem === undefined && body !== undefined && body !== null && body !== "") {
    values = new Map(query);
    const fromBody = new Map<string, string>();
    problem = typeof body === "string" ? readPairs(new URLSearchParams(body), fromBody) : readJsonBody(body, fromBody);
    for (const [name, value] of fromBody) {
      if (problem !== undefined) break;
      const inQuery = query.get(name);
      if (inQuery === undefined) values.set(name, value);
      else if (!credentials.has(name) && inQuery !== value) problem = `parameter ${short(name)} differs between the query string and the body`;
    }
  }
  return { get: (name) => values.get(name), all: () => Object.fromEntries(values), problem };
}
