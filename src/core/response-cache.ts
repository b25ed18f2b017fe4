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
  /** Approximate bytes it holds. */
  readonly bytes: number;
  /** For a translated answer: how its translation went. */
  readonly translation?: { readonly status: "" | "partial"; readonly engine: string } | undefined;
  /**
   * What renderers worked out for this entry (e.g. the item already encoded
   * per legacy format), so a hit costs little more than the status block.
   */
  readonly memo: Map<string, unknown>;
}

/**
 * Where answers are kept between calls. The embedded adapter is an in-memory
 * LRU bounded in bytes; a shared (Redis) adapter can follow.
 */
export interface ResponseCache {
  get(key: string): Promise<CacheEntry | undefined>;
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
}
