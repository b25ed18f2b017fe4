import { createHash, createHmac } from "node:crypto";
import { isCalendarDay, nextDay } from "./clock.ts";
import type { FeedPlace, LedgerPlace, LedgerRow, Meter, TotalPlace, UsageDays, UsageQuery, UsageReport, UsageSums, UsageTotal } from "./meter.ts";
import { usageSums } from "./meter.ts";

// The usage ledger a page at a time (AIP-158): its calls (`callPage`) and its
// totals (`totalsPage`). A page's token holds where it ended in the list's
// order and a digest of the filter it was made under, never a position.
// And its calls in the order they were committed (`followCalls`), from a
// cursor a follower keeps.

/** Calls a page holds when the request names no size (AIP-158: the API's documented default). */
export const defaultCallPageSize = 1000;
/** The most calls one page holds; a larger page size is taken as this (AIP-158). */
export const maxCallPageSize = 10_000;

/** Which of the ledger's calls or totals to list (`UsageQuery`'s filters), and which page of them. */
export interface UsagePageRequest {
  readonly filter: UsageQuery;
  /** Calls a page, 1 to maxCallPageSize (more is taken as the most); 0: defaultCallPageSize. */
  readonly pageSize?: number | undefined;
  /** The `nextPageToken` of the page before, asked with the same filter; empty: the first page. */
  readonly pageToken?: string | undefined;
  /** For a report asked whole, the most totals it may hold (`maxWholeTotals`; tests ask fewer). */
  readonly maxWholeTotals?: number | undefined;
}

export interface CallPage {
  /** In `LedgerPlace` order: by day, the newest first, then by time, the newest first. */
  readonly rows: readonly LedgerRow[];
  /** What to ask with for the next page; empty when this page is the last. */
  readonly nextPageToken: string;
}

/**
 * A page size or token the request cannot use: an RPC's `invalid_argument`;
 * for a team, a token is the spec's 4015 (wrong page token), a size a 4003.
 * "folded": a follower's cursor that calls after it were folded past
 * retention since (`followCalls`): `out_of_range`. "large": a report asked
 * whole that holds more totals than one answer may (`maxWholeTotals`):
 * `resource_exhausted`, as gRPC's own answer too large to send; for a team,
 * a 4003. "both": a follower that asks from a cursor and from now at once:
 * `invalid_argument`; for a team, a 4003.
 */
export class UsagePageError extends Error {
  override name = "UsagePageError";
  readonly of: "size" | "token" | "folded" | "large" | "both";
  constructor(of: "size" | "token" | "folded" | "large" | "both", message: string) {
    super(message);
    this.of = of;
  }
}

/** What a store's `feed` throws for a cursor that calls after it were folded past retention since. */
export function foldedPastCursor(): UsagePageError {
  return new UsagePageError(
    "folded",
    "calls after this cursor were folded past retention (GATEWAY_LEDGER_RETENTION_DAYS) into per-day totals before they were read; follow again from the start (an empty cursor) and take the days folded from QueryUsage's totals",
  );
}

/** What a token is made for: the filter's fields that choose rows (and a list's own), so a token asked with another is known. */
function filterDigest(f: UsageQuery, list: string): string {
  const chosen = [list, f.account, f.from, f.to, f.operation, f.code, f.address, f.requestId, f.byAddress === true].map((v) => (v === undefined ? null : String(v)));
  return createHash("sha256").update(JSON.stringify(chosen)).digest("base64url").slice(0, 16);
}

function encode(place: readonly (string | number)[], digest: string): string {
  return Buffer.from(JSON.stringify([...place, digest]), "utf8").toString("base64url");
}

/** A token's place (its fields as `valid` takes them) and digest; anything else is a token this gateway did not give. */
function decode<P>(token: string, valid: (fields: unknown[]) => P | undefined, what = "page token"): { readonly place: P; readonly digest: string } {
  try {
    const fields = JSON.parse(Buffer.from(token, "base64url").toString("utf8")) as unknown;
    if (Array.isArray(fields) && typeof fields.at(-1) === "string") {
      const place = valid(fields.slice(0, -1));
      if (place !== undefined) return { place, digest: fields.at(-1) as string };
    }
  } catch {
    // below
  }
  throw new UsagePageError("token", `the ${what} is not one this gateway gave`);
}

/** A `YYYY-MM-DD` day of the calendar (a token's days are counted on from, so 2026-02-30 is not one). */
const isDay = (v: unknown): v is string => typeof v === "string" && isCalendarDay(v);
const isText = (v: unknown): v is string => typeof v === "string" && v.length <= 256;

