/** The query string of a legacy call, and what is wrong with its form, if anything. */
export interface LegacyQuery {
  get(name: string): string | undefined;
  /** Set when a name repeats or uses the array form (`num_iid[]=…`): answered 4003. */
  readonly problem: string | undefined;
}

/**
 * Reads the query of a request URL. Names that repeat or use PHP's array
 * syntax are refused rather than guessed at: a gateway that bills per call
 * must not pick one of two item ids.
 */
export function legacyQuery(url: string): LegacyQuery {
  const q = url.indexOf("?");
  const params = new URLSearchParams(q < 0 ? "" : url.slice(q + 1));
  const values = new Map<string, string>();
  let problem: string | undefined;
  for (const [name, value] of params) {
    if (problem !== undefined) break;
    if (values.has(name)) problem = `parameter ${name.slice(0, 40)} is given more than once`;
    else if (name.includes("[")) problem = `parameter ${name.slice(0, 40)} uses the array form; give it once, as a plain value`;
    else values.set(name, value);
  }
  return { get: (name) => values.get(name), problem };
}
