import { readFileSync } from "node:fs";

let version: string | undefined;

/** This gateway's version, from its package.json: what `/openapi.json` and the spans' resource name. */
export function packageVersion(): string {
  version ??= (JSON.parse(readFileSync(new URL("../package.json", import.meta.url), "utf8")) as { version: string }).version;
  return version;
}
