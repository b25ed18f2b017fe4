import { heldInPlace, maxPlacedProperties } from "./message-shape.ts";

/**
 * What a value keeps alive, in bytes: its objects in a 64-bit V8 heap (Node
 * ships without pointer compression, so a slot is 8 bytes) and the off-heap
 * bytes of its buffers. The figures are V8's object layouts:
 *
 * - a string: 16 bytes of header, then one byte a character (Latin-1) or two
 *   (anything else, e.g. Chinese), rounded up to 8; the empty string is
 *   V8's own, shared;
 * - a plain object: 24 bytes of header and a slot a property (its keys
 *   belong to its hidden class, shared with every object of its shape),
 *   plus a 32-byte property array past four properties; past 16 properties
 *   added one by one (as protobuf-es builds a message, or a map field) V8
 *   keeps them in a hash table instead: three slots a property in a table
 *   of the power of two at least half again their number (an empty
 *   ItemDetail, 60 fields, takes 3.5 KB, not 0.5), unless it was made
 *   with every field in place (message-shape.ts): a slot a property;
 * - an array: 32 bytes, and a 16-byte backing store with a slot an element
 *   of its capacity (grown by half plus 16 as elements were pushed);
 * - a Map: 80 bytes, and 40 an entry (its hash table's share);
 * - a number: in its slot when a small integer, else a 16-byte heap number;
 * - a typed array or Buffer: 80 bytes of views on the heap, plus its bytes;
 *   when it views part of a larger block, the whole block, which it keeps
 *   alive (Node 24 hands out Buffers of up to 32 KiB from shared 64 KiB
 *   pool blocks: `Buffer.from` of a 4 KiB text pins 64 KiB).
 *
 * An object reached twice is counted once. Strings cannot be told apart by
 * identity, so one string held by two objects is counted twice: the figure
 * errs on the side of more. test/cache-accounting.test.ts holds it to the
 * heap growth measured over many cache entries.
 */
export function retainedBytes(value: unknown, seen: Set<object> = new Set()): number {
  switch (typeof value) {
    case "string":
      return stringBytes(value);
    case "number":
      return Number.isInteger(value) && Math.abs(value) < 2 ** 31 ? 0 : 16;
    case "bigint":
      return 16 + 8 * Math.ceil(Math.max(1, value.toString(16).length) / 16);
    case "object": {
      if (value === null || seen.has(value)) return 0;
      seen.add(value);
      if (ArrayBuffer.isView(value)) {
        const block = value.buffer;
        if (block.byteLength === value.byteLength) return 80 + value.byteLength;
        if (seen.has(block)) return 80;
        seen.add(block);
        return 80 + block.byteLength;
      }
      if (value instanceof ArrayBuffer) return 56 + value.byteLength;
      if (Array.isArray(value)) {
        let n = 32 + (value.length === 0 ? 0 : 16 + 8 * pushedCapacity(value.length));
        for (const v of value) n += retainedBytes(v, seen);
        return n;
      }
      if (value instanceof Map) {
        let n = 80 + 40 * value.size;
        for (const [k, v] of value) n += retainedBytes(k, seen) + retainedBytes(v, seen);
        return n;
      }
      const keys = Object.keys(value);
      // Only an object past the hash-table bound can have been made in place (message-shape.ts): the set is asked of no other.
      let n = keys.length > maxPlacedProperties && heldInPlace(value) ? 24 + 8 * keys.length : objectBytes(keys.length);
      for (const k of keys) n += retainedBytes((value as Record<string, unknown>)[k], seen);
      return n;
    }
    default:
      return 0; // booleans, undefined, symbols and functions live elsewhere, shared
  }
}

/**
 * The UTF-8 bytes of a text in a buffer of exactly their size. `Buffer.from`
 * takes up to 32 KiB from a shared 64 KiB pool block, which a cache entry
 * holding the Buffer would keep alive whole; cached renderings are made with
 * this instead.
 */
export function exactUtf8(text: string): Buffer {
  const bytes = Buffer.allocUnsafeSlow(Buffer.byteLength(text, "utf8"));
  bytes.write(text, "utf8");
  return bytes;
}

/** A plain object of `count` properties: in-object slots and a property array, or, past 16, a hash table (V8's NameDictionary). */
function objectBytes(count: number): number {
  if (count <= 4) return 24 + 8 * count;
  if (count <= maxPlacedProperties) return 24 + 8 * count + 32;
  let capacity = 4;
  while (capacity < count + (count >> 1)) capacity *= 2;
  return 24 + 64 + 24 * capacity;
}

/** The capacity of an array's backing store after `length` pushes onto an empty array. */
function pushedCapacity(length: number): number {
  let capacity = 0;
  while (capacity < length) capacity += (capacity >> 1) + 16;
  return capacity;
}

// eslint-disable-next-line no-control-regex
const beyondLatin1 = /[^\u0000-\u00ff]/;

/** Whether V8 can hold the text at one byte a character: every character is Latin-1. */
export function isLatin1(s: string): boolean {
  return !beyondLatin1.test(s);
}

function stringBytes(s: string): number {
  if (s.length === 0) return 0; // V8's one empty string
  const chars = isLatin1(s) ? s.length : 2 * s.length;
  return 16 + Math.ceil(chars / 8) * 8;
}
