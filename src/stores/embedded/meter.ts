import type { DatabaseSync, SQLInputValue, StatementSync } from "node:sqlite";
import type { ChargeClass } from "../../contract/error-codes.ts";
import type { OperationId } from "../../contract/operations.ts";
import type { Account } from "../../core/accounts.ts";
import { BalanceReferenceConflict, pageKeyOf, type Admission, type BalanceChange, type BalanceRecord, type FeedPlace, type LedgerPlace, type LedgerRow, type Meter, type RecordedBalanceChange, type Transport, type UsageQuery, type UsageDays, type UsageReport, type UsageSums, type UsageSummary } from "../../core/meter.ts";
import { freeBytes } from "./store-space.ts";
import { errorCodeInfo } from "../../contract/error-codes.ts";
import { previousDay } from "../../core/clock.ts";
import { RefusalAddresses } from "../../core/refusal-addresses.ts";
import { addressesIn } from "../../core/allowed-addresses.ts";
import { rateTake } from "../../core/call-rate.ts";
import { balanceShort, concurrencyReached, dailyMaxReached, rateReached } from "../../core/limit-refusals.ts";
import type { Micros } from "../../core/money.ts";
import type { ErrorCode } from "../../gen/gateway/catalogue/v1/status_pb.js";
import { readTransaction, writeTransaction } from "./sqlite-database.ts";
import { InThreadReader, type SqlReader } from "./sql-reader.ts";
import { foldedPastCursor, UsagePageError } from "../../core/usage-pages.ts";
import { keptMs, type IdempotencyKey, type KeyClaim, type TakenKey } from "../../core/idempotency.ts";

export interface SqliteMeterOptions {
  /** Rows wait at most this long for the group commit. */
  readonly commitIntervalMs: number;
  /** A batch this large commits at once. */
  readonly maxBatch: number;
  /** Told, after each commit, which accounts' balances it changed. */
  readonly onBalancesChanged: (accounts: ReadonlySet<string>) => void;
  /** Distinct addresses counted per day for calls with no account; past it they are counted as "other". */
  readonly refusalAddressesPerDay: number;
  /** The data directory, watched for `minFreeBytes`. */
  readonly dataDir: string | undefined;
  /** Below this much free space new calls are refused (0: no floor). */
  readonly minFreeBytes: number;
  /**
   * Told when new calls stop being recordable (with why) and when they can be
   * again (undefined, with how many refused calls could not be counted meanwhile).
   */
  readonly onHealth: (problem: string | undefined, detail?: { cause?: unknown; droppedRefusals?: number }) => void;
  /** Told after each group commit of ledger rows: how long it took and how many rows it wrote. */
  readonly onCommit: (seconds: number, rows: number) => void;
  /** The clock rate limits are measured with (Unix ms). */
  readonly now: () => number;
  /** Where usage reports (`query`) run; undefined: on this connection (sql-reader.ts). */
  readonly reader: SqlReader | undefined;
}

export const defaultMeterOptions: SqliteMeterOptions = {
  commitIntervalMs: 0,
  maxBatch: 512,
  onBalancesChanged: () => {},
  refusalAddressesPerDay: 10_000,
  dataDir: undefined,
  minFreeBytes: 64 * 1_048_576,
  onHealth: () => {},
  onCommit: () => {},
  now: Date.now,
  reader: undefined,
};

/** Calls with no account, counted per day, operation, code, address and transport until the next commit. */
interface RefusalCount {
  readonly day: string;
  readonly operation: string;
  readonly code: ErrorCode;
  readonly ip: string;
  readonly transport: Transport;
  calls: number;
}

/** Distinct refusal keys held while the store cannot be written; past it, counts are dropped (and said so). */
const maxHeldRefusals = 100_000;

/** Ledger rows written by one insert statement at most (12 values each). */
const maxRowsPerInsert = 32;
const ledgerColumns = "request_id, at, day, account, operation, error_code, charge, price, cache_hit, latency_us, transport, client_ip, upstream_requests";

interface Queued {
  readonly row: LedgerRow;
  readonly admission: Admission | undefined;
  /** The idempotency key the call took, kept with its row where the row is charged. */
  readonly key: TakenKey | undefined;
  readonly done: { resolve(): void; reject(e: unknown): void };
}

/**
 * An idempotency key a call of this process holds, from its taking until
 * its row's commit: the store then keeps it (the call was charged), or it
 * is free again. A copy meanwhile is in flight, so a replay is answered only
 * once the charge it repeats is durable.
 */
interface HeldKey {
  readonly fingerprint: string;
  readonly token: string;
}

/** How often kept idempotency keys older than `keptMs` are deleted. */
const keyPruneEveryMs = 60_000;

/** An account's entry of a map keyed by something of the account's own: a day (pending calls), an idempotency key (held keys). */
const accountKey = (account: string, part: string) => `${account}\u0000${part}`;

/**
 * The meter of the embedded store. Committed counts and balances live in
 * SQLite; what this process has admitted but not yet committed lives here,
 * and every admission decision is one synchronous step over both, so no two
 * calls can pass the same last place. Ledger rows are group-committed: one
 * transaction every few milliseconds holds the rows, the day counts and the
 * balance deductions of the charged ones, so counts, balances and the
 * ledger always agree. Only the serving process admits calls; a process that
 * dies takes its in-flight slots with it.
 *
 * Calls with no account to charge (unknown keys, locked-out addresses,
 * unroutable paths) are not stored row by row, or a flood would fill the
 * disk: they are counted per day, operation, code and address. A commit that
 * fails (a full disk) fails only its rows' calls; from then on new calls are
 * refused, but for one probe a second, until a commit succeeds again.
 */
