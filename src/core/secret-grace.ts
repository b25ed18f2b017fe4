/**
 * Secrets a new one replaced, kept working for a while (a rotation's grace):
 * an account's key secrets (accounts.ts) and its alert secrets (alerts.ts).
 * Each replaced secret keeps its own time, so a rotation sent again (its
 * answer lost, say) keeps the secret every caller still uses working as
 * well as the one the first copy made, instead of cutting the first off.
 */

/** A replaced secret, working until `until` (ms). */
export interface Grace {
  readonly until: number;
}

/** The most replaced secrets kept working at once: a rotation past it ends the oldest's grace. */
export const maxKeptSecrets = 3;

/** The replaced secrets still working at `now`, newest first. */
export function stillKept<T extends Grace>(kept: readonly T[] | undefined, now: number): readonly T[] {
  return kept === undefined ? [] : kept.filter((k) => now < k.until);
}

/** The replaced secrets after a rotation that keeps `replaced` working: it first, then those still working at `now`, at most `maxKeptSecrets`. */
export function keepReplaced<T extends Grace>(kept: readonly T[] | undefined, replaced: T, now: number): readonly T[] {
  return [replaced, ...stillKept(kept, now)].slice(0, maxKeptSecrets);
}

/** The latest time any of the kept secrets works until, whether or not it has passed; undefined for none. */
export function latestUntil(kept: readonly Grace[] | undefined): number | undefined {
  return kept === undefined || kept.length === 0 ? undefined : Math.max(...kept.map((k) => k.until));
}

/** Until when a replaced secret still works: the latest of those still working at `now`; undefined when none does. */
export function keptUntil(kept: readonly Grace[] | undefined, now: number): number | undefined {
  return latestUntil(stillKept(kept, now));
}

/** Kept secrets as a store holds them: a list, or one (as they were kept before a rotation could keep several); none as null. */
export function keptFromJson<T extends Grace>(value: T | readonly T[] | null | undefined): readonly T[] | undefined {
  if (value === null || value === undefined) return undefined;
  const list = Array.isArray(value) ? (value as readonly T[]) : [value as T];
  return list.length === 0 ? undefined : list;
}
