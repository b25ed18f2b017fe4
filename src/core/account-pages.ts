import type { AccountStore } from "./account-store.ts";
import type { Account } from "./accounts.ts";

/** The most accounts one page holds; a larger page size is taken as this (AIP-158). */
export const maxAccountPageSize = 1000;

/**
 * The most accounts a listing asked whole (page size 0) may hold; past it
 * the listing is refused, saying to ask a page at a time, rather than made:
 * 100,000 accounts whole were a 16.6 MB answer, and three of them one after
 * another took the gateway from 154 MB resident to 798 MB, past its memory
 * budget (512 MB).
 */
export const maxWholeAccounts = 10_000;

/** Which accounts to list, and which page of them. */
export interface AccountPageRequest {
  /** Part of the key or the name, in any case; empty: every account. */
  readonly query?: string | undefined;
  /** Only accounts in this status; undefined: either. */
  readonly status?: Account["status"] | undefined;
  /** Accounts a page, 1 to maxAccountPageSize (more is taken as the most); 0: every matching account at once, as before pages. */
  readonly pageSize?: number | undefined;
  /** The `nextPageToken` of the page before, asked with the same query and status; empty: the first page. */
  readonly pageToken?: string | undefined;
  /** Asked whole, the most accounts the listing may hold (`maxWholeAccounts`; the CLI, in a process of its own, takes every one). */
  readonly maxWhole?: number | undefined;
}

export interface AccountPage {
  readonly accounts: readonly Account[];
  /** What to ask with for the next page; empty when this page is the last. */
  readonly nextPageToken: string;
  /** How many accounts match the query and status, on every page. */
  readonly totalSize: number;
}

/** A page size or token the request cannot use (an RPC's `invalid_argument`). */
export class AccountPageError extends Error {
  override name = "AccountPageError";
}

/** A listing asked whole that holds more accounts than one answer may (`maxWholeAccounts`): `resource_exhausted`. */
export class AccountListingTooLarge extends AccountPageError {
  override name = "AccountListingTooLarge";
}

/** Where a page ended: the last account's place in the list's order (made, then key), and the filter it was listed under. */
interface Cursor {
  readonly createdAt: number;
  readonly key: string;
  readonly text: string;
  readonly status: string;
}

const encode = (c: Cursor): string => Buffer.from(JSON.stringify([c.createdAt, c.key, c.text, c.status]), "utf8").toString("base64url");

function decode(token: string): Cursor {
  try {
    const [createdAt, key, text, status] = JSON.parse(Buffer.from(token, "base64url").toString("utf8")) as unknown[];
    if (typeof createdAt === "number" && typeof key === "string" && typeof text === "string" && typeof status === "string") return { createdAt, key, text, status };
  } catch {
    // below
  }
  throw new AccountPageError("the page token is not one this gateway gave");
}

/**
 * A page of the accounts that match a query and a status, in the order they
 * were made (then by key), from a store that filters and pages itself
 * (AccountStore.listing). A page's token holds where it ended, not a
 * position: accounts made between two pages move nothing, none is listed
 * twice, and one made meanwhile comes on a later page (it sorts last). A
 * token is good only for the query and status it was made under (AIP-158):
 * another is refused, not answered wrongly.
 */
export async function accountPage(listing: AccountStore["listing"], request: AccountPageRequest): Promise<AccountPage> {
  const size = request.pageSize ?? 0;
  if (!Number.isInteger(size) || size < 0) throw new AccountPageError("the page size must be a whole number, 0 (every account) or more");
  const text = (request.query ?? "").trim().toLowerCase();
  const status = request.status;
  const cursor = request.pageToken ? decode(request.pageToken) : undefined;
  if (cursor !== undefined && (cursor.text !== text || cursor.status !== (status ?? ""))) {
    throw new AccountPageError("the page token was given for another query or status; ask the first page again");
  }
  const take = size === 0 ? 0 : Math.min(size, maxAccountPageSize);
  const whole = request.maxWhole ?? maxWholeAccounts;
  // One more than the page, to know whether another follows; asked whole, one more than it may hold, to know.
  const { accounts, total } = await listing({ text, status, after: cursor, limit: take === 0 ? (whole === Infinity ? 0 : whole + 1) : take + 1 });
  if (take === 0 && accounts.length > whole) {
    throw new AccountListingTooLarge(`${total} accounts match, more than one answer may hold (${whole}): ask for them a page at a time (page_size, at most ${maxAccountPageSize}), or narrow the query`);
  }
  const more = take > 0 && accounts.length > take;
  const page = more ? accounts.slice(0, take) : accounts;
  const last = page.at(-1);
  return { accounts: page, nextPageToken: more && last !== undefined ? encode({ createdAt: last.createdAt, key: last.key, text, status: status ?? "" }) : "", totalSize: total };
}
