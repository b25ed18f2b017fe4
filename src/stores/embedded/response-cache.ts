import { LRUCache } from "lru-cache";
import { weight, type CacheEntry, type ResponseCache } from "../../core/response-cache.ts";
import { reweighOnGrowth } from "../reweigh.ts";

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
    this.lru = new LRUCache<string, CacheEntry>({ maxSize: maxBytes, sizeCalculation: weight });
  }

  get(key: string): CacheEntry | undefined {
    const entry = this.lru.get(key);
    if (entry !== undefined && entry.staleUntil <= this.now()) {
      this.lru.delete(key);
      return undefined;
    }
    return entry;
  }

  set(key: string, entry: CacheEntry): void {
    reweighOnGrowth(this.lru, key, entry);
    this.lru.set(key, entry);
  }

  get bytes(): number {
    return this.lru.calculatedSize;
  }

  purge(prefix: string): number {
    const keys = [...this.lru.keys()].filter((k) => k.startsWith(prefix));
    for (const k of keys) this.lru.delete(k);
    return keys.length;
  }
}
