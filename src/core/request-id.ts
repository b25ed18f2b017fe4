/**
 * Request ids in the legacy form: a node label, a dot, and a time-ordered hex
 * id (8 hex digits of Unix seconds, 5 of microseconds, like PHP's uniqid()).
 * Ids never repeat within a process: a clash moves on by one microsecond.
 */
export function createRequestIdGenerator(nodeLabel: string, now: () => number = Date.now): () => string {
  let last = 0;
  return () => {
    const micros = Math.max(Math.floor(now() * 1000), last + 1);
    last = micros;
    const seconds = Math.floor(micros / 1_000_000);
    const fraction = micros % 1_000_000;
    return `${nodeLabel}.${seconds.toString(16).padStart(8, "0")}${fraction.toString(16).padStart(5, "0")}`;
  };
}