export class SqliteMeter implements Meter {
  private readonly db: DatabaseSync;
  private pageKeyBytes: Uint8Array | undefined;
  private readonly options: SqliteMeterOptions;
  /** Where usage reports run (sql-reader.ts). */
  private readonly reader: SqlReader;
  private readonly inFlight = new Map<string, number>();
  private readonly pendingCalls = new Map<string, number>();
  private readonly pendingAmount = new Map<string, bigint>();
  /**
   * Each rated account's theoretical arrival time (src/core/call-rate.ts):
   * this process is the only one that admits calls, so it decides from here.
   * Each commit writes the times of the accounts whose calls it holds
   * (rate_arrivals), and a start reads them back: a restart, or a crash,
   * hands no account a fresh burst. Calls admitted after the last commit
   * and never recorded (the process died first) were never answered; their
   * places are given back.
   */
  private readonly arrivals = new Map<string, bigint>();
  /** Idempotency keys held by this process's calls until their rows commit (HeldKey), by account and key. */
  private readonly keys = new Map<string, HeldKey>();
  private keyTokens = 0;
  private nextKeyPrune = 0;
  private queue: Queued[] = [];
  /**
   * Committed counts per account for its current day, kept in step with each
   * commit: this process is the only writer of day counts, so they need no
   * query per call.
   */
  private readonly summaries = new Map<string, { day: string; summary: { today: number; yesterday: number; before: number } }>();
  private timer: NodeJS.Timeout | NodeJS.Immediate | undefined;
  private readonly sql: Record<"count" | "deduct" | "topUp" | "unbilled" | "balanceChange" | "balanceChanges" | "balanceOf" | "sums" | "refusal" | "refusalAddresses" | "arrival" | "keptKey" | "keepKey" | "pruneKeys" | "referenced", StatementSync>;
  /** The ledger inserts by number of rows (insertRows). */
  private readonly inserts: StatementSync[] = [];
  private readonly refusals = new Map<string, RefusalCount>();
  private refusalWaiters: (() => void)[] = [];
  private readonly refusalAddresses: RefusalAddresses;
  private droppedRefusals = 0;
  /** Why the last commit failed, while it keeps failing. */
  private problem: string | undefined;
  private nextProbe = 0;
  private space = { checkedAt: -Infinity, low: false };

  constructor(db: DatabaseSync, options: Partial<SqliteMeterOptions> = {}) {
    this.db = db;
    this.options = { ...defaultMeterOptions, ...options };
    this.reader = this.options.reader ?? new InThreadReader(db);
    this.sql = {
      count: db.prepare(
        "INSERT INTO usage_daily (account, day, charged) VALUES (?, ?, ?) ON CONFLICT (account, day) DO UPDATE SET charged = charged + excluded.charged",
      ),
      // Taken only where the balance covers it (Meter.adjustBalance says when it does not).
      deduct: db.prepare("UPDATE balances SET micros = micros - ?1 WHERE account = ?2 AND micros >= ?1"),
      topUp: db.prepare("INSERT INTO balances (account, micros) VALUES (?, ?) ON CONFLICT (account) DO UPDATE SET micros = micros + excluded.micros"),
      unbilled: db.prepare("DELETE FROM balances WHERE account = ? RETURNING micros"),
      balanceChange: db.prepare("INSERT INTO balance_changes (account, at, kind, amount, balance, actor, reference) VALUES (?, ?, ?, ?, (SELECT micros FROM balances WHERE account = ?), ?, ?)"),
      balanceChanges: db.prepare("SELECT at, kind, amount, balance, actor, reference FROM balance_changes WHERE account = ? ORDER BY id"),
      referenced: db.prepare("SELECT amount FROM balance_changes WHERE account = ? AND reference = ?"),
      balanceOf: db.prepare("SELECT micros FROM balances WHERE account = ?"),
      sums: db.prepare(`SELECT
          coalesce(sum(CASE WHEN day = :today THEN charged END), 0) AS today,
          coalesce(sum(CASE WHEN day = :yesterday THEN charged END), 0) AS yesterday,
          coalesce(sum(CASE WHEN day < :yesterday THEN charged END), 0) AS before
        FROM usage_daily WHERE account = :account`),
      refusal: db.prepare(
        `INSERT INTO refusals (day, operation, error_code, charge, client_ip, transport, calls) VALUES (?, ?, ?, ?, ?, ?, ?)
         ON CONFLICT (day, operation, error_code, client_ip, transport) DO UPDATE SET calls = calls + excluded.calls`,
      ),
      refusalAddresses: db.prepare("SELECT DISTINCT client_ip FROM refusals WHERE day = ? AND client_ip != 'other'"),
      // Never moved back: a later time is what the rate decided.
      arrival: db.prepare("INSERT INTO rate_arrivals (account, tat) VALUES (?, ?) ON CONFLICT (account) DO UPDATE SET tat = max(tat, excluded.tat)"),
      keptKey: db.prepare("SELECT fingerprint, request_id FROM idempotency_keys WHERE account = ? AND key = ? AND at > ?"),
      // A key kept longer than keptMs is free to be taken again: its new call replaces it.
      keepKey: db.prepare(
        `INSERT INTO idempotency_keys (account, key, fingerprint, request_id, at) VALUES (?, ?, ?, ?, ?)
         ON CONFLICT (account, key) DO UPDATE SET fingerprint = excluded.fingerprint, request_id = excluded.request_id, at = excluded.at`,
      ),
      pruneKeys: db.prepare("DELETE FROM idempotency_keys WHERE at <= ?"),
    };
    // The rate's state as the last commit left it; a time already past is no different from none.
    const arrivals = db.prepare("SELECT account, tat FROM rate_arrivals WHERE tat > ?");
    arrivals.setReadBigInts(true);
    for (const r of arrivals.all(BigInt(this.options.now()) * 1_000_000n) as { account: string; tat: bigint }[]) this.arrivals.set(r.account, r.tat);
    this.sql.unbilled.setReadBigInts(true);
    this.sql.balanceChanges.setReadBigInts(true);
    this.sql.balanceOf.setReadBigInts(true);
    this.sql.referenced.setReadBigInts(true);
    this.refusalAddresses = new RefusalAddresses(this.options.refusalAddressesPerDay, (day) =>
      (this.sql.refusalAddresses.all(day) as { client_ip: string }[]).map((r) => r.client_ip),
    );
  }

