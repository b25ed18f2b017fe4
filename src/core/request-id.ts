/**
 * Request ids in the legacy form: a node label, a dot, and a time-ordered hex
 * id (8 hex digits of Unix seconds, 5 of microseconds, like PHP's uniqid()).
 * Ids never repeat: a clash moves on by one microsecond (the last one is kept
 * per node label for the whole process, so two generators cannot meet), and
 * a restarted process given the newest id already used (`after`) starts past
 * it even if the clock went back.
 */
const lastByLabel = new Map<string, number>();

export function createRequestIdGenerator(nodeLabel: string, now: () => number = Date.now, after?: string): () => string {
  const m = after === undefined ? null : /\.([0-9a-f]{8})([0-9a-f]{5})$/.exec(after);
  if (m !== null) {
    const resumed = Number.parseInt(m[1]!, 16) * 1_000_000 + Number.parseInt(m[2]!, 16);
    lastByLabel.set(nodeLabel, Math.max(lastByLabel.get(nodeLabel) ?? 0, resumed));
  }
  return () => {
    const micros = Math.max(Math.floor(now() * 1000), (lastByLabel.get(nodeLabel) ?? 0) + 1);
    lastByLabel.set(nodeLabel, micros);
    const seconds = Math.floor(micros / 1_000_000);
    const fraction = micros % 1_000_000;
    return `${nodeLabel}.${seconds.toString(16).padStart(8, "0")}${fraction.toString(16).padStart(5, "0")}`;
  };
}
