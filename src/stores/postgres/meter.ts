import { randomBytes } from "node:crypto";
import type pg from "pg";
import type { ChargeClass } from "../../contract/error-codes.ts";
import type { OperationId } from "../../contract/operations.ts";
import type { Account } from "../../core/accounts.ts";
import { BalanceReferenceConflict, pageKeyOf, UnconfirmedCommit, type LedgerCommitOutcome, type Admission, type BalanceChange, type BalanceRecord, type FeedPlace, type LedgerPlace, type LedgerRow, type Meter, type RecordedBalanceChange, type Transport, type UsageDays, type UsageQuery, type UsageReport, type UsageSums, type UsageSummary } from "../../core/meter.ts";
import { rateBounds } from "../../core/call-rate.ts";
import { balanceShort, concurrencyReached, dailyMaxReached, rateReached } from "../../core/limit-refusals.ts";
import type { Micros } from "../../core/money.ts";
import { addressesIn } from "../../core/allowed-addresses.ts";
import { RefusalAddresses } from "../../core/refusal-addresses.ts";
import { bounded, bulkStatementMs, callStatement, databaseFault, databaseUnreachable } from "./postgres-database.ts";
import type { ErrorCode } from "../../gen/gateway/catalogue/v1/status_pb.js";
import { keptMs, type IdempotencyKey, type KeyClaim, type TakenKey } from "../../core/idempotency.ts";
import { foldedPastCursor, UsagePageError } from "../../core/usage-pages.ts";

export interface PostgresMeterOptions {
  /** This replica's name on its leases. */
  readonly holder: string;
  /** How long a lease (and an idempotency key's hold) holds without renewal, on PostgreSQL's clock; a replica renews its own every third of it. A dead replica's slots come back after at most this. */
  readonly leaseMs: number;
  /** How long a ledger row may wait for its group commit; 0 commits at the end of each event-loop turn. */
  readonly commitIntervalMs: number;
  /** A batch this large commits at once. */
  readonly maxBatch: number;
  /** Distinct addresses counted per day (by this replica) for calls with no account; more count as "other". */
  readonly refusalAddressesPerDay: number;
  /** Told which accounts' balances this replica changed (top-ups), so what it remembers of them is dropped. */
  readonly onBalancesChanged: (accounts: ReadonlySet<string>) => void;
  readonly now: () => number;
  /** Told after each group commit of ledger rows: how long it took and how many rows it wrote. */
  readonly onCommit: (seconds: number, rows: number) => void;
  /** The lease table is vacuumed each time this replica's commits have settled this many leases since the last time (see `settled`); 0 never. */
  readonly vacuumEveryLeases: number;
  /** Told when a vacuum of the lease table failed (calls go on; the next one is tried after as many leases again). */
  readonly onVacuumFailed: (e: unknown) => void;
  /** Told what became of a commit sent and not answered: the request ids of the calls it would charge, and the outcome (see `settle`). */
  readonly onUnansweredCommit: (outcome: LedgerCommitOutcome, requestIds: readonly string[], cause: unknown) => void;
  /** How long the calls of a commit sent and not answered wait while its outcome is learnt (`settle`). */
  readonly settleMs: number;
  /** Retention folds this many ledger rows a transaction (`expire`). */
  readonly foldStepRows: number;
}

export const defaultPostgresMeterOptions: PostgresMeterOptions = {
  holder: "gw",
  leaseMs: 15_000,
  commitIntervalMs: 0,
  maxBatch: 512,
  refusalAddressesPerDay: 10_000,
  onBalancesChanged: () => {},
  now: Date.now,
  onCommit: () => {},
  vacuumEveryLeases: 5_000,
  onVacuumFailed: () => {},
  onUnansweredCommit: () => {},
  settleMs: 10_000,
  foldStepRows: 20_000,
};

/** How long each later attempt to learn an unconfirmed commit's outcome may take, and the pause between two. */
const lateSettleStepMs = 5000;

/**
 * Whether the server answered a statement with an error that rolled it back
 * (a constraint, a conflict, a cancel): an error of its own, not a lost or
 * timed-out connection, and not one that ends the session (class 57P, a
 * shutdown; class 08), which may come after the commit it ended.
 */
function refusedByServer(e: unknown): boolean {
  const { severity, code } = e as { severity?: unknown; code?: unknown };
  return severity !== undefined && typeof code === "string" && !code.startsWith("57P") && !code.startsWith("08");
}

/** Held by the replica that folds the ledger past retention, so one folds at a time ("fold"). */
const retentionLock = 0x666f6c64;

/** A call waiting for its admission to be decided. */
interface Waiting {
  readonly lease: string;
  readonly price: bigint;
  /** The statement's verdict for this call, and the `now` (ms) it decided at. */
  resolve(verdict: { readonly text: string; readonly at: number }): void;
  reject(e: unknown): void;
}

/** The calls of one account and day waiting for a decision, and since when one is being made (performance.now()). */
interface AdmissionGroup {
  account: Account;
  readonly day: string;
  waiting: Waiting[];
  decidingSince: number | undefined;
}

/**
 * A decision still in flight after this long is taken as stuck (a connection
 * that stopped answering, say): the calls waiting behind it get a statement
 * of their own, on another connection, rather than waiting for it.
 */
const stuckDecisionMs = 1000;

function decidingNow(group: AdmissionGroup): boolean {
  return group.decidingSince !== undefined && performance.now() - group.decidingSince < stuckDecisionMs;
}

interface Queued {
  readonly row: LedgerRow;
  readonly admission: Admission | undefined;
  /** The idempotency key the call took: kept by the commit where the row is charged, given back by it otherwise. */
  readonly key: TakenKey | undefined;
  readonly done: { resolve(): void; reject(e: unknown): void };
}

/** How often a replica deletes the idempotency keys kept longer than `keptMs`, and holds that lapsed. */
const keyPruneEveryMs = 60_000;


/**
 * A decision as one statement, committed without waiting for its WAL to
 * reach the disk (synchronous_commit off, for this transaction only). The
 * account's admission lock is held until the commit, so a decision that
 * waited for the disk made every other replica's decision for that account
 * wait as well. What a decision writes is leases, not charges: the charge
 * is the ledger's commit, which stays synchronous, and its flush carries
 * every decision committed before it. Only a PostgreSQL crash can lose a
 * decision (one committed after the last flush, a few milliseconds under
 * load), and its call is in flight then: if that call can still commit
 * after the restart (it ran that long), its row is written, and until then
 * the limits did not count it. So a crash can let through, once, at most
 * as many extra calls as it lost leases; without a crash nothing changes.
 */
const admitStatement = "SELECT gw_admit_many($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) AS v, set_config('synchronous_commit', 'off', true)";

/**
 * A batch's commit as one statement, so one round trip and one implicit
 * transaction: the ledger rows, each account's charged calls added to its
 * day, the prices deducted from the balances, the calls with no account
 * counted per day, code and address, and the batch's leases deleted. Each
 * part reads only its own parameters, and every key of an upsert appears
 * once in its arrays (they are summed before), so the parts do not depend
 * on one another's order. An empty array makes its part write nothing.
 */
