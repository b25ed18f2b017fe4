import type { MaybeAsync } from "./maybe-async.ts";
import { retainedBytes } from "./retained-size.ts";

/**
 * What renderers worked out for one cache entry (the item already encoded
 * per legacy format, its protobuf bytes, …). It counts what it holds, and
 * tells its cache when it grows, so renderings added after an entry is
 * stored count against the cache's bound too.
 */
export class EntryMemo extends Map<string, unknown> {
  /** Bytes its values hold (retainedBytes). */
  bytes = 0;
  /** Called after every set; a bounded cache re-weighs the entry. */
  onGrow: (() => void) | undefined;

  override set(key: string, value: unknown): this {
    const before = super.get(key);
    super.set(key, value);
    this.grew(retainedBytes(value) - (before === undefined ? 0 : retainedBytes(before)));
    return this;
  }

  /** For a memoised value that keeps more as it is used (a fragment rendering itself per format): `bytes` more are held. */
  grew(bytes: number): void {
    this.bytes += bytes;
    this.onGrow?.();
  }
}

/** The bytes of an entry besides its memo: the entry object, its token and reason, the decoded answer. */
export function entryBytes(value: unknown, reason: string): number {
  return 208 + retainedBytes(reason) + retainedBytes(value);
}

/** One stored answer of a catalogue source. */
export interface CacheEntry<T = unknown> {
  /** The answer: a record, or null for a stored "no result" (2000). */
  readonly value: T | null;
  /** Reason of a stored "no result". */
  readonly reason: string;
  /** Unix seconds when it was stored. */
  readonly storedAt: number;
  /** 32 lowercase hex characters naming this entry. */
  readonly token: string;
  /** Unix milliseconds until which it is served as fresh. */
  readonly freshUntil: number;
  /** Unix milliseconds until which it may stand in for a failing source. */
  readonly staleUntil: number;
  /** Bytes it holds besides its memo (entryBytes): measured from the decoded answer, not guessed from the wire size. */
  readonly bytes: number;
  /** For a translated answer: how its translation went. */
  readonly translation?: { readonly status: "" | "partial"; readonly engine: string } | undefined;
  /**
   * What renderers worked out for this entry (e.g. the item already encoded
   * per legacy format), so a hit costs little more than the status block.
   */
  readonly memo: EntryMemo;
}

/** What an entry weighs against a cache's bound: itself and everything memoised for it so far. */
export function weight(entry: CacheEntry): number {
  return Math.max(1, entry.bytes + entry.memo.bytes);
}

/**
 * Where answers are kept between calls. The embedded adapter is an in-memory
 * LRU bounded in bytes; a shared (Redis) adapter can follow.
 */
export interface ResponseCache {
  /** On every call's path: answered at once where the entries are in this process (MaybeAsync). */
  get(key: string): MaybeAsync<CacheEntry | undefined>;
  /** Stores an entry; a remote adapter may write it after returning. */
  set(key: string, entry: CacheEntry): void;
  /** Bytes held now. */
  readonly bytes: number;
  /**
   * A cache shared by several replicas: takes, for at most `ms`, the right to
   * ask the source for `key`, so one replica buys an item while the others
   * wait for its entry. Resolves to a release, or to "held" when another
   * replica holds it. A cache of one process leaves this out.
   */
  claim?(key: string, ms: number): Promise<(() => Promise<void>) | "held">;
  /**
   * Drops every entry whose key starts with `prefix` (an operator's purge,
   * CachedCatalogue.purge), fresh or kept as a stand-in, and says how many
   * it dropped. A shared cache drops them for every replica; what another
   * replica holds in its own memory goes within its own short tier's time.
   */
  purge(prefix: string): MaybeAsync<number>;
}