  unavailable(now: number): string | undefined {
    if (this.problem !== undefined) {
      // One call a second goes through: its commit says whether the store can be written again.
      if (now >= this.nextProbe) {
        this.nextProbe = now + 1000;
        return undefined;
      }
      return `the usage ledger cannot be written (${this.problem}); calls are refused, and not charged, until it can`;
    }
    return this.lowSpace(now) ? `${this.lowSpaceReason()}; the usage ledger cannot be written safely, so calls are refused, and not charged, until space returns` : undefined;
  }

  health(now: number): string | undefined {
    if (this.problem !== undefined) return `the usage ledger cannot be written (${this.problem})`;
    return this.lowSpace(now) ? this.lowSpaceReason() : undefined;
  }

  /** Whether the data directory is below its free-space floor, measured at most once a second. */
  private lowSpace(now: number): boolean {
    const { dataDir, minFreeBytes } = this.options;
    if (dataDir === undefined || minFreeBytes <= 0) return false;
    if (now - this.space.checkedAt >= 1000 || now < this.space.checkedAt) {
      // A directory that cannot be measured is left to the commits to report.
      const free = freeBytes(dataDir);
      const low = free !== undefined && free < minFreeBytes;
      if (low !== this.space.low) this.options.onHealth(low ? this.lowSpaceReason() : undefined);
      this.space = { checkedAt: now, low };
    }
    return this.space.low;
  }

  private lowSpaceReason(): string {
    return `the data directory has less than ${Math.round(this.options.minFreeBytes / 1048576)} MB free`;
  }

  async adjustBalance(account: string, change: BalanceChange): Promise<"applied" | "repeated"> {
    // The reference's check and the change in one write transaction: no other can come between them.
    const outcome = writeTransaction(this.db, (): "applied" | "repeated" => {
      let amount: bigint;
      const reference = change.kind === "unbilled" ? undefined : change.reference;
      if (change.kind === "unbilled") {
        const dropped = this.sql.unbilled.get(account) as { micros: bigint } | undefined;
        if (dropped === undefined) return "applied"; // unbilled already: nothing changes
        amount = -dropped.micros;
      } else {
        if (reference !== undefined) {
          const made = this.sql.referenced.get(account, reference) as { amount: bigint } | undefined;
          if (made !== undefined && made.amount !== change.amount) throw new BalanceReferenceConflict(reference, made.amount);
          if (made !== undefined) return "repeated";
        }
        this.sql.topUp.run(account, change.amount);
        amount = change.amount;
      }
      this.sql.balanceChange.run(account, change.at, change.kind, amount, account, change.by ?? null, reference ?? null);
      return "applied";
    });
    if (outcome === "applied") this.options.onBalancesChanged(new Set([account]));
    return outcome;
  }

  async balance(account: string): Promise<Micros | undefined> {
    return (this.sql.balanceOf.get(account) as { micros: bigint } | undefined)?.micros;
  }

  async balanceRecord(account: string): Promise<BalanceRecord> {
    return readTransaction(this.db, () => ({
      balance: (this.sql.balanceOf.get(account) as { micros: bigint } | undefined)?.micros,
      changes: (this.sql.balanceChanges.all(account) as { at: bigint; kind: RecordedBalanceChange["kind"]; amount: bigint; balance: bigint | null; actor: string | null; reference: string | null }[]).map((r) => ({
        at: Number(r.at),
        kind: r.kind,
        amount: r.amount,
        balance: r.balance ?? undefined,
        by: r.actor ?? "",
        reference: r.reference ?? "",
      })),
    }));
  }

  /** The check and the reservation in one synchronous step: nothing else runs between them. */
  admit(account: Account, operation: OperationId, day: string): Admission {
    const key = account.key;
    const inFlight = this.inFlight.get(key) ?? 0;
    if (inFlight >= account.concurrency) {
      throw concurrencyReached(inFlight);
    }
    const committed = this.usage(key, day, previousDay(day)).today;
    const pending = this.pendingCalls.get(accountKey(key, day)) ?? 0;
    if (committed + pending >= account.dailyMax) {
      throw dailyMaxReached(account);
    }
    const price = account.prices.get(operation) ?? 0n;
    if (account.balance !== undefined) {
      const available = account.balance - (this.pendingAmount.get(key) ?? 0n);
      if (available < price) {
        throw balanceShort(available, price, operation);
      }
    }
    const rate = account.rate;
    let arrival: Admission["rate"];
    if (rate !== undefined) {
      const now = this.options.now();
      const taken = rateTake(this.arrivals.get(key), now, rate);
      if ("waitMs" in taken) throw rateReached(rate, taken.waitMs);
      this.arrivals.set(key, taken.next);
      arrival = { tat: taken.next, at: now };
    }
    this.inFlight.set(key, inFlight + 1);
    this.pendingCalls.set(accountKey(key, day), pending + 1);
    this.pendingAmount.set(key, (this.pendingAmount.get(key) ?? 0n) + price);
    return { account: key, day, price, dayCount: committed + pending + 1, rate: arrival };
  }