const commitStatement = `WITH
  ledger_rows AS (
    INSERT INTO ledger (request_id, at, day, account, operation, error_code, charge, price, cache_hit, latency_us, transport, client_ip, upstream_requests)
    SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $5::text[], $6::integer[], $7::text[], $8::bigint[], $9::boolean[], $10::bigint[], $11::text[], $25::text[], $34::integer[])),
  days AS (
    INSERT INTO usage_daily (account, day, charged) SELECT * FROM unnest($12::text[], $13::text[], $14::bigint[])
    ON CONFLICT (account, day) DO UPDATE SET charged = usage_daily.charged + excluded.charged),
  spent AS (
    UPDATE balances b SET micros = b.micros - d.amount FROM unnest($15::text[], $16::bigint[]) AS d (account, amount) WHERE b.account = d.account AND b.micros >= d.amount),
  refused AS (
    INSERT INTO refusals (day, operation, error_code, charge, client_ip, transport, calls)
    SELECT * FROM unnest($17::text[], $18::text[], $19::integer[], $20::text[], $21::text[], $22::text[], $23::bigint[])
    ON CONFLICT (day, operation, error_code, client_ip, transport) DO UPDATE SET calls = refusals.calls + excluded.calls),
  settled AS (
    DELETE FROM admissions WHERE lease = ANY($24::text[])),
  kept AS (
    UPDATE idempotency_keys k SET request_id = d.request_id, token = NULL, expires_at = NULL, at = d.at
    FROM unnest($26::text[], $27::text[], $28::text[], $29::text[], $30::bigint[]) AS d (account, key, token, request_id, at)
    WHERE k.account = d.account AND k.key = d.key AND k.token = d.token),
  released AS (
    DELETE FROM idempotency_keys k USING unnest($31::text[], $32::text[], $33::text[]) AS d (account, key, token)
    WHERE k.account = d.account AND k.key = d.key AND k.token = d.token)
SELECT 1`;

/**
 * The meter of the shared store, exact across any number of replicas. Every
 * decision to admit is one statement (gw_admit_many) deciding and reserving under
 * a per-account lock in PostgreSQL; the reservation is a lease that this
 * replica renews while the call runs and that the commit writing the call's
 * ledger row deletes, in the same transaction that counts the call against
 * its day and deducts its price (and keeps its idempotency key, where it
 * took one). Rows are group-committed: one multi-row write per batch. A store that cannot be reached refuses new calls (4000)
 * instead of guessing.
 */
export class PostgresMeter implements Meter {
  private readonly pool: pg.Pool;
  private pageKeyBytes: Uint8Array | undefined;
  private readonly options: PostgresMeterOptions;
  private queue: Queued[] = [];
  private committing: Promise<void> | undefined;
  private timer: { cancel(): void } | undefined;
  private readonly held = new Set<string>();
  /** The tokens of the idempotency keys this replica's calls in flight hold: renewed with the leases. */
  private readonly heldKeys = new Set<string>();
  private nextKeyPrune = 0;
  private readonly renewal: NodeJS.Timeout;
  private readonly unstick: NodeJS.Timeout;
  /** When a statement last failed to reach the database (Unix ms), or undefined. */
  private failedAt: number | undefined;
  private readonly refusalAddresses: RefusalAddresses;
  /** Admissions waiting for a decision, per account and day, and whether one is being made. */
  private readonly admitting = new Map<string, AdmissionGroup>();
  private admitScheduled = false;
  /**
   * Lease names: a prefix drawn once per meter (96 random bits, so no two
   * replicas or restarts share one) and a counter. A name only has to be
   * unique; drawing 12 random bytes a call had cost 5% of a replica's busy time.
   */
  private readonly leasePrefix = randomBytes(12).toString("base64url");
  private leases = 0;
  /** Leases this replica's commits settled since it last vacuumed the lease table, and whether a vacuum is running. */
  private settledSinceVacuum = 0;
  private vacuuming = false;
  private closed = false;
  /** Usage reads in flight, one per account and day. */
  private readonly summing = new Map<string, Promise<UsageSummary>>();
  /** What this replica last read of each account's counts (for api_info), with its own charged calls added since. */
  private readonly summaries = new Map<string, { today: string; summary: { today: number; yesterday: number; before: number }; at: number }>();

  constructor(pool: pg.Pool, options: Partial<PostgresMeterOptions> = {}) {
    this.pool = pool;
    this.options = { ...defaultPostgresMeterOptions, ...options };
    this.refusalAddresses = new RefusalAddresses(this.options.refusalAddressesPerDay);
    this.renewal = setInterval(() => void this.renew(), Math.max(100, Math.floor(this.options.leaseMs / 3)));
    this.renewal.unref();
    // Calls waiting behind a stuck decision go ahead without it (see stuckDecisionMs).
    this.unstick = setInterval(() => {
      for (const group of this.admitting.values()) {
        if (group.waiting.length > 0 && group.decidingSince !== undefined && !decidingNow(group)) this.scheduleDecision();
      }
    }, stuckDecisionMs / 2);
    this.unstick.unref();
  }

  /** Refuses for a second after the database failed to answer; then a call goes through and tries again. */
  unavailable(now: number): string | undefined {
    return this.failedAt !== undefined && now - this.failedAt < 1000 ? databaseUnreachable : undefined;
  }

  health(now: number): string | undefined {
    return this.unavailable(now);
  }

  async admit(account: Account, operation: OperationId, day: string): Promise<Admission> {
    const price = account.prices.get(operation) ?? 0n;
    const lease = `${this.leasePrefix}${(this.leases++).toString(36)}`;
    const verdict = await new Promise<{ readonly text: string; readonly at: number }>((resolve, reject) => {
      const k = `${account.key}\u0000${day}`;
      let group = this.admitting.get(k);
      if (group === undefined) {
        group = { account, day, waiting: [], decidingSince: undefined };
        this.admitting.set(k, group);
      }
      group.account = account;
      group.waiting.push({ lease, price, resolve, reject });
      if (!decidingNow(group)) this.scheduleDecision();
    });
    const [what, n, tat] = verdict.text.split(" ");
    if (what === "concurrency") throw concurrencyReached(n ?? "");
    if (what === "daily") throw dailyMaxReached(account);
    if (what === "balance") throw balanceShort(BigInt(n ?? "0"), price, operation);
    if (what === "rate" && account.rate !== undefined) throw rateReached(account.rate, Number(n) / 1e6);
    this.held.add(lease);
    // `ok <the day's calls> [<the rate's arrival time>]` (schema step 15), decided at the `now` the statement was given.
    const dayCount = n === undefined ? undefined : Number(n);
    const rate = tat === undefined ? undefined : { tat: BigInt(tat), at: verdict.at };
    return { account: account.key, day, price, lease, dayCount, rate };
  }

  /**
   * Decides the admissions asked for since the last decision: one statement
   * per account and day, taking the account's lock once for all of its
   * calls, in the order they came. An account and day has one statement in
   * flight at a time; calls that come meanwhile wait for the next, so under
   * load each statement decides more calls, rather than more statements
   * queueing on the account's lock in PostgreSQL.
   */
  private decide(): void {
    this.admitScheduled = false;
    for (const [k, group] of this.admitting) {
      if (decidingNow(group)) continue;
      if (group.waiting.length === 0) {
        if (group.decidingSince !== undefined) continue; // a stuck decision's group stays until it ends
        this.admitting.delete(k);
        continue;
      }
      const { account, day, waiting } = group;
      group.waiting = [];
      const since = performance.now();
      group.decidingSince = since;
      void this.decideGroup(group, since, account, day, waiting);
    }
  }

