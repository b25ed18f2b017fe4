import { createHash } from "node:crypto";
import type { LedgerPlace, LedgerRow, Meter, UsageQuery } from "./meter.ts";

/** Calls a page holds when the request names no size (AIP-158: the API's documented default). */
export const defaultCallPageSize = 1000;
/** The most calls one page holds; a larger page size is taken as this (AIP-158). */
export const maxCallPageSize = 10_000;

/** Which of the ledger's calls to list (`UsageQuery`'s filters), and which page of them. */
export interface CallPageRequest {
  readonly filter: UsageQuery;
  /** Calls a page, 1 to maxCallPageSize (more is taken as the most); 0: defaultCallPageSize. */
  readonly pageSize?: number | undefined;
  /** The `nextPageToken` of the page before, asked with the same filter; empty: the first page. */
  readonly pageToken?: string | undefined;
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
 */
export class CallPageError extends Error {
  override name = "CallPageError";
  readonly of: "size" | "token";
  constructor(of: "size" | "token", message: string) {
    super(message);
    this.of = of;
  }
}

/** What a token is made for: the filter's fields that choose rows, so a token asked with another is known. */
function filterDigest(f: UsageQuery): string {
  const chosen = [f.account, f.from, f.to, f.operation, f.code, f.address, f.requestId].map((v) => (v === undefined ? null : String(v)));
  return createHash("sha256").update(JSON.stringify(chosen)).digest("base64url").slice(0, 16);
}

function encode(place: LedgerPlace, digest: string): string {
  return Buffer.from(JSON.stringify([place.day, place.at, place.requestId, digest]), "utf8").toString("base64url");
}

function decode(token: string): { readonly place: LedgerPlace; readonly digest: string } {
  try {
    const [day, at, requestId, digest] = JSON.parse(Buffer.from(token, "base64url").toString("utf8")) as unknown[];
    if (typeof day === "string" && /^\d{4}-\d{2}-\d{2}$/.test(day) && Number.isSafeInteger(at) && typeof requestId === "string" && requestId.length <= 64 && typeof digest === "string") {
      return { place: { day, at: at as number, requestId }, digest };
    }
  } catch {
    // below
  }
  throw new CallPageError("token", "the page token is not one this gateway gave");
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
export async function callPage(meter: Pick<Meter, "calls">, request: CallPageRequest): Promise<CallPage> {
  const size = request.pageSize ?? 0;
  if (!Number.isInteger(size) || size < 0) throw new CallPageError("size", "the page size must be a whole number, 0 (the default, 1000) or more");
  const digest = filterDigest(request.filter);
  let after: LedgerPlace | undefined;
  if (request.pageToken) {
    const token = decode(request.pageToken);
    if (token.digest !== digest) throw new CallPageError("token", "the page token was given for another filter; ask the first page again");
    after = token.place;
  }
  const take = size === 0 ? defaultCallPageSize : Math.min(size, maxCallPageSize);
  // One more than the page, to know whether another follows.
  const rows = await meter.calls(request.filter, after, take + 1);
  const more = rows.length > take;
  const page = more ? rows.slice(0, take) : rows;
  const last = page.at(-1);
  return { rows: page, nextPageToken: more && last !== undefined ? encode({ day: last.day, at: last.at, requestId: last.requestId }, digest) : "" };
}
