import type { ChargeClass } from "../contract/error-codes.ts";
import type { OperationId } from "../contract/operations.ts";
import type { ErrorCode } from "../gen/gateway/catalogue/v1/status_pb.js";
import type { Account } from "./accounts.ts";
import type { Micros } from "./money.ts";
import type { MaybeAsync } from "./maybe-async.ts";
import type { IdempotencyKey, KeyClaim, TakenKey } from "./idempotency.ts";

/** Where a call arrived. */
export type Transport = "legacy" | "connect" | "grpc" | "grpc-web";

/** One row of the usage ledger: every call has exactly one. */
export interface LedgerRow {
  readonly requestId: string;
  /** Unix milliseconds when the call arrived. */
  readonly at: number;
  /** The account's day (its zone), or the server's day when no account was identified. */
  readonly day: string;
  readonly account: string | undefined;
  readonly operation: OperationId | undefined;
  readonly code: ErrorCode;
  readonly charge: ChargeClass;
  /** What the call cost: its operation's price when charged, else 0. */
  readonly price: Micros;
  readonly cacheHit: boolean;
  /**
   * Requests the gateway sent to a paid upstream provider for this call,
   * retries included: what the provider may bill the operator for it. 0 for
   * an answer from the cache, from the gateway's own catalogue, or from a
   * purchase another call made (a call waiting on another's purchase shares
   * it; the purchase is the row of the call that made it). Rows written
   * before the ledger kept it read 0.
   */
  readonly upstreamRequests: number;
  readonly latencyMicros: number;
  readonly transport: Transport;
  /**
   * The caller's address, as its status block's `client_ip` shows it (behind
   * trusted proxies, the forwarded one). Kept in the call's row; calls with no
   * account are counted per address instead. Undefined for rows written
   * before the ledger kept it.
   */
  readonly clientIp?: string | undefined;
}

/** A call let through the account's limits; `record` settles it. */
export interface Admission {
  readonly account: string;
  readonly day: string;
  readonly price: Micros;
  /** The store's name for the reservation, where it keeps one (a shared store's lease). */
  readonly lease?: string;
  /**
   * The account's calls of the day as the daily maximum counted them when
   * it admitted this one: charged, and reserved by calls in flight, this one
   * included. Exact across replicas (the shared store decides in one
   * statement); undefined where a store does not say.
   */
  readonly dayCount?: number | undefined;
  /**
   * The rate's theoretical arrival time once this call was admitted (ns,
   * call-rate.ts) and the meter's clock when it decided (ms); undefined for
   * an account with no rate.
   */
  readonly rate?: { readonly tat: bigint; readonly at: number } | undefined;
}

/**
 * A change of a prepaid balance that is not a call's price: money added when
 * the account is made (`opening`) or later (`top-up`), or the balance dropped
 * (`unbilled`). Each is recorded with the balance it left, in the same
 * transaction that makes it, so an account's balance can be accounted for:
 * the charged calls between two changes took exactly the difference.
 */
export type BalanceChange = (
  | {
      readonly kind: "opening" | "top-up";
      readonly amount: Micros;
      readonly at: number;
      /**
       * The payment it is for (an invoice or payment id), where its maker
       * names one: the account's change with this reference is made once,
       * and a second with the same reference and amount changes nothing
       * (`adjustBalance` says `repeated`), however many arrive at once on
       * any replica. Payment systems deliver their events at least once.
       */
      readonly reference?: string | undefined;
    }
  | { readonly kind: "unbilled"; readonly at: number }
) & {
  /** Who made it (`AccountChange.by`), recorded with it. */
  readonly by?: string;
};

/**
 * A recorded change: `carried` is the balance an account already had when
 * its store began recording changes (an upgrade), `amount` what was added
 * (for `unbilled`, minus what was dropped), `balance` the balance after it
 * (none once unbilled).
 */
export interface RecordedBalanceChange {
  readonly at: number;
  readonly kind: BalanceChange["kind"] | "carried";
  readonly amount: Micros;
  readonly balance: Micros | undefined;
  /** Who made it; empty where no one was recorded (a change from before the record of who, a carried balance). */
  readonly by: string;
  /** The payment it was for (`BalanceChange.reference`); empty where none was named. */
  readonly reference: string;
}

/**
 * A ledger commit that was sent and never answered, whose outcome could not
 * be learnt in time (the shared database stayed out of reach): its calls may
 * or may not be charged, and are not answered with their data. The ledger,
 * once it answers again, is the record of which (see `LedgerCommitOutcome`).
 */
export class UnconfirmedCommit extends Error {
  override name = "UnconfirmedCommit";

  constructor(cause: unknown) {
    super("the usage ledger did not confirm its commit in time", { cause });
  }
}