function ledgerPlace([day, at, requestId]: unknown[]): LedgerPlace | undefined {
  return isDay(day) && Number.isSafeInteger(at) && isText(requestId) ? { day, at: at as number, requestId } : undefined;
}

function totalPlace([day, account, operation, code, charge, clientIp]: unknown[]): TotalPlace | undefined {
  return isDay(day) && isText(account) && isText(operation) && Number.isSafeInteger(code) && isText(charge) && isText(clientIp) ? { day, account, operation, code: code as number, charge, clientIp } : undefined;
}

/** The page size asked for as a count: 0 is `fallback`, more than `max` is `max`. */
function pageSize(size: number | undefined, fallback: number, max: number): number {
  const n = size ?? 0;
  if (!Number.isInteger(n) || n < 0) throw new UsagePageError("size", `the page size must be a whole number, 0 (${fallback === 0 ? "every one at once" : `the default, ${fallback}`}) or more`);
  return n === 0 ? fallback : Math.min(n, max);
}

/**
 * A page of the ledger's calls that match a filter, newest first
 * (`LedgerPlace`), read by `Meter.calls` from where the page before ended:
 * the ledger's indexes hold the rows in this order, so every page costs
 * its own rows, however deep into a month it is. A token holds where its
 * page ended, not a position: calls recorded between two pages move
 * nothing and none is listed twice (new calls sort before the first page,
 * so a listing started before them never shows them; start again to see
 * them). A token is good only for the filter it was made under (AIP-158):
 * another is refused, not answered wrongly.
 */
export async function callPage(meter: Pick<Meter, "calls">, request: UsagePageRequest): Promise<CallPage> {
  const take = pageSize(request.pageSize, defaultCallPageSize, maxCallPageSize);
  const digest = filterDigest(request.filter, "calls");
  const after = request.pageToken ? placeFrom(request.pageToken, digest, ledgerPlace) : undefined;
  // One more than the page, to know whether another follows.
  const rows = await meter.calls(request.filter, after, take + 1);
  const more = rows.length > take;
  const page = more ? rows.slice(0, take) : rows;
  const last = page.at(-1);
  return { rows: page, nextPageToken: more && last !== undefined ? encode([last.day, last.at, last.requestId], digest) : "" };
}

function placeFrom<P>(token: string, digest: string, valid: (fields: unknown[]) => P | undefined): P {
  const read = decode(token, valid);
  if (read.digest !== digest) throw new UsagePageError("token", "the page token was given for another filter; ask the first page again");
  return read.place;
}

/** The most totals one page holds; a larger page size is taken as this (AIP-158). */
export const maxTotalsPageSize = 10_000;

/**
 * The most totals a report asked whole (no page size) may hold; past it the
 * report is refused, saying to ask a page at a time, rather than made.
 * Made whole, a report is held in several forms at once while it is
 * written out (the store's answer, the messages, the JSON): a month by
 * address over a million calls, a million totals, took the gateway past its
 * heap limit (512 MB) and down with every call in flight; five days of it,
 * 166,000 totals and 27 MB of JSON, took it to 593 MB resident. Read as
 * the pages are, a window of days at a time, it is refused once one total
 * more is read (the month: 0.34-0.49 s, against 2.3 s grouped whole first).
 */
export const maxWholeTotals = 50_000;

/** A usage report a page of totals at a time; its sums are over every total of the query. */
export interface TotalsPage extends UsageReport {
  readonly sums: UsageSums;
  /** What to ask with for the next page; empty when this page is the last, and always without a page size. */
  readonly nextPageToken: string;
}

/**
 * A page token's sums are sealed under the store's page key
 * (`Meter.pageKey`), the same for every replica and across restarts, so a
 * token carries the sums its first page read, whichever replica answers the
 * next page, and cannot be given others. A token whose seal does not hold
 * (changed, or from a store with another key) has its sums read again:
 * never refused, never taken on trust.
 */
function sumsSeal(key: Uint8Array, digest: string, place: readonly (string | number)[], sums: readonly string[]): string {
  return createHmac("sha256", key).update(JSON.stringify([digest, ...place, ...sums])).digest("base64url").slice(0, 22);
}

const sumFields = (s: UsageSums) => [s.calls, s.chargedCalls, s.amount, s.cacheHits, s.upstreamRequests].map(String);