  /** The key's check and its taking in one synchronous step: nothing else runs between them. */
  claim(account: string, key: IdempotencyKey, now: number): KeyClaim {
    const k = accountKey(account, key.key);
    const held = this.keys.get(k);
    if (held !== undefined) return held.fingerprint !== key.fingerprint ? { kind: "other_request" } : { kind: "in_flight" };
    const kept = this.sql.keptKey.get(account, key.key, now - keptMs) as { fingerprint: string; request_id: string } | undefined;
    if (kept !== undefined) return kept.fingerprint !== key.fingerprint ? { kind: "other_request" } : { kind: "replay", requestId: kept.request_id };
    const token = (this.keyTokens++).toString(36);
    this.keys.set(k, { fingerprint: key.fingerprint, token });
    return { kind: "taken", key, token };
  }

  record(row: LedgerRow, admission: Admission | undefined, key?: TakenKey): Promise<void> {
    if (row.account === undefined && admission === undefined) return this.count(row);
    return new Promise((resolve, reject) => {
      this.queue.push({ row, admission, key, done: { resolve, reject } });
      if (this.queue.length >= this.options.maxBatch) this.flush();
      else this.schedule();
    });
  }

  /** A call with no account: one more in its day's count, committed with the next batch. */
  private count(row: LedgerRow): Promise<void> {
    const ip = this.refusalAddresses.address(row.day, row.clientIp ?? "");
    const operation = row.operation ?? "";
    const k = `${row.day}\u0000${operation}\u0000${row.code}\u0000${ip}\u0000${row.transport}`;
    const known = this.refusals.get(k);
    if (known !== undefined) known.calls++;
    else if (this.refusals.size < maxHeldRefusals) this.refusals.set(k, { day: row.day, operation, code: row.code, ip, transport: row.transport, calls: 1 });
    else this.droppedRefusals++;
    return new Promise((resolve) => {
      this.refusalWaiters.push(resolve);
      this.schedule();
    });
  }

  /** The insert of `n` ledger rows in one statement (made on first use; one statement steps, binds and checks its constraints once, not `n` times). */
  private insertRows(n: number): StatementSync {
    let statement = this.inserts[n];
    if (statement === undefined) {
      const tuple = `(${ledgerColumns.split(", ").map(() => "?").join(", ")})`;
      statement = this.db.prepare(`INSERT INTO ledger (${ledgerColumns}) VALUES ${Array.from({ length: n }, () => tuple).join(", ")}`);
      this.inserts[n] = statement;
    }
    return statement;
  }

  private schedule(): void {
    // 0: commit at the end of this turn of the event loop, with every row written in it.
    this.timer ??= this.options.commitIntervalMs === 0 ? setImmediate(() => this.flush()) : setTimeout(() => this.flush(), this.options.commitIntervalMs);
  }

  /** One transaction; an error is returned, never thrown, and the transaction is never left open. */
  private transaction(work: () => void): unknown {
    try {
      writeTransaction(this.db, work);
      return undefined;
    } catch (e) {
      return e;
    }
  }

  private setProblem(cause: unknown): void {
    const first = this.problem === undefined;
    this.problem = (cause as Error)?.message ?? String(cause);
    if (first) this.options.onHealth(`the usage ledger cannot be written (${this.problem})`, { cause });
  }

  private clearProblem(): void {
    if (this.problem === undefined) return;
    this.problem = undefined;
    this.options.onHealth(undefined, { droppedRefusals: this.droppedRefusals });
    this.droppedRefusals = 0;
  }

  flush(): void {
    if (this.timer !== undefined) {
      clearTimeout(this.timer as NodeJS.Timeout);
      clearImmediate(this.timer as NodeJS.Immediate);
    }
    this.timer = undefined;
    const batch = this.queue;
    this.queue = [];
    const waiters = this.refusalWaiters;
    this.refusalWaiters = [];
    try {
      if (batch.length > 0) {
        const started = performance.now();
        this.commitRows(batch);
        this.options.onCommit((performance.now() - started) / 1000, batch.length);
      }
      this.commitRefusals();
    } finally {
      for (const resolve of waiters) resolve();
    }
  }

  /** Counts of calls with no account; kept for a later commit when this one fails. */
  private commitRefusals(): void {
    if (this.refusals.size === 0) return;
    const counts = [...this.refusals.values()];
    const e = this.transaction(() => {
      for (const c of counts) this.sql.refusal.run(c.day, c.operation, c.code, errorCodeInfo(c.code).charge, c.ip, c.transport, c.calls);
    });
    if (e === undefined) this.refusals.clear();
  }