  private async decideGroup(group: AdmissionGroup, since: number, account: Account, day: string, waiting: Waiting[]): Promise<void> {
    try {
      // The rate limit's interval and tolerance in ns (0: none), decided in the same statement (schema step 11).
      const bounds = account.rate === undefined ? { interval: 0n, tolerance: 0n } : rateBounds(account.rate);
      const at = this.options.now();
      const r = await this.pool.query<{ v: string[] }>(callStatement(admitStatement, [
        waiting.map((w) => w.lease), account.key, day, waiting.map((w) => w.price.toString()), account.dailyMax, account.concurrency,
        this.options.holder, at, this.options.leaseMs,
        bounds.interval.toString(), bounds.tolerance.toString(),
      ], "gw_admit_many_rated"));
      this.clearProblem();
      waiting.forEach((w, i) => w.resolve({ text: r.rows[0]!.v[i]!, at }));
    } catch (e) {
      this.setProblem();
      for (const w of waiting) w.reject(databaseFault(e));
    } finally {
      if (group.decidingSince === since) group.decidingSince = undefined;
      this.scheduleDecision();
    }
  }

  /** Runs `decide` once, at the end of this turn of the event loop. */
  private scheduleDecision(): void {
    if (this.admitScheduled) return;
    this.admitScheduled = true;
    setImmediate(() => this.decide());
  }

  /** One statement (gw_claim_key, schema step 16): the key's check and its taking under its row's lock. */
  async claim(account: string, key: IdempotencyKey, now: number): Promise<KeyClaim> {
    const token = `${this.leasePrefix}k${(this.leases++).toString(36)}`;
    let verdict: string;
    try {
      const r = await this.pool.query<{ v: string }>(
        callStatement("SELECT gw_claim_key($1, $2, $3, $4, $5, $6, $7) AS v", [account, key.key, key.fingerprint, token, now, this.options.leaseMs, keptMs], "gw_claim_key"),
      );
      this.clearProblem();
      verdict = r.rows[0]!.v;
    } catch (e) {
      this.setProblem();
      throw databaseFault(e);
    }
    if (verdict === "taken") {
      this.heldKeys.add(token);
      return { kind: "taken", key, token };
    }
    if (verdict.startsWith("replay ")) return { kind: "replay", requestId: verdict.slice(7) };
    return verdict === "other" ? { kind: "other_request" } : { kind: "in_flight" };
  }

  record(row: LedgerRow, admission: Admission | undefined, key?: TakenKey): Promise<void> {
    return new Promise((resolve, reject) => {
      this.queue.push({ row, admission, key, done: { resolve, reject } });
      if (this.queue.length >= this.options.maxBatch) void this.flush();
      else this.schedule();
    });
  }

  async adjustBalance(account: string, change: BalanceChange): Promise<"applied" | "repeated"> {
    if (change.kind !== "unbilled" && change.reference !== undefined) return this.referencedTopUp(account, change, change.reference);
    // The change and its record in one statement, so one transaction.
    if (change.kind === "unbilled") {
      await this.pool.query(
        `WITH dropped AS (DELETE FROM balances WHERE account = $1 RETURNING micros)
         INSERT INTO balance_changes (account, at, kind, amount, balance, actor) SELECT $1, $2, 'unbilled', -micros, NULL, $3 FROM dropped`,
        [account, String(change.at), change.by ?? null],
      );
    } else {
      await this.pool.query(
        `WITH added AS (
           INSERT INTO balances (account, micros) VALUES ($1, $2) ON CONFLICT (account) DO UPDATE SET micros = balances.micros + excluded.micros RETURNING micros)
         INSERT INTO balance_changes (account, at, kind, amount, balance, actor) SELECT $1, $3, $4, $2, micros, $5 FROM added`,
        [account, change.amount.toString(), String(change.at), change.kind, change.by ?? null],
      );
    }
    this.options.onBalancesChanged(new Set([account]));
    return "applied";
  }

  /**
   * A top-up named by a reference: made once per account and reference.
   * Copies that arrive at once on any replicas may all find no change with
   * the reference; the balance's row lock lines their statements up, the
   * unique index on (account, reference) lets the first one's record in,
   * and each later one fails there (one statement, so its own addition is
   * rolled back with it) and reads the first.
   */
  private async referencedTopUp(account: string, change: Extract<BalanceChange, { kind: "opening" | "top-up" }>, reference: string): Promise<"applied" | "repeated"> {
    const made = async (): Promise<"repeated" | undefined> => {
      const r = await this.pool.query<{ amount: string }>("SELECT amount::text AS amount FROM balance_changes WHERE account = $1 AND reference = $2", [account, reference]);
      if (r.rows[0] === undefined) return undefined;
      if (BigInt(r.rows[0].amount) !== change.amount) throw new BalanceReferenceConflict(reference, BigInt(r.rows[0].amount));
      return "repeated";
    };
    if ((await made()) !== undefined) return "repeated";
    try {
      await this.pool.query(
        `WITH added AS (
           INSERT INTO balances (account, micros) VALUES ($1, $2) ON CONFLICT (account) DO UPDATE SET micros = balances.micros + excluded.micros RETURNING micros)
         INSERT INTO balance_changes (account, at, kind, amount, balance, actor, reference) SELECT $1, $3, $4, $2, micros, $5, $6 FROM added`,
        [account, change.amount.toString(), String(change.at), change.kind, change.by ?? null, reference],
      );
    } catch (e) {
      if ((e as { code?: string }).code !== "23505" /* unique_violation: another made it first */) throw e;
      const repeated = await made();
      if (repeated === undefined) throw e;
      return repeated;
    }
    this.options.onBalancesChanged(new Set([account]));
    return "applied";
  }

  async balance(account: string): Promise<Micros | undefined> {
    const r = await this.pool.query<{ micros: string }>("SELECT micros::text AS micros FROM balances WHERE account = $1", [account]);
    return r.rows[0] === undefined ? undefined : BigInt(r.rows[0].micros);
  }

  async balanceRecord(account: string): Promise<BalanceRecord> {
    // One statement, so one snapshot: the balance and its changes as one moment left them.
    type Change = { at: string; kind: RecordedBalanceChange["kind"]; amount: string; balance: string | null; actor: string | null; reference: string | null };
    const r = await this.pool.query<{ balance: string | null; changes: Change[] }>(
      `SELECT (SELECT micros::text FROM balances WHERE account = $1) AS balance,
         coalesce((SELECT json_agg(json_build_object('at', at::text, 'kind', kind, 'amount', amount::text, 'balance', balance::text, 'actor', actor, 'reference', reference) ORDER BY id)
           FROM balance_changes WHERE account = $1), '[]'::json) AS changes`,
      [account],
    );
    const row = r.rows[0]!;
    return {
      balance: row.balance === null ? undefined : BigInt(row.balance),
      changes: row.changes.map((c) => ({ at: Number(c.at), kind: c.kind, amount: BigInt(c.amount), balance: c.balance === null ? undefined : BigInt(c.balance), by: c.actor ?? "", reference: c.reference ?? "" })),
    };
  }

  /**
   * The account's charged calls, for api_info: read at most once a second per
   * account by this replica, with the calls it committed itself since added,
   * so other replicas' calls show within a second. `fresh`: read now.
   */
  async usage(account: string, today: string, yesterday: string, fresh = false): Promise<UsageSummary> {
    const now = this.options.now();
    if (fresh) return { ...(await this.sum(account, today, yesterday, now)) };
    const known = this.summaries.get(account);
    if (known !== undefined && known.today === today && now - known.at < 1000) return { ...known.summary };
    // One query per account and day at a time: the calls that find the summary stale together share its reread.
    const k = `${account}\u0000${today}\u0000${yesterday}`;
    let summing = this.summing.get(k);
    if (summing === undefined) {
      summing = this.sum(account, today, yesterday, now).finally(() => this.summing.delete(k));
      this.summing.set(k, summing);
    }
    return { ...(await summing) };
  }

