import { exactUtf8, retainedBytes } from "../core/retained-size.ts";
/**
 * A PHP value, as legacy callers decode it: the one representation every
 * legacy format (json, jsonu, and later serialize, var_export, xml) renders.
 * - string, boolean, null: as in PHP;
 * - number: a PHP int (always a safe integer);
 * - PhpFloat: a PHP float;
 * - array: a PHP list;
 * - Map: a PHP array with keys, in order. An empty one is PHP's empty array,
 *   which json_encode writes as `[]`.
 * - PhpFragment: a value whose renderings are kept once made (see below).
 */
export type PhpValue = string | number | boolean | null | PhpFloat | PhpFragment | PhpValue[] | PhpMap;

export type PhpMap = Map<string, PhpValue>;

export class PhpFloat {
  readonly value: number;

  constructor(value: number) {
    this.value = value;
  }
}

const int64Min = -(2n ** 63n);
const int64Max = 2n ** 63n - 1n;

/**
 * The key PHP stores for a string key: a canonical decimal integer within
 * PHP_INT range ("123", "-5", not "0123", "-0" or "1.5") becomes an int key,
 * as PHP does on every array write. JSON writes both kinds as strings;
 * serialize and var_export tell them apart.
 */
export function phpArrayKey(key: string): string | bigint {
  if (!/^(0|-?[1-9][0-9]*)$/.test(key) || key.length > 20) return key;
  const n = BigInt(key);
  return n >= int64Min && n <= int64Max ? n : key;
}

/**
 * A value that remembers how each renderer wrote it. A cached item is
 * wrapped in one, so a cache hit splices the item's rendering in and
 * renders only the status block. Every renderer produces the same bytes with or
 * without the wrapper; `key` names the renderer and anything the text
 * depends on.
 *
 * It keeps each rendering once, and not the value itself: the value is
 * made again (from the cached message) only when a rendering not made yet is
 * asked for, so a cached item holds its message and the renderings of the
 * formats it was asked in, nothing more. Every rendering is kept as its
 * UTF-8 bytes, the bytes a hit sends: a hit writes them as they are, between
 * the status block's text (renderLegacy's SplicedBody), so no hit encodes
 * the item again or copies it into a block of its own. (A json rendering
 * was kept as a flat one-byte string until the hit was written in parts:
 * Node then encoded its 13 kB into the socket's buffer on every hit, about
 * 3 µs of a 29 µs call.) Beyond Latin-1 (the jsonu, xml, serialize and
 * var_export renderings of Chinese text) the bytes also take 0.55 of the
 * two-byte string V8 would hold.
 */
export class PhpFragment {
  private readonly make: () => PhpValue;
  private readonly encoded = new Map<string, Buffer>();
  /** Told the bytes of each rendering kept, so the cache entry holding the fragment counts them. */
  private readonly grew: ((bytes: number) => void) | undefined;

  constructor(value: PhpValue | (() => PhpValue), grew?: (bytes: number) => void) {
    this.make = typeof value === "function" ? value : () => value;
    this.grew = grew;
  }

  /** The value, made anew: read it once per rendering. */
  get value(): PhpValue {
    return this.make();
  }

  text(key: string, render: () => string): string {
    const known = this.encoded.get(key);
    if (known !== undefined) return known.toString("utf8");
    const t = render();
    this.keep(key, t);
    return t;
  }

  /** A rendering already made, as its UTF-8 bytes. */
  rendering(key: string): Buffer | undefined {
    return this.encoded.get(key);
  }

  /** Makes the rendering `key` unless it is made. */
  prepare(key: string, render: () => string): void {
    if (!this.encoded.has(key)) this.keep(key, render());
  }

  private keep(key: string, text: string): void {
    const kept = exactUtf8(text);
    this.encoded.set(key, kept);
    this.grew?.(40 + retainedBytes(kept));
  }
}

/**
 * Stands in for a fragment while the rest of a document is rendered: it
 * writes `marker` and remembers which rendering was asked for (making it in
 * the fragment if it is not made yet), so the fragment's bytes can be
 * spliced in at the marker.
 */
export class PhpPlaceholder extends PhpFragment {
  readonly marker: string;
  private readonly item: PhpFragment;
  asked: string | undefined;

  constructor(marker: string, item: PhpFragment) {
    super(null);
    this.marker = marker;
    this.item = item;
  }

  override get value(): PhpValue {
    return this.item.value;
  }

  override text(key: string, render: () => string): string {
    this.asked = key;
    // The renderer's closure reads this placeholder's value: the item's.
    this.item.prepare(key, render);
    return this.marker;
  }
}