  private commitRows(batch: Queued[]): void {
    // One transaction for the batch; if it fails, each row in its own, so one
    // bad row (say, an id written before) does not cost the others theirs.
    const failures = new Map<Queued, unknown>();
    // Keys kept longer than keptMs go with a commit, at most once a minute: no transaction of their own.
    const now = this.options.now();
    const prune = now >= this.nextKeyPrune;
    if (prune) this.nextKeyPrune = now + keyPruneEveryMs;
    // A row each; the day counts and balance deductions once per account and day of the batch, in the same transaction.
    const write = (rows: Queued[]) =>
      this.transaction(() => {
        const counts = new Map<string, { account: string; day: string; calls: number }>();
        const deductions = new Map<string, bigint>();
        for (let i = 0; i < rows.length; i += maxRowsPerInsert) {
          const n = Math.min(maxRowsPerInsert, rows.length - i);
          const values: SQLInputValue[] = [];
          for (let j = i; j < i + n; j++) {
            const row = rows[j]!.row;
            values.push(row.requestId, row.at, row.day, row.account ?? null, row.operation ?? null, row.code, row.charge, row.price, row.cacheHit ? 1 : 0, row.latencyMicros, row.transport, row.clientIp ?? null, row.upstreamRequests);
          }
          this.insertRows(n).run(...values);
        }
        for (const { row } of rows) {
          if (row.charge === "charged" && row.account !== undefined) {
            const k = accountKey(row.account, row.day);
            const c = counts.get(k);
            if (c === undefined) counts.set(k, { account: row.account, day: row.day, calls: 1 });
            else c.calls++;
            if (row.price > 0n) deductions.set(row.account, (deductions.get(row.account) ?? 0n) + row.price);
          }
        }
        for (const c of counts.values()) this.sql.count.run(c.account, c.day, c.calls);
        for (const [account, micros] of deductions) this.sql.deduct.run(micros, account);
        // The rate's place of every rated call in the batch (charged or not: admission took it), as it stands now.
        let rated: Map<string, bigint> | undefined;
        for (const { admission } of rows) if (admission?.rate !== undefined) (rated ??= new Map()).set(admission.account, this.arrivals.get(admission.account) ?? admission.rate.tat);
        if (rated !== undefined) for (const [account, tat] of rated) this.sql.arrival.run(account, tat);
        // The keys of the charged calls, in the commit that charges them: a crash after it cannot lose one.
        for (const { row, key } of rows) {
          if (key !== undefined && row.charge === "charged" && row.account !== undefined) this.sql.keepKey.run(row.account, key.key.key, key.key.fingerprint, row.requestId, row.at);
        }
        if (prune) this.sql.pruneKeys.run(now - keptMs);
      });
    const whole = write(batch);
    if (whole !== undefined && batch.length === 1) failures.set(batch[0]!, whole);
    else if (whole !== undefined) {
      for (const queued of batch) {
        const e = write([queued]);
        if (e !== undefined) failures.set(queued, e);
      }
    }
    if (failures.size === batch.length) this.setProblem(whole);
    else this.clearProblem();
    const balances = new Set<string>();
    for (const queued of batch) {
      const row = queued.row;
      if (failures.has(queued) || row.charge !== "charged" || row.account === undefined) continue;
      if (row.price > 0n) balances.add(row.account);
      const known = this.summaries.get(row.account);
      if (known === undefined) continue;
      if (known.day === row.day) known.summary.today++;
      else if (previousDay(known.day) === row.day) known.summary.yesterday++;
      else this.summaries.delete(row.account);
    }
    if (balances.size > 0) this.options.onBalancesChanged(balances);
    // Committed (or given up): the admissions' places are no longer pending, and the store has the keys (or they are given back).
    for (const { admission } of batch) if (admission !== undefined) this.settle(admission);
    for (const { row, key } of batch) {
      if (key === undefined || row.account === undefined) continue;
      const k = accountKey(row.account, key.key.key);
      if (this.keys.get(k)?.token === key.token) this.keys.delete(k);
    }
    for (const queued of batch) {
      const e = failures.get(queued);
      if (e === undefined) queued.done.resolve();
      else queued.done.reject(e);
    }
  }

  private settle(a: Admission): void {
    const k = accountKey(a.account, a.day);
    decrement(this.inFlight, a.account);
    decrement(this.pendingCalls, k);
    const left = (this.pendingAmount.get(a.account) ?? 0n) - a.price;
    if (left === 0n) this.pendingAmount.delete(a.account);
    else this.pendingAmount.set(a.account, left);
  }

  rateArrival(account: string): bigint | undefined {
    return this.arrivals.get(account);
  }

  usage(account: string, today: string, yesterday: string): UsageSummary {
    const known = this.summaries.get(account);
    if (known !== undefined && known.day === today) return { ...known.summary };
    const r = this.sql.sums.get({ account, today, yesterday }) as Record<keyof UsageSummary, number>;
    const summary = { today: Number(r.today), yesterday: Number(r.yesterday), before: Number(r.before) };
    if (this.summaries.size >= 100_000) this.summaries.clear();
    this.summaries.set(account, { day: today, summary });
    return { ...summary };
  }