  async rateArrival(account: string): Promise<bigint | undefined> {
    const r = await this.pool.query<{ tat: string }>(callStatement("SELECT tat::text AS tat FROM rate_arrivals WHERE account = $1", [account]));
    return r.rows[0] === undefined ? undefined : BigInt(r.rows[0].tat);
  }

  private async sum(account: string, today: string, yesterday: string, now: number): Promise<UsageSummary> {
    const r = await this.pool.query<{ today: string; yesterday: string; before: string }>(
      callStatement(
        `SELECT coalesce(sum(charged) FILTER (WHERE day = $2), 0)::text AS today,
                coalesce(sum(charged) FILTER (WHERE day = $3), 0)::text AS yesterday,
                coalesce(sum(charged) FILTER (WHERE day < $3), 0)::text AS before
           FROM usage_daily WHERE account = $1`,
        [account, today, yesterday],
      ),
    );
    const s = r.rows[0]!;
    const summary = { today: Number(s.today), yesterday: Number(s.yesterday), before: Number(s.before) };
    if (this.summaries.size >= 100_000) this.summaries.clear();
    // A read that started before the one kept does not replace it.
    const kept = this.summaries.get(account);
    if (kept === undefined || kept.today !== today || kept.at <= now) this.summaries.set(account, { today, summary, at: now });
    return summary;
  }

  async query(q: UsageQuery): Promise<UsageReport> {
    const page = q.totalsPage;
    const after = page?.after;
    // A page reads only its days (the totals are by day first).
    const { where, params, refusals, folded } = await this.ledgerFilter(q, page?.days);
    const filter = (w: string[]) => (w.length > 0 ? `WHERE ${w.join(" AND ")}` : "");
    const address = (column: string) => (q.byAddress ? column : "''");
    const parts = [
      `SELECT coalesce(account, '') AS account, day, coalesce(operation, '') AS operation, error_code, charge, ${address("coalesce(client_ip, '')")} AS client_ip,
         count(*) AS calls, sum(price) AS amount, count(*) FILTER (WHERE cache_hit) AS cache_hits, sum(upstream_requests) AS upstream_requests FROM ledger ${filter(where)} GROUP BY 1, 2, 3, 4, 5, 6`,
      // Folded past retention, with no address: no address filter matches them.
      ...(folded ? [`SELECT account, day, operation, error_code, charge, '' AS client_ip, calls, amount, cache_hits, upstream_requests FROM ledger_daily_totals ${filter(where)}`] : []),
      ...(refusals ? [`SELECT '' AS account, day, operation, error_code, charge, ${address("client_ip")} AS client_ip, calls, 0 AS amount, 0 AS cache_hits, 0 AS upstream_requests FROM refusals ${filter(where)}`] : []),
    ];
    const order = 'ORDER BY day, account, operation, error_code, charge, client_ip COLLATE "C"';
    // A page of totals is read on from where the one before ended (in the totals' order).
    const pageParams = page === undefined ? params : [...params, ...(after === undefined ? [] : [after.day, after.account, after.operation, after.code, after.charge, after.clientIp])];
    const at = (k: number) => `$${params.length + k}`;
    const grouped = `SELECT account, day, operation, error_code, charge, client_ip, sum(calls)::text AS calls, sum(amount)::text AS amount, sum(cache_hits)::text AS cache_hits, sum(upstream_requests)::text AS upstream_requests
        FROM (${parts.join(" UNION ALL ")}) t GROUP BY account, day, operation, error_code, charge, client_ip`;
    const totals = await this.pool.query<Record<string, string>>(
      page === undefined
        ? `${grouped} ${order}`
        : `SELECT * FROM (${grouped}) g ${after === undefined ? "" : `WHERE (day, account, operation, error_code, charge, client_ip COLLATE "C") > (${[1, 2, 3, 4, 5, 6].map(at).join(", ")})`} ${order} LIMIT ${Math.max(0, Math.floor(page.limit))}`,
      pageParams,
    );
    const rows = q.rows ? await this.pool.query<Record<string, unknown>>(`${ledgerRows} ${filter(where)} ${inPlaceOrder} LIMIT ${Math.max(0, Math.floor(q.rows))}`, params) : undefined;
    return {
      totals: totals.rows.map((t) => ({
        account: t.account || undefined,
        day: t.day!,
        operation: t.operation || undefined,
        code: Number(t.error_code) as ErrorCode,
        charge: t.charge as ChargeClass,
        calls: Number(t.calls),
        amount: BigInt(t.amount!),
        cacheHits: Number(t.cache_hits),
        upstreamRequests: Number(t.upstream_requests),
        ...(q.byAddress ? { clientIp: t.client_ip! } : {}),
      })),
      rows: (rows?.rows ?? []).map(rowFromSql),
    };
  }

  async usageSums(q: UsageQuery): Promise<UsageSums> {
    const { where, params, refusals, folded } = await this.ledgerFilter(q);
    const filter = where.length > 0 ? `WHERE ${where.join(" AND ")}` : "";
    // Summed where they are, not grouped first: one pass over the range's rows.
    const parts = [
      `SELECT count(*) AS calls, count(*) FILTER (WHERE charge = 'charged') AS charged, sum(price) AS amount, count(*) FILTER (WHERE cache_hit) AS cache_hits, sum(upstream_requests) AS upstream_requests FROM ledger ${filter}`,
      ...(folded ? [`SELECT sum(calls), sum(calls) FILTER (WHERE charge = 'charged'), sum(amount), sum(cache_hits), sum(upstream_requests) FROM ledger_daily_totals ${filter}`] : []),
      ...(refusals ? [`SELECT sum(calls), sum(calls) FILTER (WHERE charge = 'charged'), 0, 0, 0 FROM refusals ${filter}`] : []),
    ];
    const { rows } = await this.pool.query<Record<string, string>>(
      `SELECT coalesce(sum(calls), 0)::text AS calls, coalesce(sum(charged), 0)::text AS charged, coalesce(sum(amount), 0)::text AS amount, coalesce(sum(cache_hits), 0)::text AS cache_hits, coalesce(sum(upstream_requests), 0)::text AS upstream_requests FROM (${parts.join(" UNION ALL ")}) t`,
      params,
    );
    const sum = rows[0]!;
    return { calls: BigInt(sum.calls!), chargedCalls: BigInt(sum.charged!), amount: BigInt(sum.amount!), cacheHits: BigInt(sum.cache_hits!), upstreamRequests: BigInt(sum.upstream_requests!) };
  }

  /** Read on first use (core/meter.ts Meter.pageKey); a read that failed is tried again next time. */
  async pageKey(): Promise<Uint8Array> {
    this.pageKeyBytes ??= pageKeyOf((await this.pool.query<{ key: Buffer }>("SELECT key FROM page_keys WHERE name = 'usage-sums'")).rows[0]?.key);
    return this.pageKeyBytes;
  }

  async usageDays(q: UsageQuery): Promise<UsageDays | undefined> {
    const where: string[] = [];
    const params: unknown[] = [];
    if (q.from !== undefined) where.push(`day >= $${params.push(q.from)}`);
    if (q.to !== undefined) where.push(`day <= $${params.push(q.to)}`);
    const withAccount = q.account === undefined ? where : [...where, `account = $${params.push(q.account)}`];
    // Each a lookup at one end of an index, not a read of the range.
    const ends = (table: string, w: string[]) => {
      const filter = w.length > 0 ? `WHERE ${w.join(" AND ")}` : "";
      return `SELECT (SELECT min(day) FROM ${table} ${filter}) AS first, (SELECT max(day) FROM ${table} ${filter}) AS last`;
    };
    const { rows } = await this.pool.query<{ first: string | null; last: string | null }>(
      `SELECT min(first) AS first, max(last) AS last FROM (${[ends("ledger", withAccount), ends("ledger_daily_totals", withAccount), ...(q.account === undefined ? [ends("refusals", where)] : [])].join(" UNION ALL ")}) t`,
      params,
    );
    const days = rows[0]!;
    return days.first === null || days.last === null ? undefined : { first: days.first, last: days.last };
  }

