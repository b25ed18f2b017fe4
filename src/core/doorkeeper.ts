/**
 * Which keys were asked for recently, for the response cache's admission:
 * an answer of the gateway's own catalogue is kept only when its key is
 * asked for a second time. Most keys of a walk over a large catalogue are
 * asked for once; keeping each of them would cost the memory and the
 * collector's work of an entry and push the popular items out, to save a
 * read that costs little.
 *
 * Two Bloom filters of 2^20 bits (128 KiB each, three probes a key): keys
 * go into the newer; when it has taken `generation` keys the older is
 * dropped and a new one started, so "recently" reaches back one to two
 * generations of distinct keys. A key it wrongly says was seen (about 1.5%
 * with a full generation of 100,000) is only kept one request early.
 */
export class Doorkeeper {
  private newer = new Uint32Array(bits / 32);
  private older = new Uint32Array(bits / 32);
  private added = 0;
  private readonly generation: number;

  constructor(generation = 100_000) {
    this.generation = generation;
  }

  /** Whether the key was asked for recently; it is remembered as asked for now either way. */
  seenBefore(key: string): boolean {
    const h1 = fnv1a(key);
    const h2 = (mix(h1) | 1) >>> 0;
    let inNewer = true;
    let inOlder = true;
    for (let i = 0; i < probes; i++) {
      const bit = (h1 + i * h2) & (bits - 1);
      const word = bit >>> 5;
      const mask = 1 << (bit & 31);
      if ((this.newer[word]! & mask) === 0) {
        inNewer = false;
        this.newer[word]! |= mask;
      }
      if ((this.older[word]! & mask) === 0) inOlder = false;
    }
    if (!inNewer && ++this.added >= this.generation) {
      this.older = this.newer;
      this.newer = new Uint32Array(bits / 32);
      this.added = 0;
    }
    return inNewer || inOlder;
  }
}

const bits = 1 << 20;
const probes = 3;

/** FNV-1a over the key's UTF-16 units. */
function fnv1a(s: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < s.length; i++) {
    h ^= s.charCodeAt(i);
    h = Math.imul(h, 0x01000193);
  }
  return h >>> 0;
}

/** MurmurHash3's finalizer: a second, independent-enough hash for double hashing. */
function mix(h: number): number {
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  return (h ^ (h >>> 16)) >>> 0;
}