  /**
   * Totals per account, day, operation, code and charge: the ledger's rows,
   * the per-day totals of rows past retention, and (with no account asked
   * for) the counted calls that had no account.
   */
  async query(q: UsageQuery): Promise<UsageReport> {
    // A report reads the whole range asked for: on the reader's thread where the gateway has one (sql-reader.ts).
    const reader = this.reader;
    const page = q.totalsPage;
    const after = page?.after;
    // A page reads only its days (the totals are by day first).
    const { where, params, refusals, folded } = await this.ledgerFilter(q, false, page?.days);
    const filter = (w: string[]) => (w.length > 0 ? `WHERE ${w.join(" AND ")}` : "");
    const address = (column: string) => (q.byAddress ? column : "''");
    const parts = [
      `SELECT coalesce(account, '') AS account, day, coalesce(operation, '') AS operation, error_code, charge, ${address("coalesce(client_ip, '')")} AS client_ip,
       count(*) AS calls, sum(price) AS amount, sum(cache_hit) AS cache_hits, sum(upstream_requests) AS upstream_requests FROM ledger ${filter(where)} GROUP BY 1, 2, 3, 4, 5, 6`,
      // Folded past retention, with no address: no address filter matches them.
      ...(folded ? [`SELECT account, day, operation, error_code, charge, '' AS client_ip, calls, amount, cache_hits, upstream_requests FROM ledger_daily_totals ${filter(where)}`] : []),
      ...(refusals ? [`SELECT '' AS account, day, operation, error_code, charge, ${address("client_ip")} AS client_ip, calls, 0 AS amount, 0 AS cache_hits, 0 AS upstream_requests FROM refusals ${filter(where)}`] : []),
    ];
    const order = "ORDER BY day, account, operation, error_code, charge, client_ip";
    const grouped = `SELECT account, day, operation, error_code, charge, client_ip, sum(calls) AS calls, sum(amount) AS amount, sum(cache_hits) AS cache_hits, sum(upstream_requests) AS upstream_requests
       FROM (${parts.join(" UNION ALL ")}) GROUP BY account, day, operation, error_code, charge, client_ip`;
    // The totals and the rows in one read: as one moment left them. A page of totals is read on from where the one
    // before ended (in the totals' order).
    const answers = await reader.read([
      page === undefined
        ? { sql: `${grouped} ${order}`, params, bigints: true }
        : {
            sql: `SELECT * FROM (${grouped}) ${after === undefined ? "" : "WHERE (day, account, operation, error_code, charge, client_ip) > (:pDay, :pAccount, :pOperation, :pCode, :pCharge, :pIp)"} ${order} LIMIT :pLimit`,
            params: {
              ...params,
              pLimit: page.limit,
              ...(after === undefined ? {} : { pDay: after.day, pAccount: after.account, pOperation: after.operation, pCode: after.code, pCharge: after.charge, pIp: after.clientIp }),
            },
            bigints: true,
          },
      ...(q.rows ? [{ sql: `SELECT ${rowColumns} FROM ledger ${filter(where)} ${inPlaceOrder} LIMIT :limit`, params: { ...params, limit: q.rows }, bigints: true, arrays: true }] : []),
    ]);
    const totals = answers[0]!;
    const rows = q.rows ? (answers[1]! as unknown as unknown[][]) : [];
    return {
      totals: totals.map((t) => ({
        account: (t.account as string) || undefined,
        day: t.day as string,
        operation: (t.operation as string) || undefined,
        code: Number(t.error_code) as ErrorCode,
        charge: t.charge as ChargeClass,
        calls: Number(t.calls),
        amount: t.amount as bigint,
        cacheHits: Number(t.cache_hits),
        upstreamRequests: Number(t.upstream_requests),
        ...(q.byAddress ? { clientIp: t.client_ip as string } : {}),
      })),
      rows: rows.map(rowFromColumns),
    };
  }

  async usageSums(q: UsageQuery): Promise<UsageSums> {
    const { where, params, refusals, folded } = await this.ledgerFilter(q);
    const filter = where.length > 0 ? `WHERE ${where.join(" AND ")}` : "";
    // Summed where they are, not grouped first: one pass over the range's rows.
    const parts = [
      `SELECT count(*) AS calls, sum(charge = 'charged') AS charged, sum(price) AS amount, sum(cache_hit) AS cache_hits, sum(upstream_requests) AS upstream_requests FROM ledger ${filter}`,
      ...(folded ? [`SELECT sum(calls), sum(CASE WHEN charge = 'charged' THEN calls ELSE 0 END), sum(amount), sum(cache_hits), sum(upstream_requests) FROM ledger_daily_totals ${filter}`] : []),
      ...(refusals ? [`SELECT sum(calls), sum(CASE WHEN charge = 'charged' THEN calls ELSE 0 END), 0, 0, 0 FROM refusals ${filter}`] : []),
    ];
    const [answer] = await this.reader.read([
      {
        sql: `SELECT coalesce(sum(calls), 0) AS calls, coalesce(sum(charged), 0) AS charged, coalesce(sum(amount), 0) AS amount, coalesce(sum(cache_hits), 0) AS cache_hits, coalesce(sum(upstream_requests), 0) AS upstream_requests FROM (${parts.join(" UNION ALL ")})`,
        params,
        bigints: true,
      },
    ]);
    const sum = answer![0]!;
    return { calls: sum.calls as bigint, chargedCalls: sum.charged as bigint, amount: sum.amount as bigint, cacheHits: sum.cache_hits as bigint, upstreamRequests: sum.upstream_requests as bigint };
  }

  /** Read on first use (core/meter.ts Meter.pageKey); a read that failed is tried again next time. */
  async pageKey(): Promise<Uint8Array> {
    this.pageKeyBytes ??= pageKeyOf((this.db.prepare("SELECT key FROM page_keys WHERE name = 'usage-sums'").get() as { key: Uint8Array } | undefined)?.key);
    return this.pageKeyBytes;
  }

  async usageDays(q: UsageQuery): Promise<UsageDays | undefined> {
    const where: string[] = [];
    const params: Record<string, string> = {};
    if (q.from !== undefined) (where.push("day >= :from"), (params.from = q.from));
    if (q.to !== undefined) (where.push("day <= :to"), (params.to = q.to));
    const ends = (table: string, w: string[]) => {
      const filter = w.length > 0 ? `WHERE ${w.join(" AND ")}` : "";
      // Each a lookup at one end of an index (SQLite's min/max optimisation), not a read of the range.
      return `SELECT (SELECT min(day) FROM ${table} ${filter}) AS first, (SELECT max(day) FROM ${table} ${filter}) AS last`;
    };
    const withAccount = q.account === undefined ? where : [...where, "account = :account"];
    if (q.account !== undefined) params.account = q.account;
    const [answer] = await this.reader.read([
      {
        sql: `SELECT min(first) AS first, max(last) AS last FROM (${[ends("ledger", withAccount), ends("ledger_daily_totals", withAccount), ...(q.account === undefined ? [ends("refusals", where)] : [])].join(" UNION ALL ")})`,
        params,
      },
    ]);
    const days = answer![0]!;
    return days.first === null ? undefined : { first: days.first as string, last: days.last as string };
  }

