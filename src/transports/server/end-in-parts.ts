import type { ServerResponse } from "node:http";

/**
 * Ends a response whose head is set (`writeHead`) with a body kept in
 * parts (a cached item's bytes and a call's own text around or after
 * them), corked, so the headers and every part leave in one write and no
 * part is copied into a joined block first.
 */
export function endInParts(res: ServerResponse, parts: readonly (string | Uint8Array)[]): void {
  res.cork();
  for (let i = 0; i < parts.length - 1; i++) res.write(parts[i]);
  res.end(parts.at(-1));
  res.uncork();
}
