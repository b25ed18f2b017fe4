/**
 * String methods for the renderers' hot loops, called through
 * `String.prototype`'s own functions rather than as `s.method()`.
 *
 * The strings a renderer meets in the server come in many representations:
 * sequential, sliced, cons, external and thin strings, one- and two-byte,
 * from protobuf's decoder, JSON, HTTP parsing and Buffer. Once one call
 * site has seen more than four of them, V8's optimized code no longer
 * inlines the method's lookup there: it asks the generic load IC for
 * `isWellFormed` or `charCodeAt` on every call. In the server's random
 * misses (legacy json over 100k items) that lookup was 7.8% of the
 * process's CPU samples (perf), and it did not show in one process that
 * only ever rendered decoded records. One process fed such strings first
 * took 50-62 µs to encode a record's PHP value as json with `s.method()`
 * calls, against 40-48 µs with these. A function known at compile time is
 * called directly, whatever the string's representation.
 */

const isWellFormed = String.prototype.isWellFormed;
const toWellFormed = String.prototype.toWellFormed;
const charCodeAt = String.prototype.charCodeAt;
const slice = String.prototype.slice;

/** `s` with each lone surrogate replaced by U+FFFD (`s.toWellFormed()`), `s` itself when it has none. */
export function wellFormed(s: string): string {
  return isWellFormed.call(s) ? s : toWellFormed.call(s);
}

/** `s.charCodeAt(i)`. */
export function charCode(s: string, i: number): number {
  return charCodeAt.call(s, i);
}

/** `s.slice(start, end)`. */
export function sliceOf(s: string, start: number, end?: number): string {
  return slice.call(s, start, end);
}