  async calls(q: UsageQuery, after: LedgerPlace | undefined, limit: number): Promise<LedgerRow[]> {
    const { where, params } = await this.ledgerFilter(q, after !== undefined);
    if (after !== undefined) {
      // Where the page before ended, as the indexes order the rows (LedgerPlace): the index is entered there, not read
      // from the range's newest end, and only the calls of the page's last millisecond are sorted (by request id).
      where.push("(day, at) <= (:afterDay, :afterAt)", "(day, at, request_id) < (:afterDay, :afterAt, :afterId)");
      Object.assign(params, { afterDay: after.day, afterAt: after.at, afterId: after.requestId });
    }
    const [rows] = await this.reader.read([
      {
        sql: `SELECT ${rowColumns} FROM ledger ${where.length > 0 ? `WHERE ${where.join(" AND ")}` : ""} ${inPlaceOrder} LIMIT :limit`,
        params: { ...params, limit: Math.max(0, Math.floor(limit)) },
        bigints: true,
        arrays: true,
      },
    ]);
    return (rows! as unknown as unknown[][]).map(rowFromColumns);
  }

  /**
   * The conditions of a usage query's filters on the ledger (and the counted
   * refusals and folded totals, which share its columns), and which of those
   * two it can match: calls with no account are counted, not stored, and
   * folded days keep totals, and neither has a request id.
   */
  private async ledgerFilter(q: UsageQuery, resumed = false, days?: { readonly from: string; readonly through: string }): Promise<{ where: string[]; params: Record<string, string | number>; refusals: boolean; folded: boolean }> {
    const where: string[] = [];
    const params: Record<string, string | number> = {};
    if (days !== undefined) (where.push("day >= :daysFrom", "day <= :daysThrough"), (params.daysFrom = days.from), (params.daysThrough = days.through));
    if (q.from !== undefined) (where.push("day >= :from"), (params.from = q.from));
    // A page read on from a place (`calls`) bounds the index by the place: the last day, checked row by row (`+`),
    // would have SQLite enter the index at that day's newest row and read down to the place.
    if (q.to !== undefined) (where.push(resumed ? "+day <= :to" : "day <= :to"), (params.to = q.to));
    if (q.operation !== undefined) (where.push("operation = :operation"), (params.operation = q.operation));
    if (q.code !== undefined) (where.push("error_code = :code"), (params.code = q.code));
    if (q.requestId !== undefined) (where.push("request_id = :requestId"), (params.requestId = q.requestId));
    if (q.account !== undefined) (where.push("account = :account"), (params.account = q.account));
    // (So the refusals are read only when no account is asked for, and one filter serves every part.)
    const refusals = q.account === undefined && q.requestId === undefined;
    const folded = q.address === undefined && q.requestId === undefined;
    if (q.address !== undefined) {
      // The addresses held are matched here (a network, an IPv4 caller written as IPv6), then asked for by name.
      const filter = (w: string[]) => (w.length > 0 ? `WHERE ${w.join(" AND ")}` : "");
      const [held] = await this.reader.read([
        { sql: `SELECT DISTINCT client_ip FROM ledger ${filter([...where, "client_ip IS NOT NULL"])}${refusals ? ` UNION SELECT client_ip FROM refusals ${filter(where)}` : ""}`, params },
      ]);
      params.addresses = JSON.stringify(addressesIn(q.address, held!.map((r) => r.client_ip as string)));
      where.push("client_ip IN (SELECT value FROM json_each(:addresses))");
    }
    return { where, params, refusals, folded };
  }

  /**
   * Retention (`Meter.expire`), in one transaction: folds the ledger rows of
   * days before `beforeDay` into per-day totals and deletes them, with the
   * counted refusals of those days. Day counts (api_info) are kept apart and
   * stay. Returns the rows removed.
   *
   * The rows folded are those committed before the first row of `beforeDay`
   * or later (by rowid, `feed`'s order), so what is gone is always the start
   * of that order and a follower's cursor is either past it or refused,
   * never passed over a hole. A row of an earlier day committed after that
   * first one (accounts in zones a day apart) stays until a later run: it
   * outlives retention by a day at most. The newest row always stays: SQLite
   * numbers a new row one past the highest held, so with none held the
   * numbering would start again below cursors already given.
   */
  expire(beforeDay: string): number {
    let removed = 0;
    const e = this.transaction(() => {
      // Read in sequence order from the oldest row, so the cost is the rows folded, not the ledger.
      const first = this.db.prepare("SELECT rowid AS seq FROM ledger WHERE +day >= ? ORDER BY rowid LIMIT 1").get(beforeDay) as { seq: number } | undefined;
      const newest = (this.db.prepare("SELECT max(rowid) AS seq FROM ledger").get() as { seq: number | null }).seq ?? 0;
      const bound = first === undefined ? newest : first.seq;
      const last = (this.db.prepare("SELECT max(rowid) AS seq FROM ledger WHERE rowid < ?").get(bound) as { seq: number | null }).seq;
      if (last !== null) {
        this.db
          .prepare(
            `INSERT INTO ledger_daily_totals (day, account, operation, error_code, charge, calls, amount, cache_hits, upstream_requests)
             SELECT day, coalesce(account, ''), coalesce(operation, ''), error_code, charge, count(*), sum(price), sum(cache_hit), sum(upstream_requests) FROM ledger WHERE rowid <= ?
             GROUP BY 1, 2, 3, 4, 5
             ON CONFLICT (day, account, operation, error_code, charge)
             DO UPDATE SET calls = calls + excluded.calls, amount = amount + excluded.amount, cache_hits = cache_hits + excluded.cache_hits, upstream_requests = upstream_requests + excluded.upstream_requests`,
          )
          .run(last);
        removed = Number(this.db.prepare("DELETE FROM ledger WHERE rowid <= ?").run(last).changes);
        this.db.prepare("UPDATE ledger_feed SET folded_through = max(folded_through, ?)").run(last);
      }
      this.db.prepare("DELETE FROM refusals WHERE day < ?").run(beforeDay);
    });
    if (e !== undefined) throw e;
    return removed;
  }

