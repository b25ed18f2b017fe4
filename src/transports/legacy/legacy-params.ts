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

function readJsonBody(body: unknown, into: Map<string, string>): string | undefined {
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