  async calls(q: UsageQuery, after: LedgerPlace | undefined, limit: number): Promise<LedgerRow[]> {
    const { where, params } = await this.ledgerFilter(q);
    if (after !== undefined) {
      // Where the page before ended, as the indexes order the rows (LedgerPlace): the index is entered there, and
      // only the calls of the page's last millisecond are sorted (by request id).
      const [d, a, r] = [params.push(after.day), params.push(after.at), params.push(after.requestId)];
      where.push(`(day, at) <= ($${d}, $${a})`, `(day, at, request_id COLLATE "C") < ($${d}, $${a}, $${r})`);
    }
    const rows = await this.pool.query<Record<string, unknown>>(
      `${ledgerRows} ${where.length > 0 ? `WHERE ${where.join(" AND ")}` : ""} ${inPlaceOrder} LIMIT ${Math.max(0, Math.floor(limit))}`,
      params,
    );
    return rows.rows.map(rowFromSql);
  }

  /**
   * The first row `feed` holds back, in its order: committed, at or past the
   * snapshot's xmin, so a transaction begun before its own is still open.
   * One entry into the feed's index. Its time is when its call was made,
   * milliseconds before its commit.
   */
  async feedHeldSince(): Promise<number | undefined> {
    const { rows } = await this.pool.query<{ at: string }>(
      `SELECT at::text AS at FROM ledger WHERE txid >= pg_snapshot_xmin(pg_current_snapshot()) ORDER BY txid, request_id COLLATE "C" LIMIT 1`,
    );
    return rows[0] === undefined ? undefined : Number(rows[0].at);
  }

  /**
   * The ledger in commit order, across every replica: each row holds the id
   * of the transaction that wrote it (a batch's commit is one), and rows come
   * by transaction, then request id. Transactions commit out of their ids'
   * order, so a row is given only when its id is below the snapshot's xmin:
   * every transaction below it has ended, and none can add a row there
   * later. A transaction still open holds back the rows after it until it
   * ends; a commit is one statement, so that is milliseconds, unless a
   * session leaves a write transaction open in the database. Rows from
   * before the shared store kept transaction ids hold 0 and come first.
   *
   * The fold mark (`expire`) is read after the rows: a fold that deleted
   * rows after `after` before the rows were read had moved the mark past
   * `after` before the mark is read, so such a read is refused ("folded"),
   * never given with a hole. (One that comes between the two reads refuses
   * a read that was whole: the follower starts again, as told, and loses
   * nothing.)
   *
   * The transaction id is read back as text under a name of its own
   * (`txid_text`), here and wherever the order is read: an ORDER BY takes an
   * output column's name first, and under `txid` the text ordered the page
   * ("100000" before "99999"). When the server's ids gained a digit, that
   * gave a row twice, and a full page could pass over rows.
   */
  async feed(after: FeedPlace | undefined, limit: number, only?: { readonly account: string; readonly scan: number }): Promise<{ rows: LedgerRow[]; place: FeedPlace; more?: boolean }> {
    const from = after === undefined ? { txid: "0", requestId: "" } : feedPlace(after);
    const take = Math.max(0, Math.floor(limit));
    if (only !== undefined) return this.accountFeed(after, from, take, only);
    const rows = await this.pool.query<Record<string, unknown>>(
      `SELECT txid::text AS txid_text, ${ledgerColumns} FROM ledger
       WHERE (txid, request_id COLLATE "C") > ($1::xid8, $2::text) AND txid < pg_snapshot_xmin(pg_current_snapshot())
       ORDER BY txid, request_id COLLATE "C" LIMIT ${take}`,
      [from.txid, from.requestId],
    );
    const mark = await this.foldMark(from);
    if (after !== undefined && mark?.passed === true) throw foldedPastCursor();
    const last = rows.rows.at(-1);
    if (last !== undefined) return { rows: rows.rows.map(rowFromSql), place: `p${String(last.txid_text)}.${String(last.request_id)}` };
    return { rows: [], place: mark?.passed === true ? `p${mark.txid}.${mark.request_id}` : `p${from.txid}.${from.requestId}` };
  }

  /**
   * The last row `feed` can give now (below the snapshot's xmin, as `feed`
   * reads): one entry into the commit order's index, from its end. Rows
   * held back behind a transaction still open are after it, so a follower
   * starting there is given them once they are released. With no such row,
   * the fold mark: retention folded every row, or none was written.
   */
  async feedEnd(): Promise<FeedPlace> {
    const { rows } = await this.pool.query<{ txid: string; request_id: string }>(
      `SELECT coalesce(last.txid, f.folded_txid)::text AS txid, coalesce(last.request_id, f.folded_request_id) AS request_id
       FROM ledger_feed f LEFT JOIN LATERAL (
         SELECT txid, request_id FROM ledger WHERE txid < pg_snapshot_xmin(pg_current_snapshot())
         ORDER BY txid DESC, request_id COLLATE "C" DESC LIMIT 1
       ) last ON true`,
    );
    const end = rows[0];
    return end === undefined ? "p0." : `p${end.txid}.${end.request_id}`;
  }

  /** Where retention's fold has reached in `feed`'s order, and whether it is past `from` (a cursor rows after which are gone). */
  private async foldMark(from: { readonly txid: string; readonly requestId: string }): Promise<{ txid: string; request_id: string; passed: boolean } | undefined> {
    const marks = await this.pool.query<{ txid: string; request_id: string; passed: boolean }>(
      `SELECT folded_txid::text AS txid, folded_request_id AS request_id, (folded_txid, folded_request_id COLLATE "C") > ($1::xid8, $2::text) AS passed FROM ledger_feed`,
      [from.txid, from.requestId],
    );
    return marks.rows[0];
  }

  /**
   * One account's rows of `feed`'s order, among the next `scan` rows at most:
   * the last of those rows is found first (an index-only read along the
   * order, below the snapshot's xmin as `feed`'s), then the account's rows
   * up to it, along the commit order's index (`account || ''` keeps the
   * account's index out: it would read every row of the account for each
   * answer). Every row up to it is committed, so a second statement sees
   * what the first did; the fold mark is read last, so rows folded between
   * the two are told as a cursor passed over, never skipped.
   */
  private async accountFeed(
    after: FeedPlace | undefined,
    from: { readonly txid: string; readonly requestId: string },
    take: number,
    only: { readonly account: string; readonly scan: number },
  ): Promise<{ rows: LedgerRow[]; place: FeedPlace; more: boolean }> {
    const scan = Math.max(1, Math.floor(only.scan));
    const tail = await this.pool.query<{ txid_text: string; request_id: string; read: string }>(
      `SELECT txid::text AS txid_text, request_id, count(*) OVER ()::text AS read FROM (
         SELECT txid, request_id FROM ledger
         WHERE (txid, request_id COLLATE "C") > ($1::xid8, $2::text) AND txid < pg_snapshot_xmin(pg_current_snapshot())
         ORDER BY txid, request_id COLLATE "C" LIMIT ${scan}
       ) w ORDER BY txid DESC, request_id COLLATE "C" DESC LIMIT 1`,
      [from.txid, from.requestId],
    );
    const end = tail.rows[0];
    const rows =
      end === undefined
        ? []
        : (
            await this.pool.query<Record<string, unknown>>(
              `SELECT txid::text AS txid_text, ${ledgerColumns} FROM ledger
               WHERE (txid, request_id COLLATE "C") > ($1::xid8, $2::text) AND (txid, request_id COLLATE "C") <= ($3::xid8, $4::text) AND account || '' = $5
               ORDER BY txid, request_id COLLATE "C" LIMIT ${take}`,
              [from.txid, from.requestId, end.txid_text, end.request_id, only.account],
            )
          ).rows;
    const mark = await this.foldMark(from);
    if (after !== undefined && mark?.passed === true) throw foldedPastCursor();
    const last = rows.at(-1);
    const full = take > 0 && rows.length === take;
    if (full) return { rows: rows.map(rowFromSql), place: `p${String(last!.txid_text)}.${String(last!.request_id)}`, more: false };
    if (end !== undefined) return { rows: rows.map(rowFromSql), place: `p${end.txid_text}.${end.request_id}`, more: Number(end.read) >= scan };
    return { rows: [], place: mark?.passed === true ? `p${mark.txid}.${mark.request_id}` : `p${from.txid}.${from.requestId}`, more: false };
  }

