import { existsSync, readdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";

/**
 * libfaketime (Debian's `faketime`, which .ci/run installs) moving one
 * process's wall clock while it runs: `env` preloads it into a process and
 * points it at a file of the offset (`+0`, `-3600`), read again at every
 * clock read, so `set` steps the clock of a process already running.
 * `performance.now()` (CLOCK_MONOTONIC) is left alone, as a real clock
 * step leaves it.
 */
export function faketime(file: string): { readonly env: Record<string, string>; set(offsetSeconds: number): void } {
  const set = (offsetSeconds: number) => writeFileSync(file, `${offsetSeconds >= 0 ? "+" : ""}${offsetSeconds}\n`);
  set(0);
  return {
    env: { LD_PRELOAD: faketimeLibrary(), FAKETIME_TIMESTAMP_FILE: file, FAKETIME_NO_CACHE: "1", FAKETIME_DONT_FAKE_MONOTONIC: "1" },
    set,
  };
}

function faketimeLibrary(): string {
  for (const dir of readdirSync("/usr/lib")) {
    const path = join("/usr/lib", dir, "faketime", "libfaketime.so.1");
    if (existsSync(path)) return path;
  }
  throw new Error("libfaketime is not installed (Debian's faketime package; .ci/run installs it)");
}
