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

/** Each measure of `StoreSpace` on its own, one system call each: a metric reads only the one it shows. */
export type StoreMeasures = { readonly [K in keyof StoreSpace]: () => StoreSpace[K] };

const sizeOf = (path: string) => {
  try {
    return statSync(path).size;
  } catch {
    return 0; // not there (yet): takes no room
  }
};

/** Free space on the file system of `dir`, as an unprivileged process may use it; undefined when it cannot be measured. */
export function freeBytes(dir: string): number | undefined {
  try {
    const fs = statfsSync(dir);
    return fs.bavail * fs.bsize;
  } catch {
    return undefined;
  }
}

/** The measures of the store at `dbPath` in `dataDir`. */
export function storeMeasures(dbPath: string, dataDir: string): StoreMeasures {
  return {
    bytes: () => sizeOf(dbPath),
    walBytes: () => sizeOf(`${dbPath}-wal`),
    freeBytes: () => freeBytes(dataDir),
  };
}

/** The store at `dbPath` in `dataDir`, measured now. */
export function storeSpace(dbPath: string, dataDir: string): StoreSpace {
  const m = storeMeasures(dbPath, dataDir);
  return { bytes: m.bytes(), walBytes: m.walBytes(), freeBytes: m.freeBytes() };
}