  /**
   * Retention (`Meter.expire`), by one replica at a time (an advisory lock;
   * a replica that finds it held skips the run), in steps of `foldStepRows`
   * rows: each step one transaction that adds its rows to the per-day
   * totals, deletes them and moves the fold mark, so a query or a follower
   * sees a step whole or not at all, and a stop between steps (`signal`, a
   * failure) leaves nothing half done.
   *
   * What is folded is the start of `feed`'s order up to the first row of
   * `beforeDay` or later, among the rows below the snapshot's xmin: every
   * transaction below it has ended, so no row can still appear in the part
   * folded (a write transaction left open holds the fold back, as it holds
   * followers). Unlike SQLite's rowids, transaction ids never start again,
   * so the newest row need not stay. Rows written before transaction ids
   * were kept (0) are in request-id order among themselves: an old one after
   * a kept one waits for it.
   */
  async expire(beforeDay: string, signal?: AbortSignal): Promise<number> {
    const client = await this.pool.connect();
    let usable = true;
    try {
      const locked = await client.query<{ locked: boolean }>("SELECT pg_try_advisory_lock($1) AS locked", [retentionLock]);
      if (locked.rows[0]?.locked !== true) return 0;
      try {
        // `day COLLATE "C"` keeps the day's index out: the first kept row is looked for from the start of the commit
        // order, so the cost is the rows folded, not the days kept.
        const bounds = await client.query<{ txid: string; request_id: string }>(
          bounded(
            bulkStatementMs,
            `SELECT coalesce(k.txid, x.xmin)::text AS txid, coalesce(k.request_id, '') AS request_id
           FROM (SELECT pg_snapshot_xmin(pg_current_snapshot()) AS xmin) x
             LEFT JOIN LATERAL (SELECT txid, request_id FROM ledger WHERE txid < x.xmin AND day COLLATE "C" >= $1 ORDER BY txid, request_id COLLATE "C" LIMIT 1) k ON true`,
            [beforeDay],
          ),
        );
        const bound = bounds.rows[0]!;
        let removed = 0;
        while (signal?.aborted !== true) {
          await client.query("BEGIN");
          try {
            const last = await client.query<{ txid_text: string; request_id: string }>(
              `SELECT txid::text AS txid_text, request_id FROM (
                 SELECT txid, request_id FROM ledger WHERE (txid, request_id COLLATE "C") < ($1::xid8, $2::text) ORDER BY txid, request_id COLLATE "C" LIMIT $3
               ) step ORDER BY txid DESC, request_id COLLATE "C" DESC LIMIT 1`,
              [bound.txid, bound.request_id, this.options.foldStepRows],
            );
            const through = last.rows[0];
            if (through === undefined) {
              await client.query("COMMIT");
              break;
            }
            const step = [through.txid_text, through.request_id];
            // The step's rows deleted and summed into the totals in one statement: read once, by the index.
            const folded = await client.query<{ n: string }>(
              `WITH gone AS (
                 DELETE FROM ledger WHERE (txid, request_id COLLATE "C") <= ($1::xid8, $2::text)
                 RETURNING day, account, operation, error_code, charge, price, cache_hit, upstream_requests),
               totals AS (
                 INSERT INTO ledger_daily_totals (day, account, operation, error_code, charge, calls, amount, cache_hits, upstream_requests)
                 SELECT day, coalesce(account, ''), coalesce(operation, ''), error_code, charge, count(*), sum(price), count(*) FILTER (WHERE cache_hit), sum(upstream_requests)
                 FROM gone GROUP BY 1, 2, 3, 4, 5
                 ON CONFLICT (day, account, operation, error_code, charge) DO UPDATE
                 SET calls = ledger_daily_totals.calls + excluded.calls, amount = ledger_daily_totals.amount + excluded.amount,
                   cache_hits = ledger_daily_totals.cache_hits + excluded.cache_hits, upstream_requests = ledger_daily_totals.upstream_requests + excluded.upstream_requests)
               SELECT count(*)::text AS n FROM gone`,
              step,
            );
            removed += Number(folded.rows[0]!.n);
            await client.query("UPDATE ledger_feed SET folded_txid = $1, folded_request_id = $2", step);
            await client.query("COMMIT");
          } catch (e) {
            await client.query("ROLLBACK").catch(() => (usable = false));
            throw e;
          }
        }
        if (signal?.aborted !== true) await client.query("DELETE FROM refusals WHERE day < $1", [beforeDay]);
        return removed;
      } finally {
        await client.query("SELECT pg_advisory_unlock($1)", [retentionLock]).catch(() => (usable = false));
      }
    } catch (e) {
      usable = false;
      throw e;
    } finally {
      // A connection that may still hold the lock or a transaction is closed, which ends both.
      client.release(!usable);
    }
  }

  /**
   * The conditions of a usage query's filters on the ledger (and the counted
   * refusals and folded totals, which share its columns), and which of those
   * two it can match: calls with no account are counted, not stored, and
   * folded days keep totals, and neither has a request id.
   */
  private async ledgerFilter(q: UsageQuery, days?: { readonly from: string; readonly through: string }): Promise<{ where: string[]; params: unknown[]; refusals: boolean; folded: boolean }> {
    const where: string[] = [];
    const params: unknown[] = [];
    const add = (sql: string, v: unknown) => where.push(sql.replace("?", `$${params.push(v)}`));
    if (days !== undefined) (add("day >= ?", days.from), add("day <= ?", days.through));
    if (q.from !== undefined) add("day >= ?", q.from);
    if (q.to !== undefined) add("day <= ?", q.to);
    if (q.operation !== undefined) add("operation = ?", q.operation);
    if (q.code !== undefined) add("error_code = ?", q.code);
    if (q.requestId !== undefined) add("request_id = ?", q.requestId);
    if (q.account !== undefined) add("account = ?", q.account);
    // (So the refusals are read only when no account is asked for, and one filter serves every part.)
    const refusals = q.account === undefined && q.requestId === undefined;
    const folded = q.address === undefined && q.requestId === undefined;
    if (q.address !== undefined) {
      // The addresses held are matched here (a network, an IPv4 caller written as IPv6), then asked for by name.
      const filter = (w: string[]) => (w.length > 0 ? `WHERE ${w.join(" AND ")}` : "");
      const held = await this.pool.query<{ client_ip: string }>(
        `SELECT DISTINCT client_ip FROM ledger ${filter([...where, "client_ip IS NOT NULL"])}${refusals ? ` UNION SELECT client_ip FROM refusals ${filter(where)}` : ""}`,
        params,
      );
      const n = params.push(addressesIn(q.address, held.rows.map((r) => r.client_ip)));
      where.push(`client_ip = ANY($${n}::text[])`);
    }
    return { where, params, refusals, folded };
  }