/**
 * What became of a ledger commit sent and not answered (its connection timed
 * out or was lost), by the calls it would charge: `landed` and `lost` were learnt in
 * time, and its calls were answered accordingly; `unconfirmed` was not (its
 * calls answered 4000, `UnconfirmedCommit`), and `landed_late` or `lost_late`
 * is what the ledger later showed for those. `landed_late` calls were told
 * 4000 and are charged: an operator refunds them.
 */
export const ledgerCommitOutcomes = ["landed", "lost", "unconfirmed", "landed_late", "lost_late"] as const;
export type LedgerCommitOutcome = (typeof ledgerCommitOutcomes)[number];

/** A top-up whose reference the account's balance already took, for another amount: refused, nothing changed. */
export class BalanceReferenceConflict extends Error {
  override name = "BalanceReferenceConflict";
  readonly reference: string;
  /** What the top-up with this reference added. */
  readonly amount: Micros;

  constructor(reference: string, amount: Micros) {
    super(`the reference ${reference} was used by a top-up of another amount`);
    this.reference = reference;
    this.amount = amount;
  }
}

/** An account's balance and its recorded changes, as one moment left them (`Meter.balanceRecord`). */
export interface BalanceRecord {
  /** Undefined: not billed by balance. */
  readonly balance: Micros | undefined;
  readonly changes: readonly RecordedBalanceChange[];
}

/** A balance accounted for: each recorded change with what charged calls took from the balance between the change before and it, and what they took since the last. */
export interface BalanceAccounting {
  /** Oldest first. */
  readonly entries: readonly (RecordedBalanceChange & { readonly takenBefore: Micros })[];
  readonly takenSinceLast: Micros;
}

/**
 * What charged calls took between a balance's recorded changes: every change
 * that is not a call's price is recorded in the transaction that makes it,
 * so between two changes only calls moved the balance, and the differences
 * are exact. The operator's statement and a team's own read it alike.
 */
export function balanceAccounting(record: BalanceRecord): BalanceAccounting {
  let before = 0n;
  const entries = record.changes.map((c) => {
    const entry = { ...c, takenBefore: before - ((c.balance ?? 0n) - c.amount) };
    before = c.balance ?? 0n;
    return entry;
  });
  return { entries, takenSinceLast: record.balance === undefined ? 0n : before - record.balance };
}

/** Charged calls of one account: today, yesterday and every day before. */
export interface UsageSummary {
  readonly today: number;
  readonly yesterday: number;
  readonly before: number;
}

export interface UsageQuery {
  readonly account?: string | undefined;
  /** First and last day, inclusive, `YYYY-MM-DD`. */
  readonly from?: string | undefined;
  readonly to?: string | undefined;
  readonly operation?: string | undefined;
  readonly code?: ErrorCode | undefined;
  /** Also return the rows themselves, newest first, at most this many. */
  readonly rows?: number | undefined;
  /**
   * Only calls from this address or network (`usageAddressFilter`'s form):
   * rows, and totals of the days still kept row by row (totals folded past
   * retention keep no address, so none of them matches).
   */
  readonly address?: string | undefined;
  /** Totals per caller's address as well (`UsageTotal.clientIp`). */
  readonly byAddress?: boolean | undefined;
  /**
   * Only the call with this request id (its status block's `request_id`, the
   * id a 4000 asks the caller to quote): its row. Calls with no account,
   * counted rather than stored, and days folded past retention have none.
   */
  readonly requestId?: string | undefined;
  /**
   * Totals a page at a time (usage-pages.ts): at most `limit`, in the totals'
   * order, from just past `after` (undefined: the first), of the days from
   * `from` through `through` only (besides the filter's own days): a page
   * reads the days it lists, not the rest of the range. Undefined: every
   * total at once.
   */
  readonly totalsPage?: { readonly after?: TotalPlace | undefined; readonly limit: number; readonly days: { readonly from: string; readonly through: string } } | undefined;
}

/**
 * A usage total's place in the order totals are reported in: by day, account,
 * operation, code, charge and address (empty where the total has none), each
 * compared as the store compares text.
 */
export interface TotalPlace {
  readonly day: string;
  readonly account: string;
  readonly operation: string;
  readonly code: number;
  readonly charge: string;
  readonly clientIp: string;
}

export interface UsageTotal {
  readonly account: string | undefined;
  readonly day: string;
  readonly operation: string | undefined;
  readonly code: ErrorCode;
  readonly charge: ChargeClass;
  readonly calls: number;
  readonly amount: Micros;
  /** Of those calls, how many were answered from the response cache. */
  readonly cacheHits: number;
  /** The requests they sent to the upstream provider (`LedgerRow.upstreamRequests`). */
  readonly upstreamRequests: number;
  /**
   * With `byAddress`, the callers' address: empty where none is kept (rows
   * from before the ledger kept addresses, totals folded past retention),
   * `other` for calls with no account past the day's distinct addresses.
   */
  readonly clientIp?: string | undefined;
}

