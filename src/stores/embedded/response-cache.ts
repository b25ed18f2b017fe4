import { LRUCache } from "lru-cache";
import { weight, type CacheEntry, type ResponseCache } from "../../core/response-cache.ts";

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

  async get(key: string): Promise<CacheEntry | undefined> {
    const entry = this.lru.get(key);
    if (entry !== undefined && entry.staleUntil <= this.now()) {
      this.lru.delete(key);
      return undefined;
    }
    return entry;
  }

  set(key: string, entry: CacheEntry): void {
    // A rendering memoised later weighs the entry again (and may push older entries out);
    // lru-cache re-weighs a key only when it is set anew, not when the same value is set again.
    entry.memo.onGrow = () => {
      if (this.lru.peek(key) !== entry) return;
      this.lru.delete(key);
      this.lru.set(key, entry);
    };
    this.lru.set(key, entry);
  }

  get bytes(): number {
    return this.lru.calculatedSize;
  }
}