  /** Commits what is queued, and waits for a commit already running. */
  async flush(): Promise<void> {
    this.timer?.cancel();
    this.timer = undefined;
    while (this.committing !== undefined) await this.committing;
    if (this.queue.length === 0) return;
    const batch = this.queue;
    this.queue = [];
    const started = performance.now();
    this.committing = this.commit(batch)
      .then(() => this.options.onCommit((performance.now() - started) / 1000, batch.length))
      .finally(() => (this.committing = undefined));
    await this.committing;
    if (this.queue.length > 0) this.schedule();
  }

  /** Stops renewing leases; what it holds expires, or is settled by the rows still queued. */
  close(): void {
    this.closed = true;
    clearInterval(this.renewal);
    clearInterval(this.unstick);
  }

  private schedule(): void {
    if (this.timer !== undefined) return;
    const run = () => {
      this.timer = undefined;
      void this.flush();
    };
    if (this.options.commitIntervalMs === 0) {
      const h = setImmediate(run);
      this.timer = { cancel: () => clearImmediate(h) };
    } else {
      const h = setTimeout(run, this.options.commitIntervalMs);
      this.timer = { cancel: () => clearTimeout(h) };
    }
  }

  /**
   * One statement for the batch (`commitStatement`), so one transaction:
   * the ledger rows in one multi-row insert, each charged call counted
   * against its day and its price deducted, the calls with no account
   * counted per day, code and address, and the batch's leases deleted. All
   * of it lands or none does.
   */
  private async commit(batch: Queued[]): Promise<void> {
    const ledger = batch.filter((q) => q.row.account !== undefined || q.admission !== undefined).map((q) => q.row);
    const refusals = new Map<string, { day: string; operation: string; code: number; charge: string; ip: string; transport: string; calls: number }>();
    for (const { row } of batch) {
      if (row.account !== undefined) continue;
      const ip = this.refusalAddresses.address(row.day, row.clientIp ?? "");
      const k = [row.day, row.operation ?? "", row.code, ip, row.transport].join("\u0000");
      const known = refusals.get(k);
      if (known) known.calls++;
      else refusals.set(k, { day: row.day, operation: row.operation ?? "", code: row.code, charge: row.charge, ip, transport: row.transport, calls: 1 });
    }
    const charged = ledger.filter((r) => r.charge === "charged" && r.account !== undefined);
    const days = new Map<string, { account: string; day: string; calls: number }>();
    const amounts = new Map<string, bigint>();
    for (const r of charged) {
      const k = `${r.account}\u0000${r.day}`;
      days.set(k, { account: r.account!, day: r.day, calls: (days.get(k)?.calls ?? 0) + 1 });
      if (r.price > 0n) amounts.set(r.account!, (amounts.get(r.account!) ?? 0n) + r.price);
    }
    const leases = batch.flatMap((q) => (q.admission?.lease !== undefined ? [q.admission.lease] : []));
    // The keys of the charged calls kept (with the rows that charge them), the others given back.
    const keyed = batch.filter((q) => q.key !== undefined && q.row.account !== undefined);
    const kept = keyed.filter((q) => q.row.charge === "charged");
    const released = keyed.filter((q) => q.row.charge !== "charged");
    const col = <T>(f: (r: LedgerRow) => T) => ledger.map(f);
    const d = [...days.values()];
    const refused = [...refusals.values()];
    const statement = callStatement(
      commitStatement,
      [
        col((r) => r.requestId), col((r) => String(r.at)), col((r) => r.day), col((r) => r.account ?? null), col((r) => r.operation ?? null), col((r) => r.code),
        col((r) => r.charge), col((r) => r.price.toString()), col((r) => r.cacheHit), col((r) => String(r.latencyMicros)), col((r) => r.transport),
        d.map((x) => x.account), d.map((x) => x.day), d.map((x) => x.calls),
        [...amounts.keys()], [...amounts.values()].map(String),
        refused.map((x) => x.day), refused.map((x) => x.operation), refused.map((x) => x.code), refused.map((x) => x.charge), refused.map((x) => x.ip), refused.map((x) => x.transport),
        refused.map((x) => x.calls),
        leases,
        col((r) => r.clientIp ?? null),
        kept.map((q) => q.row.account!), kept.map((q) => q.key!.key.key), kept.map((q) => q.key!.token), kept.map((q) => q.row.requestId), kept.map((q) => String(q.row.at)),
        released.map((q) => q.row.account!), released.map((q) => q.key!.key.key), released.map((q) => q.key!.token),
        col((r) => r.upstreamRequests),
      ],
      "gw_commit",
    );
    const landed = () => {
      this.clearProblem();
      this.settled(leases.length);
      for (const c of charged) {
        const known = this.summaries.get(c.account!);
        if (known !== undefined && known.today === c.day) known.summary.today++;
      }
      for (const q of batch) q.done.resolve();
    };
    const failed = (e: unknown) => {
      this.setProblem();
      for (const q of batch) q.done.reject(e);
    };
    // From here the leases and keys are this batch's commit's to settle, or theirs to lapse: no longer renewed.
    for (const q of keyed) this.heldKeys.delete(q.key!.token);
    for (const l of leases) this.held.delete(l);
    let client: pg.PoolClient;
    try {
      client = await this.pool.connect();
    } catch (e) {
      // Nothing was sent. The leases and held keys lapse: their calls answer 4000, uncharged, and free their places then.
      failed(e);
      return;
    }
    try {
      await client.query(statement);
    } catch (e) {
      // The connection is closed, not reused: after a timeout its session's state is unknown.
      client.release(e instanceof Error ? e : new Error(String(e)));
      // The server refused the statement (a constraint, a shutdown's error): it rolled back.
      if (refusedByServer(e) || ledger.length === 0) return failed(e);
      // Sent and not answered: it may have committed. Its calls wait while that is learnt, and the next batch
      // does not wait for them (this one's rows are found by their request ids, whatever committed since).
      this.setProblem();
      const ids = ledger.map((r) => r.requestId);
      // What is told is the calls it would charge: the batch's refusals keep their own answers, whatever became of their rows.
      const chargedIds = charged.map((r) => r.requestId);
      const tell = (outcome: LedgerCommitOutcome) => chargedIds.length > 0 && this.options.onUnansweredCommit(outcome, chargedIds, e);
      // The server process of the session that ran it (node-postgres keeps it from the session's start; its types leave it out).
      const pid = (client as unknown as { processID: number | null }).processID ?? 0;
      void this.settle(pid, ids).then((outcome) => {
        tell(outcome);
        if (outcome === "landed") landed();
        else failed(outcome === "lost" ? e : new UnconfirmedCommit(e));
        if (outcome === "unconfirmed") void this.settleLate(pid, ids).then((late) => late !== undefined && tell(late));
      });
      return;
    }
    client.release();
    landed();
  }