export interface UsageReport {
  readonly totals: readonly UsageTotal[];
  readonly rows: readonly LedgerRow[];
}

/** The first and last day a usage query can have a total on: bounds, not always days with one. */
export interface UsageDays {
  readonly first: string;
  readonly last: string;
}

/**
 * A row's place in the order calls are listed in page by page (`Meter.calls`):
 * by day, the newest first, and within a day by time, then request id, the
 * newest first. For one account that is simply the newest first (its days
 * follow its clock); across accounts of different zones, a day's calls come
 * together. It is the order of the ledger's indexes, so a page is read from
 * where the one before ended, never sorted from the range's start.
 */
export interface LedgerPlace {
  readonly day: string;
  readonly at: number;
  readonly requestId: string;
}

/**
 * A place in the order a store committed its ledger rows (`Meter.feed`),
 * written by the store that gave it and read only by it: the embedded
 * store's is a row's rowid, the shared store's its transaction
 * and request id (each store's `feed` says why that order holds).
 */
export type FeedPlace = string;

/** Every call, the charged ones, what they cost, how many the cache answered and what they bought upstream. */
export interface UsageSums {
  readonly calls: bigint;
  readonly chargedCalls: bigint;
  readonly amount: Micros;
  readonly cacheHits: bigint;
  readonly upstreamRequests: bigint;
}

/** The sums over usage totals. */
/** The page key (Meter.pageKey) as a store's row holds it, or why there is none. */
export function pageKeyOf(stored: Uint8Array | undefined): Uint8Array {
  if (stored === undefined) throw new Error("the store has no page key: its schema is older than this gateway's (gateway migrate)");
  return new Uint8Array(stored);
}

export function usageSums(totals: readonly UsageTotal[]): UsageSums {
  let calls = 0n;
  let chargedCalls = 0n;
  let amount = 0n;
  let cacheHits = 0n;
  let upstreamRequests = 0n;
  for (const t of totals) {
    calls += BigInt(t.calls);
    cacheHits += BigInt(t.cacheHits);
    upstreamRequests += BigInt(t.upstreamRequests);
    if (t.charge === "charged") chargedCalls += BigInt(t.calls);
    amount += t.amount;
  }
  return { calls, chargedCalls, amount, cacheHits, upstreamRequests };
}

/**
 * Limits and billing. `admit` lets a call through its account's concurrency
 * limit (4008), daily maximum (4013) and balance (4016), reserving a place
 * under each; `record` writes the call's ledger row and settles the
 * admission: a charged row counts against the day and deducts its price in
 * the same commit, anything else gives the reservation back. `record`
 * resolves only once the row is durable, and must be called exactly once
 * for every call, admitted or not. A call with no account is not stored
 * row by row: it is counted per day, code and address. Asynchronous where a
 * store may be remote; the decision to admit must be one atomic step in it.
 */