/** A totals place as a token writes it (`totalPlace` reads it back), and as its sums are sealed with. */
const placeFields = (p: TotalPlace) => [p.day, p.account, p.operation, p.code, p.charge, p.clientIp];

/** A totals token's place and, when this process sealed them, the sums its first page read. */
function totalsToken(token: string, digest: string, key: Uint8Array): { readonly place: TotalPlace; readonly sums: UsageSums | undefined } {
  const { place, sealed } = placeFrom(token, digest, (fields) => {
    const place = totalPlace(fields);
    // A token of a gateway before the sums were carried is a place alone; its sums are read again.
    return place === undefined ? undefined : { place, sealed: fields.length === 12 ? fields.slice(6) : undefined };
  });
  if (sealed === undefined || !sealed.every((v) => typeof v === "string")) return { place, sums: undefined };
  const values = sealed.slice(0, 5) as string[];
  if (!values.every((v) => /^\d{1,30}$/.test(v)) || sealed[5] !== sumsSeal(key, digest, placeFields(place), values)) return { place, sums: undefined };
  const [calls, chargedCalls, amount, cacheHits, upstreamRequests] = values.map(BigInt) as [bigint, bigint, bigint, bigint, bigint];
  return { place, sums: { calls, chargedCalls, amount, cacheHits, upstreamRequests } };
}

/**
 * A usage report (`Meter.query`) with its totals a page at a time, in the
 * totals' order (day, account, operation, code, charge, address), read on
 * from where the page before ended: a month's totals per address can be
 * a million, and one answer of them all held the serving thread for
 * seconds while it was made. A page size of 0 is every total at once, as
 * before pages.
 *
 * A page costs the days it lists, not the range: the totals are by day
 * first, so a page reads a window of days from where the one before ended,
 * one day, then two, then four..., until it has its totals or the range
 * ends (`Meter.usageDays` bounds it: a few index lookups). Read from the
 * place to the range's end every time, a month by address (a million
 * calls, a million totals) took 2.6 s a page of 10,000 and 266 s in all;
 * read so, 85 ms a page.
 *
 * The sums are over every total of the query (`Meter.usageSums`), read
 * with the first page and carried in its token, sealed (`Meter.pageKey`),
 * so every page shows the same sums and no page after the first reads the
 * range again, whichever replica answers it. The rows,
 * when asked for, come with the first page only (ListCalls' first page;
 * it pages through them). A token is good only for the filter (and
 * `by_address`) it was made under.
 */
export async function totalsPage(meter: Pick<Meter, "query" | "calls" | "usageSums" | "usageDays" | "pageKey">, request: UsagePageRequest): Promise<TotalsPage> {
  const take = pageSize(request.pageSize, 0, maxTotalsPageSize);
  const filter = request.filter;
  if (take === 0) {
    if (request.pageToken) throw new UsagePageError("token", "a page token goes with a page size; ask the first page again with one");
    // Read as the pages are, a window of days at a time, up to one more total than a whole report may hold: a report
    // that large is refused once that many are read, never made whole.
    const most = request.maxWholeTotals ?? maxWholeTotals;
    const [days, rows] = await Promise.all([meter.usageDays(filter), filter.rows ? meter.calls(filter, undefined, filter.rows) : []]);
    const totals = await totalsFrom(meter, filter, days, undefined, most + 1);
    if (totals.length > most) {
      throw new UsagePageError(
        "large",
        `this report holds more than ${most} totals, more than one answer may: ask for it a page at a time (page_size, at most ${maxTotalsPageSize}), or narrow it (fewer days, one account${filter.byAddress ? ", without by_address" : ""})`,
      );
    }
    return { totals, rows, sums: usageSums(totals), nextPageToken: "" };
  }
  const digest = filterDigest(filter, "totals");
  const key = await meter.pageKey();
  const token = request.pageToken ? totalsToken(request.pageToken, digest, key) : undefined;
  const after = token?.place;
  const [sums, days, rows] = await Promise.all([
    token?.sums ?? meter.usageSums(filter),
    meter.usageDays(filter),
    after === undefined && filter.rows ? meter.calls(filter, undefined, filter.rows) : [],
  ]);
  // One more than the page, to know whether another follows.
  const totals = await totalsFrom(meter, filter, days, after, take + 1);
  const more = totals.length > take;
  const page = more ? totals.slice(0, take) : totals;
  const last = page.at(-1);
  let nextPageToken = "";
  if (more && last !== undefined) {
    const place = placeFields({ day: last.day, account: last.account ?? "", operation: last.operation ?? "", code: last.code, charge: last.charge, clientIp: last.clientIp ?? "" });
    const values = sumFields(sums);
    nextPageToken = encode([...place, ...values, sumsSeal(key, digest, place, values)], digest);
  }
  return { totals: page, rows, sums, nextPageToken };
}

