import { statfsSync, statSync } from "node:fs";

/** How much room the embedded store takes and has: what its two limits (GATEWAY_STORE_MAX_BYTES, GATEWAY_MIN_FREE_MB) are measured against. */
export interface StoreSpace {
  /** `gateway.db` itself: what the size cap counts. */
  readonly bytes: number;
  /** Its WAL, commits not yet copied into it: large while a long read (a backup, a report) holds checkpoints back. */
  readonly walBytes: number;
  /** Free space on the data directory's file system, as an unprivileged process may use it; undefined when it cannot be measured. */
  readonly freeBytes: number | undefined;
}

const sizeOf = (path: string) => {
  try {
    return statSync(path).size;
  } catch {
    return 0; // not there (yet): takes no room
  }
};

/** Measures the store at `dbPath` in `dataDir`: three system calls, cheap enough for every scrape. */
export function storeSpace(dbPath: string, dataDir: string): StoreSpace {
  let freeBytes: number | undefined;
  try {
    const fs = statfsSync(dataDir);
    freeBytes = fs.bavail * fs.bsize;
  } catch {
    freeBytes = undefined;
  }
  return { bytes: sizeOf(dbPath), walBytes: sizeOf(`${dbPath}-wal`), freeBytes };
}