export interface Meter {
  /** Why new calls cannot be recorded now (the ledger cannot be written, the disk is nearly full), or undefined. */
  unavailable(now: number): string | undefined;
  /** The same reason as `unavailable`, read without side effects (it lets no probe call through): what readiness reports. */
  health(now: number): string | undefined;
  /** On every call's path, as `usage`: answered at once where the counters are in this process (MaybeAsync). */
  admit(account: Account, operation: OperationId, day: string): MaybeAsync<Admission>;
  /**
   * Takes a caller's idempotency key for a call, in one atomic step across
   * every replica (src/core/idempotency.ts), before the call meets the
   * limits: no two calls can take the same key, and a key kept for a
   * charged call (for `keptMs`) is answered as a replay of it.
   */
  claim(account: string, key: IdempotencyKey, now: number): MaybeAsync<KeyClaim>;
  /**
   * `key`: the idempotency key the call took, if it took one: kept with the
   * row, in the same commit, where the row is charged; given back otherwise,
   * and when the commit fails.
   */
  record(row: LedgerRow, admission: Admission | undefined, key?: TakenKey): Promise<void>;
  /**
   * The account's charged calls today, yesterday and before. A shared store
   * may answer a call's api_info from what it read up to a second ago;
   * `fresh` asks for the store's count now, exact across replicas (a team's
   * own read of its standing).
   */
  usage(account: string, today: string, yesterday: string, fresh?: boolean): MaybeAsync<UsageSummary>;
  /**
   * The rate's theoretical arrival time of the account as the meter decides
   * with it now (ns, call-rate.ts), read from the store where it is shared:
   * exact across replicas. Undefined: no call of the account is under its
   * rate now.
   */
  rateArrival(account: string): MaybeAsync<bigint | undefined>;
  query(query: UsageQuery): Promise<UsageReport>;
  /** The sums over every total `query` would give (its `rows`, `byAddress` and `totalsPage` are not read), in one read. */
  usageSums(query: UsageQuery): Promise<UsageSums>;
  /**
   * Days that hold every total of `query`, read from the indexes' ends (a few
   * lookups, whatever the range): by its account and days only, so there may
   * be days in them with none. Undefined: the query has no total.
   */
  usageDays(query: UsageQuery): Promise<UsageDays | undefined>;
  /**
   * The key QueryUsage's page tokens seal their sums with (core/usage-pages.ts): kept in the store, so it is
   * the same for every replica and outlives a restart.
   */
  pageKey(): Promise<Uint8Array>;
  /**
   * The ledger's rows that match `query`'s filters (account, days, operation,
   * code, address, request id; its `rows` and `byAddress` are not read), in
   * `LedgerPlace` order from just past `after` (undefined: the newest), at
   * most `limit` of them. Only calls made with an account are rows; days
   * folded past retention have none.
   */
  calls(query: UsageQuery, after: LedgerPlace | undefined, limit: number): Promise<LedgerRow[]>;
  /**
   * The ledger's rows in the order it committed them, from just past `after`
   * (a `FeedPlace` this store gave; undefined: from the oldest row it
   * holds), at most `limit` of them, and the place past the last (`after`,
   * or the place before every row, when none came). A row is given only
   * once it and every row before it in that order are committed, so no row
   * can later appear before a place already given. Throws `UsagePageError`
   * for a place this store did not give ("token"), and for one that rows
   * after it were folded past retention since ("folded").
   *
   * With `only`, the rows of one account among the next `scan` rows of that
   * order at most (a team's own feed, with no index of its own to read):
   * the place is past the last row given, or, with fewer than `limit`,
   * past the last row read, so a follower of an account with no call in
   * them moves on; `more` says the read stopped at `scan` with rows after.
   */
  feed(
    after: FeedPlace | undefined,
    limit: number,
    only?: { readonly account: string; readonly scan: number },
  ): Promise<{ readonly rows: readonly LedgerRow[]; readonly place: FeedPlace; readonly more?: boolean }>;
  /**
   * The place just past every row `feed` can give now: a follower that
   * starts there is given the calls committed from now on, none before
   * (a live tail), and misses none after. On the shared store a call that
   * committed a moment ago but is still held back (`feedHeldSince`) comes
   * after it too: the place is the last row given, never past one held.
   */
  feedEnd(): Promise<FeedPlace>;
  /**
   * Retention (`LedgerRetention`): folds the ledger rows of days before
   * `beforeDay` into per-day totals and deletes them, with the counted
   * refusals of those days; day counts (api_info) and balances stay.
   * Only the start of `feed`'s order is folded, so a follower's place is
   * past what went or refused ("folded"), never passed over a hole; a row
   * of an earlier day committed after a row kept stays until a later run.
   * Stops between steps once `signal` is aborted. Returns the rows removed.
   */
  expire(beforeDay: string, signal?: AbortSignal): MaybeAsync<number>;
  /**
   * When the oldest call that has committed but that `feed` still holds
   * back was made (epoch ms), or undefined when none is held. Only a store
   * whose commit order can run ahead of its readers has one (the shared
   * store: a write transaction left open in the database holds every later
   * commit from followers until it ends); the embedded store gives every
   * committed row at once.
   */
  feedHeldSince?(): Promise<number | undefined>;
  /**
   * Adds to an account's prepaid balance (a top-up), or makes it unbilled by
   * balance. The balance is the meter's own: charged calls deduct from it in
   * the commit that writes their rows, so the two never disagree.
   *
   * A commit takes an account's calls from its balance only where the
   * balance covers them. Admission reserves every call's
   * price, so a call admitted against a balance is always covered; what is
   * not is a call admitted while its account had no balance, whose first
   * top-up came while it ran and was smaller than the prices of its calls
   * in flight. Such a call is served and priced in the ledger like any call
   * of an unbilled account, and taken from no balance. Before, its
   * deduction broke the balance's `>= 0` check, which failed its commit: a
   * call already bought answered 4000, the ledger was reported unwritable,
   * and in shared mode every call of the same batch failed with it.
   */
  adjustBalance(account: string, change: BalanceChange): Promise<"applied" | "repeated">;
  /**
   * The account's balance now, and every change of it that was not a call's
   * price, oldest first (`BalanceChange`): read together, as one moment left
   * them, and not from what this process remembers of the account, so the
   * difference between the last change and the balance is what calls took
   * since, even just after a top-up made elsewhere.
   */
  balanceRecord(account: string): Promise<BalanceRecord>;
  /** The account's balance now, as the last commit left it, read from the store (undefined: not billed by balance); without its record. */
  balance(account: string): Promise<Micros | undefined>;
  /** Commits every queued row now; for shutdown. */
  flush(): void | Promise<void>;
}