/**
 * At most `limit` totals of `filter` in their order, from just past `after`,
 * read a window of days at a time from there (one day, two, four...) within
 * `days`, so what is read is the days the totals are on, not the range.
 */
async function totalsFrom(meter: Pick<Meter, "query">, filter: UsageQuery, days: UsageDays | undefined, after: TotalPlace | undefined, limit: number): Promise<UsageTotal[]> {
  const totals: UsageTotal[] = [];
  if (days === undefined) return totals;
  let from = after !== undefined && after.day > days.first ? after.day : days.first;
  for (let width = 1; from <= days.last && totals.length < limit; width *= 2) {
    let through = from;
    for (let i = 1; i < width && through < days.last; i++) through = nextDay(through);
    const report = await meter.query({ ...filter, rows: 0, totalsPage: { after, limit: limit - totals.length, days: { from, through } } });
    totals.push(...report.totals);
    from = nextDay(through);
  }
  return totals;
}

/** What a follower of the ledger is given (`followCalls`). */
export interface FeedPage {
  /** In the order the ledger committed them, each after the cursor asked with. */
  readonly rows: readonly LedgerRow[];
  /** Where this answer ends, to ask with for the calls after: never empty. */
  readonly cursor: string;
  /**
   * Nothing more can be given now: fewer calls than asked for came, and (for
   * one account) the read reached the newest row. The shared store can still
   * hold back a call committed a moment ago (`Meter.feed`).
   */
  readonly caughtUp: boolean;
}

/**
 * The ledger's calls in the order it committed them, read on from a
 * follower's cursor (`Meter.feed`): a billing system that keeps the cursor
 * of each answer is given every call exactly once, whenever it stops and
 * starts again, with no day or time to choose and nothing to deduplicate.
 * `callPage` lists a filter newest first, and a listing started never sees
 * the calls recorded after it; this is the other way round, and sees
 * nothing else. A cursor is good only on the store that gave it; once calls
 * after it were folded past retention, it is refused ("folded") instead of
 * passing over them in silence. With an account, that account's calls
 * only (a team's own feed), picked from at most `scanRows` of the
 * ledger's rows an answer (`feedScanRows`). With `fromNow` (and no cursor),
 * from the end of the ledger as it stands (`Meter.feedEnd`): only the calls
 * committed from now on, what a live tail follows.
 */
export async function followCalls(
  meter: Pick<Meter, "feed" | "feedEnd">,
  request: {
    readonly cursor?: string | undefined;
    readonly fromNow?: boolean | undefined;
    readonly pageSize?: number | undefined;
    readonly account?: string | undefined;
    readonly scanRows?: number | undefined;
  },
): Promise<FeedPage> {
  const take = pageSize(request.pageSize, defaultCallPageSize, maxCallPageSize);
  if (request.fromNow === true && request.cursor) throw new UsagePageError("both", "a cursor or from_now, not both: a cursor reads on from where it was given, from_now from the newest call");
  const after = request.cursor ? feedPlace(request.cursor) : request.fromNow === true ? await meter.feedEnd() : undefined;
  const { rows, place, more } = await meter.feed(after, take, request.account === undefined ? undefined : { account: request.account, scan: request.scanRows ?? feedScanRows });
  return { rows, cursor: encode([place], feedTag), caughtUp: rows.length < take && more !== true };
}

/**
 * The most rows of the whole ledger one answer of an account's own feed
 * looks through (`followCalls` with an account): its rows are picked from
 * the ledger's commit order, which has no index by account, so an answer
 * costs at most this many rows however busy the other accounts are; a
 * follower behind by more is given its calls over several answers, each
 * with `caughtUp` false.
 */
export const feedScanRows = 50_000;

/** Where a cursor's digest would be (`encode`): what marks it as a follower's, not a page token. */
const feedTag = "feed";

function feedPlace(cursor: string): FeedPlace {
  const read = decode(cursor, (fields) => (fields.length === 1 && isText(fields[0]) ? fields[0] : undefined), "cursor");
  if (read.digest !== feedTag) throw new UsagePageError("token", "the cursor is not one this gateway gave");
  return read.place;
}