  /**
   * The ledger in commit order, by rowid: SQLite gives a new row one past
   * the highest held (retention keeps the newest, so never one given
   * before), and one process writes the ledger, one transaction at a time.
   * So a read that sees a row sees every row before it, and a row committed
   * later has a higher number: a place given is never passed over.
   */
  async feed(after: FeedPlace | undefined, limit: number, only?: { readonly account: string; readonly scan: number }): Promise<{ rows: LedgerRow[]; place: FeedPlace; more?: boolean }> {
    const from = after === undefined ? 0 : feedSeq(after);
    const take = Math.max(0, Math.floor(limit));
    // The rows, the fold mark and (for one account) the newest row in one read, as one moment left them. One account's
    // rows are read from a range of rowids (the ledger's own order, numbered without gaps but where retention folded),
    // so at most `scan` rows are looked at whatever the account did: `+account` keeps the account's index out, which
    // would read every row of the account for each answer (1M rows, 50,000 of one account: 8.8 ms an answer, 3.5 so).
    // Rows as arrays (`rowColumns`): a follower of every call reads each row and is handed it from the read thread.
    const [found, marks, top] = await this.reader.read([
      only === undefined
        ? { sql: `SELECT ${rowColumns} FROM ledger WHERE rowid > :from ORDER BY rowid LIMIT :limit`, params: { from, limit: take }, bigints: true, arrays: true }
        : {
            sql: `SELECT ${rowColumns} FROM ledger WHERE rowid > max(:from, (SELECT folded_through FROM ledger_feed)) AND rowid <= max(:from, (SELECT folded_through FROM ledger_feed)) + :scan AND +account = :account ORDER BY rowid LIMIT :limit`,
            params: { from, limit: take, scan: Math.max(1, Math.floor(only.scan)), account: only.account },
            bigints: true,
            arrays: true,
          },
      { sql: "SELECT folded_through FROM ledger_feed", params: {} },
      ...(only === undefined ? [] : [{ sql: "SELECT coalesce(max(rowid), 0) AS seq FROM ledger", params: {} }]),
    ]);
    const folded = Number(marks![0]?.folded_through ?? 0);
    if (after !== undefined && from < folded) {
      throw foldedPastCursor();
    }
    const rows = found as unknown as unknown[][];
    const last = rows.at(-1);
    if (only === undefined) return { rows: rows.map(rowFromColumns), place: `e${last === undefined ? Math.max(from, folded) : Number(last[0])}` };
    // Past the last row given when the page is full; else past every row read: the range's end, or the newest row.
    const start = Math.max(from, folded);
    const end = Math.min(start + Math.max(1, Math.floor(only.scan)), Math.max(start, Number(top![0]!.seq)));
    const full = take > 0 && rows.length === take;
    return { rows: rows.map(rowFromColumns), place: `e${full ? Number(last![0]) : end}`, more: !full && end < Number(top![0]!.seq) };
  }

  /** Past the newest row, or past what retention folded where it folded every row (`Meter.feedEnd`). */
  async feedEnd(): Promise<FeedPlace> {
    const [end] = await this.reader.read([{ sql: "SELECT max(coalesce((SELECT max(rowid) FROM ledger), 0), (SELECT folded_through FROM ledger_feed)) AS seq", params: {} }]);
    return `e${Number(end![0]?.seq ?? 0)}`;
  }

  /** The newest request id in the ledger, so a restarted process never reuses one. */
  lastRequestId(): string | undefined {
    return (this.db.prepare("SELECT max(request_id) AS id FROM ledger").get() as { id: string | null }).id ?? undefined;
  }
}

/** A place the embedded store's `feed` gave: "e" and a row's rowid. */
function feedSeq(place: FeedPlace): number {
  const m = /^e(0|[1-9][0-9]{0,15})$/.exec(place);
  if (m === null || !Number.isSafeInteger(Number(m[1]))) throw new UsagePageError("token", "the cursor was not given by this gateway's store (the embedded store's cursors are its own; in shared mode, the shared store's)");
  return Number(m[1]);
}

/** The order calls are listed in (LedgerPlace): the order of the ledger's indexes, then request id. */
const inPlaceOrder = "ORDER BY day DESC, at DESC, request_id DESC";

function decrement(map: Map<string, number>, key: string): void {
  const n = (map.get(key) ?? 0) - 1;
  if (n <= 0) map.delete(key);
  else map.set(key, n);
}

/** A ledger row's columns as its readers take them (as arrays: `SqlRead.arrays`), its number (rowid) first, in the order `rowFromColumns` reads them. */
const rowColumns = "rowid, request_id, at, day, account, operation, error_code, charge, price, cache_hit, upstream_requests, latency_us, transport, client_ip";

/** A row of `rowColumns`, read as an array (bigints). */
function rowFromColumns(r: unknown[]): LedgerRow {
  return {
    requestId: r[1] as string,
    at: Number(r[2]),
    day: r[3] as string,
    account: (r[4] as string | null) || undefined,
    operation: ((r[5] as string | null) || undefined) as OperationId | undefined,
    code: Number(r[6]) as ErrorCode,
    charge: r[7] as ChargeClass,
    price: r[8] as bigint,
    cacheHit: Number(r[9]) === 1,
    upstreamRequests: Number(r[10]),
    latencyMicros: Number(r[11]),
    transport: r[12] as Transport,
    clientIp: (r[13] as string | null) ?? undefined,
  };
}