  /**
   * Learns whether a commit sent on the connection to server process `pid`,
   * and never answered, committed: `landed` if its rows (`requestIds`, all
   * or none) are in the ledger, `lost` if not, `unconfirmed` if the server
   * could not be asked within `settleMs`. The rows' absence alone proves
   * nothing while that session may still commit (its statement waiting on a
   * lock, or still on its way), so the session is ended first
   * (`pg_terminate_backend`), and the ledger read once the server no longer
   * lists it: a session that has ended has committed or rolled back for
   * good. A session the server no longer lists (it restarted, or saw the
   * connection close) has ended too. The session is named by its process id
   * and this connection's user; a process id is reused only after its
   * session ended, and within seconds only on a server that starts
   * processes faster than its id space wraps.
   */
  private async settle(pid: number, requestIds: readonly string[], settleMs = this.options.settleMs): Promise<"landed" | "lost" | "unconfirmed"> {
    const until = performance.now() + settleMs;
    const session = "FROM pg_stat_activity WHERE pid = $1 AND usename = current_user AND backend_type = 'client backend'";
    for (;;) {
      try {
        await this.pool.query(callStatement(`SELECT pg_terminate_backend(pid) ${session}`, [pid]));
        while ((await this.pool.query(callStatement(`SELECT 1 ${session}`, [pid]))).rows.length > 0) {
          if (performance.now() >= until) return "unconfirmed";
          await new Promise((r) => setTimeout(r, 20));
        }
        const found = await this.pool.query<{ n: number }>(callStatement("SELECT count(*)::int AS n FROM ledger WHERE request_id = ANY($1::text[])", [requestIds]));
        return found.rows[0]!.n > 0 ? "landed" : "lost";
      } catch {
        if (performance.now() >= until) return "unconfirmed";
        await new Promise((r) => setTimeout(r, 250));
      }
    }
  }

  /**
   * Goes on learning the outcome of a commit left `unconfirmed`, every few
   * seconds until the server answers (or the meter closes), for the
   * operator: `landed_late` calls were told 4000 and are charged.
   */
  private async settleLate(pid: number, requestIds: readonly string[]): Promise<"landed_late" | "lost_late" | undefined> {
    while (!this.closed) {
      const outcome = await this.settle(pid, requestIds, lateSettleStepMs);
      if (outcome !== "unconfirmed") return outcome === "landed" ? "landed_late" : "lost_late";
      await new Promise((r) => setTimeout(r, lateSettleStepMs).unref());
    }
    return undefined;
  }

  /**
   * Every call inserts a lease and its commit deletes it, so the lease table
   * (`admissions`) fills with dead rows at the rate of the calls, and only a
   * vacuum clears them. Until one runs, each connection keeps the plan it
   * made for the commit while the table was new and small: a sequential
   * scan of the leases, which then reads every dead row, every commit
   * (seen with auto_explain). Autovacuum looks at a database at most once
   * a minute (`autovacuum_naptime`) and may be off: two replicas under
   * sustained load went from 7.5k-8.4k to 3.8k-3.9k calls a second within
   * that minute, PostgreSQL from 75-82 to 208-330 µs of CPU a call. So each
   * replica vacuums the table itself once its commits have settled
   * `vacuumEveryLeases` leases (a few milliseconds, on one connection of
   * the pool, while calls go on; the new statistics also make the
   * connections plan the commit again). `SKIP_LOCKED`: a vacuum already
   * running (another replica's) is not waited for. `TRUNCATE false`: the
   * table's freed pages are reused rather than cut off, which would take a
   * lock that stops every replica's leases for a moment. A user that does
   * not own the table gets a warning from PostgreSQL and no vacuum.
   */
  private settled(leases: number): void {
    if (this.options.vacuumEveryLeases <= 0 || this.closed) return;
    this.settledSinceVacuum += leases;
    if (this.vacuuming || this.settledSinceVacuum < this.options.vacuumEveryLeases) return;
    this.vacuuming = true;
    this.settledSinceVacuum = 0;
    this.pool
      .query("VACUUM (SKIP_LOCKED, TRUNCATE false) admissions")
      .catch((e: unknown) => this.options.onVacuumFailed(e))
      .finally(() => (this.vacuuming = false));
  }

  /**
   * Keeps this replica's leases and held idempotency keys alive while their
   * calls run; and, once a minute, deletes the keys kept longer than
   * `keptMs` and the holds that lapsed (any replica may: the statement is
   * the same for all).
   */
  private async renew(): Promise<void> {
    const now = this.options.now();
    try {
      // On PostgreSQL's clock, as the statements that take and free them read them (schema step 27).
      if (this.held.size > 0) await this.pool.query(callStatement("UPDATE admissions SET expires_at = (SELECT gw_clock_ms()) + $1 WHERE lease = ANY($2::text[])", [this.options.leaseMs, [...this.held]]));
      if (this.heldKeys.size > 0) await this.pool.query(callStatement("UPDATE idempotency_keys SET expires_at = (SELECT gw_clock_ms()) + $1 WHERE token = ANY($2::text[])", [this.options.leaseMs, [...this.heldKeys]]));
      if (now >= this.nextKeyPrune) {
        this.nextKeyPrune = now + keyPruneEveryMs;
        // PostgreSQL's time read once for the statement (a volatile function in the condition is called for every row).
        await this.pool.query("DELETE FROM idempotency_keys WHERE (request_id IS NOT NULL AND at <= $1) OR (request_id IS NULL AND expires_at <= (SELECT gw_clock_ms()))", [now - keptMs]);
      }
    } catch {
      this.setProblem();
    }
  }

  private setProblem(): void {
    this.failedAt = this.options.now();
  }

  private clearProblem(): void {
    this.failedAt = undefined;
  }
}

/** The ledger's columns as a row is read back (bigints as text, for exactness). */
const ledgerColumns = "request_id, at::text AS at, day, account, operation, error_code, charge, price::text AS price, cache_hit, latency_us::text AS latency_us, transport, client_ip, upstream_requests";
const ledgerRows = `SELECT ${ledgerColumns} FROM ledger`;

/** A place the shared store's `feed` gave: "p", a transaction id, "." and a request id ("p0." is before every row). */
function feedPlace(place: FeedPlace): { readonly txid: string; readonly requestId: string } {
  // A transaction id fits 64 bits and a request id holds no control character: anything else would fail in PostgreSQL, not here.
  const m = /^p(0|[1-9][0-9]{0,19})\.([^\u0000-\u001f\u007f]{0,256})$/.exec(place);
  if (m === null || BigInt(m[1]!) >= 2n ** 64n) throw new UsagePageError("token", "the cursor was not given by this gateway's store (the shared store's cursors are its own; in embedded mode, the embedded store's)");
  return { txid: m[1]!, requestId: m[2]! };
}

/**
 * The order calls are listed in (LedgerPlace): the order of the ledger's indexes, then request ids byte by byte, as
 * SQLite compares them, whatever the database's collation. The columns are named with their table: `ledgerRows`
 * reads `at` as text under the same name, and an ORDER BY takes an output column's name first (so QueryUsage's
 * rows were sorted by the time's text, the same order only while every time has 13 digits).
 */
const inPlaceOrder = 'ORDER BY ledger.day DESC, ledger.at DESC, ledger.request_id COLLATE "C" DESC';

function rowFromSql(r: Record<string, unknown>): LedgerRow {
  return {
    requestId: r.request_id as string,
    at: Number(r.at),
    day: r.day as string,
    account: (r.account as string | null) ?? undefined,
    operation: ((r.operation as string | null) ?? undefined) as OperationId | undefined,
    code: Number(r.error_code) as ErrorCode,
    charge: r.charge as ChargeClass,
    price: BigInt(r.price as string),
    cacheHit: r.cache_hit as boolean,
    upstreamRequests: Number(r.upstream_requests),
    latencyMicros: Number(r.latency_us),
    transport: r.transport as Transport,
    clientIp: (r.client_ip as string | null) ?? undefined,
  };
}
