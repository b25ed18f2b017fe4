/** Where the core reads the time; tests inject their own. */
export interface Clock {
  /** Milliseconds since the Unix epoch. */
  now(): number;
}

export const systemClock: Clock = { now: () => Date.now() };

/**
 * Whether what was read at `at` was read less than `ms` before `now`, both
 * on the same wall clock. A read made "after" now was made before the clock
 * stepped back (an NTP correction, a VM resumed from a snapshot): its age is
 * not known, so it is not fresh; taken as fresh it would be served for the
 * whole step besides, an hour for an hour (an account stopped, a price
 * changed, an admin revoked elsewhere, unseen by this replica meanwhile).
 */
export function readWithin(at: number, now: number, ms: number): boolean {
  return at <= now && now - at < ms;
}

const formatters = new Map<string, Intl.DateTimeFormat>();

function formatterFor(zone: string): Intl.DateTimeFormat {
  let f = formatters.get(zone);
  if (f === undefined) {
    f = new Intl.DateTimeFormat("en-CA", {
      timeZone: zone,
      year: "numeric",
      month: "2-digit",
      day: "2-digit",
      hour: "2-digit",
      minute: "2-digit",
      second: "2-digit",
      hourCycle: "h23",
    });
    formatters.set(zone, f);
  }
  return f;
}

/** Throws a RangeError when the zone is not an IANA zone this runtime knows. */
export function assertTimeZone(zone: string): void {
  formatterFor(zone);
}

// formatToParts is the costly step, and a call formats a few instants (now, the
// stored entry's time) in a few zones, each the same for a second or longer.
const formatted = new Map<string, string>();

/** `YYYY-MM-DD HH:MM:SS` of the instant in the zone. */
export function formatDateTime(ms: number, zone: string): string {
  const second = Math.floor(ms / 1000);
  // The last few answers first: a call asks for the same two or three (now, the entry's time) over and over,
  // and comparing a number and a string is cheaper than building and hashing a key.
  for (let i = 0; i < recent.length; i++) {
    const r = recent[i]!;
    if (r.second === second && r.zone === zone) return r.text;
  }
  const text = formatDateTimeSlow(second, zone);
  recent[nextRecent] = { second, zone, text };
  nextRecent = (nextRecent + 1) % recent.length;
  return text;
}

const recent: { second: number; zone: string; text: string }[] = Array.from({ length: 4 }, () => ({ second: Number.NaN, zone: "", text: "" }));
let nextRecent = 0;

function formatDateTimeSlow(second: number, zone: string): string {
  const key = `${zone}\u0000${second}`;
  const known = formatted.get(key);
  if (known !== undefined) return known;
  const p: Record<string, string> = {};
  for (const part of formatterFor(zone).formatToParts(second * 1000)) p[part.type] = part.value;
  const text = `${p.year}-${p.month}-${p.day} ${p.hour}:${p.minute}:${p.second}`;
  if (formatted.size >= 256) formatted.clear();
  formatted.set(key, text);
  return text;
}

/** Whether the text is a day of the calendar as `YYYY-MM-DD`: 2026-02-30 and 2026-13-01 are not, and are refused rather than compared as text. */
export function isCalendarDay(text: string): boolean {
  if (!/^\d{4}-\d{2}-\d{2}$/.test(text)) return false;
  const t = Date.parse(`${text}T00:00:00Z`);
  return !Number.isNaN(t) && new Date(t).toISOString().slice(0, 10) === text;
}

/** `YYYY-MM-DD`: the calendar day of the instant in the zone. */
export function dayOf(ms: number, zone: string): string {
  return formatDateTime(ms, zone).slice(0, 10);
}

let lastDay = "";
let lastPrevious = "";

/** The day before a `YYYY-MM-DD` day. */
export function previousDay(day: string): string {
  if (day === lastDay) return lastPrevious;
  const d = new Date(`${day}T00:00:00Z`);
  d.setUTCDate(d.getUTCDate() - 1);
  lastDay = day;
  lastPrevious = d.toISOString().slice(0, 10);
  return lastPrevious;
}

/** The day after a `YYYY-MM-DD` day. */
export function nextDay(day: string): string {
  const d = new Date(`${day}T00:00:00Z`);
  d.setUTCDate(d.getUTCDate() + 1);
  return d.toISOString().slice(0, 10);
}

/** The first instant (Unix ms) of the day after `day` in the zone: when a count kept by the zone's day starts again. */
export function nextDayStarts(day: string, zone: string): number {
  const next = nextDay(day);
  // Midnight itself, unless daylight saving skips it there (then the first instant the zone writes as that day).
  const at = zonedTimeToEpoch(`${next} 00:00:00`, zone)!;
  return dayOf(at, zone) === next ? at : at + 3_600_000;
}

/**
 * The instant of a wall-clock time `YYYY-MM-DD HH:MM:SS` in a zone, in Unix
 * milliseconds; undefined when the text is not such a time. In a gap or an
 * overlap of daylight saving, the earlier reading wins.
 */
export function zonedTimeToEpoch(text: string, zone: string): number | undefined {
  const m = /^(\d{4})-(\d{2})-(\d{2}) (\d{2}):(\d{2}):(\d{2})$/.exec(text);
  if (m === null) return undefined;
  const [y, mo, d, h, mi, s] = m.slice(1).map(Number) as [number, number, number, number, number, number];
  const asUtc = Date.UTC(y, mo - 1, d, h, mi, s);
  if (new Date(asUtc).toISOString().slice(0, 19) !== `${m[1]}-${m[2]}-${m[3]}T${m[4]}:${m[5]}:${m[6]}`) return undefined;
  // The zone's offset at that instant, found from how the zone writes it; twice, for offsets that change near it.
  let guess = asUtc;
  for (let i = 0; i < 2; i++) {
    const written = Date.parse(`${formatDateTime(guess, zone).replace(" ", "T")}Z`);
    guess = asUtc - (written - guess);
  }
  return guess;
}
