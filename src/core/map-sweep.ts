/** Entries a sweep looks at for each entry added to its map: more than one, so it outpaces the additions. */
const sweptPerAddition = 4;

/**
 * A sweep over a Map that looks at a few entries at a time and resumes where
 * it stopped, forgetting those that are due: a map kept bounded this way
 * costs the same for each entry added however many it holds. (Looking at
 * every entry whenever the map was full cost each addition the whole map
 * when nothing in it was due yet.) The iterator is live: it sees entries
 * added after it started, and those deleted under it are skipped.
 */
export class MapSweep<K, V> {
  private readonly map: Map<K, V>;
  private at: MapIterator<[K, V]> | undefined;

  constructor(map: Map<K, V>) {
    this.map = map;
  }

  /** Looks at the next few entries (a step for each entry added), deleting those `due` says are; after the last, the next step starts over. */
  step(due: (value: V, key: K) => boolean): void {
    for (let i = 0; i < sweptPerAddition; i++) {
      this.at ??= this.map.entries();
      const next = this.at.next();
      if (next.done === true) {
        this.at = undefined;
        return;
      }
      const [key, value] = next.value;
      if (due(value, key)) this.map.delete(key);
    }
  }
}
