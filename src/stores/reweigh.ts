import type { LRUCache } from "lru-cache";
import type { CacheEntry } from "../core/response-cache.ts";

/**
 * Keeps an entry of an in-process LRU weighed by what it holds as renderings
 * are memoised for it (EntryMemo.onGrow), so growth may push older entries
 * out. lru-cache re-weighs a key only when it is set anew, not when the same
 * value is set again: the entry is deleted and set again, with the time to
 * live it had left (none, in a cache without one).
 */
export function reweighOnGrowth(lru: LRUCache<string, CacheEntry>, key: string, entry: CacheEntry): void {
  entry.memo.onGrow = () => {
    if (lru.peek(key) !== entry) return;
    const ttl = lru.getRemainingTTL(key);
    lru.delete(key);
    if (ttl === Infinity) lru.set(key, entry);
    else if (ttl > 0) lru.set(key, entry, { ttl });
  };
}
