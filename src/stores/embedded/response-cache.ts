import { LRUCache } from "lru-cache";
import type { CacheEntry, ResponseCache } from "../../core/response-cache.ts";

/** The cache bound when none is given. */
export const defaultCacheMaxBytes = 64 * 1_048_576;

/**
 * The embedded response cache: least recently used entries go first once
 * the entries' bytes pass the bound. Entries are kept until their stale
 * bound, so an expired answer can still stand in for a failing source.
 */
export class MemoryCache implements ResponseCache {
  private readonly lru: LRUCache<string, CacheEntry>;
  private readonly now: () => number;

  constructor(maxBytes: number, now: () => number = Date.now) {
    this.now = now;
    this.lru = new LRUCache<string, CacheEntry>({ maxSize: maxBytes, sizeCalculation: (e) => Math.max(1, e.bytes) });
  }

  async get(key: string): Promise<CacheEntry | undefined> {
    const entry = this.lru.get(key);
    if (entry !== undefined && entry.staleUntil <= this.now()) {
      this.lru.delete(key);
      return undefined;
    }
    return entry;
  }

  set(key: string, entry: CacheEntry): void {
    this.lru.set(key, entry);
  }

  get bytes(): number {
    return this.lru.calculatedSize;
  }
}
