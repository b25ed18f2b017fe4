import type { DatabaseSync, StatementSync } from "node:sqlite";
import type { ChargeClass } from "../../contract/error-codes.ts";
import type { OperationId } from "../../contract/operations.ts";
import type { Account } from "../../core/accounts.ts";
import { GatewayError } from "../../core/gateway-error.ts";
import type { Admission, LedgerRow, Meter, Transport, UsageQuery, UsageReport, UsageSummary } from "../../core/meter.ts";
import { previousDay } from "../../core/clock.ts";
import { formatMoney } from "../../core/money.ts";
import { ErrorCode } from "../../gen/gateway/catalogue/v1/status_pb.js";

export interface SqliteMeterOptions {
  /** Rows wait at most this long for the group commit. */
  readonly commitIntervalMs: number;
  /** A batch this large commits at once. */
  readonly maxBatch: number;
  /** Told, after each commit, which accounts' balances it changed. */
  readonly onBalancesChanged: (accounts: ReadonlySet<string>) => void;
}

export const defaultMeterOptions: SqliteMeterOptions = { commitIntervalMs: 2, maxBatch: 512, onBalancesChanged: () => {} };

interface Queued {
  readonly row: LedgerRow;
  readonly admission: Admission | undefined;
  readonly done: { resolve(): void; reject(e: unknown): void };
}

const dayKey = (account: string, day: string) => `${account}\u0000${day}`;

/**
 * The meter of the embedded store. Committed counts and balances live in
 * SQLite; what this process has admitted but not yet committed lives here,
 * and every admission decision is one synchronous step over both, so no two
 * calls can pass the same last place. Ledger rows are group-committed: one
 * transaction every few milliseconds holds the rows, the day counts and the
 * balance deductions of the charged ones, so counts, balances and the
 * ledger always agree. Only the serving process admits calls; a process that
 * dies takes its in-flight slots with it.
 */
export class SqliteMeter implements Meter {
  private readonly db: DatabaseSync;
  private readonly options: SqliteMeterOptions;
  private readonly inFlight = new Map<string, number>();
  private readonly pendingCalls = new Map<string, number>();
  private readonly pendingAmount = new Map<string, bigint>();
  private queue: Queued[] = [];
  /**
   * Committed counts per account for its current day, kept in step with each
   * commit: this process is the only writer of day counts, so they need no
   * query per call.
   */
  private readonly summaries = new Map<string, { day: string; summary: { today: number; yesterday: number; before: number } }>();
  private timer: NodeJS.Timeout | NodeJS.Immediate | undefined;
  private readonly sql: Record<"insert" | "count" | "deduct" | "sums", StatementSync>;

  constructor(db: DatabaseSync, options: Partial<SqliteMeterOptions> = {}) {
    this.db = db;
    this.options = { ...defaultMeterOptions, ...options };
    this.sql = {
      insert: db.prepare(
        "INSERT INTO ledger (request_id, at, day, account, operation, error_code, charge, price, cache_hit, latency_us, transport) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
      ),
      count: db.prepare(
        "INSERT INTO usage_daily (account, day, charged) VALUES (?, ?, 1) ON CONFLICT (account, day) DO UPDATE SET charged = charged + 1",
      ),
      deduct: db.prepare("UPDATE accounts SET balance = balance - ? WHERE key = ? AND balance IS NOT NULL"),
      sums: db.prepare(`SELECT
          coalesce(sum(CASE WHEN day = :today THEN charged END), 0) AS today,
          coalesce(sum(CASE WHEN day = :yesterday THEN charged END), 0) AS yesterday,
          coalesce(sum(CASE WHEN day < :yesterday THEN charged END), 0) AS before
        FROM usage_daily WHERE account = :account`),
    };
  }

  admit(account: Account, operation: OperationId, day: string): Admission {
    const key = account.key;
    const inFlight = this.inFlight.get(key) ?? 0;
    if (inFlight >= account.concurrency) {
      throw new GatewayError(ErrorCode.RATE_LIMIT_EXCEEDED, `this account already has ${inFlight} calls in flight, its limit`);
    }
    const committed = this.usage(key, day, previousDay(day)).today;
    const pending = this.pendingCalls.get(dayKey(key, day)) ?? 0;
    if (committed + pending >= account.dailyMax) {
      throw new GatewayError(ErrorCode.CALLS_EXCEEDED, `the daily maximum of ${account.dailyMax} calls is reached; it resets at midnight ${account.zone}`);
    }
    const price = account.prices.get(operation) ?? 0n;
    if (account.balance !== undefined) {
      const available = account.balance - (this.pendingAmount.get(key) ?? 0n);
      if (available < price) {
        throw new GatewayError(ErrorCode.INSUFFICIENT_BALANCE, `the balance ${formatMoney(available)} does not cover the price ${formatMoney(price)} of ${operation}`);
      }
    }
    this.inFlight.set(key, inFlight + 1);
    this.pendingCalls.set(dayKey(key, day), pending + 1);
    this.pendingAmount.set(key, (this.pendingAmount.get(key) ?? 0n) + price);
    return { account: key, day, price };
  }

  record(row: LedgerRow, admission: Admission | undefined): Promise<void> {
    return new Promise((resolve, reject) => {
      this.queue.push({ row, admission, done: { resolve, reject } });
      if (this.queue.length >= this.options.maxBatch) this.flush();
      // 0: commit at the end of this turn of the event loop, with every row written in it.
      else this.timer ??= this.options.commitIntervalMs === 0 ? setImmediate(() => this.flush()) : setTimeout(() => this.flush(), this.options.commitIntervalMs);
    });
  }

  flush(): void {
    if (this.timer !== undefined) {
      clearTimeout(this.timer as NodeJS.Timeout);
      clearImmediate(this.timer as NodeJS.Immediate);
    }
    this.timer = undefined;
    const batch = this.queue;
    this.queue = [];
    if (batch.length === 0) return;
    // One transaction for the batch; if it fails, each row in its own, so one
    // bad row (say, an id written before) does not cost the others theirs.
    const failures = new Map<Queued, unknown>();
    const write = (rows: Queued[]) => {
      this.db.exec("BEGIN IMMEDIATE");
      try {
        for (const { row } of rows) {
          this.sql.insert.run(
            row.requestId, row.at, row.day, row.account ?? null, row.operation ?? null, row.code, row.charge,
            row.price, row.cacheHit ? 1 : 0, row.latencyMicros, row.transport,
          );
          if (row.charge === "charged" && row.account !== undefined) {
            this.sql.count.run(row.account, row.day);
            if (row.price > 0n) this.sql.deduct.run(row.price, row.account);
          }
        }
        this.db.exec("COMMIT");
        return undefined;
      } catch (e) {
        this.db.exec("ROLLBACK");
        return e;
      }
    };
    if (write(batch) !== undefined) {
      for (const queued of batch) {
        const e = write([queued]);
        if (e !== undefined) failures.set(queued, e);
      }
    }
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
    // Committed (or given up): the admissions' places are no longer pending.
    for (const { admission } of batch) if (admission !== undefined) this.settle(admission);
    for (const queued of batch) {
      const e = failures.get(queued);
      if (e === undefined) queued.done.resolve();
      else queued.done.reject(e);
    }
  }

  private settle(a: Admission): void {
    const k = dayKey(a.account, a.day);
    decrement(this.inFlight, a.account);
    decrement(this.pendingCalls, k);
    const left = (this.pendingAmount.get(a.account) ?? 0n) - a.price;
    if (left === 0n) this.pendingAmount.delete(a.account);
    else this.pendingAmount.set(a.account, left);
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

  query(q: UsageQuery): UsageReport {
    const where: string[] = [];
    const params: Record<string, string | number> = {};
    if (q.account !== undefined) (where.push("account = :account"), (params.account = q.account));
    if (q.from !== undefined) (where.push("day >= :from"), (params.from = q.from));
    if (q.to !== undefined) (where.push("day <= :to"), (params.to = q.to));
    if (q.operation !== undefined) (where.push("operation = :operation"), (params.operation = q.operation));
    if (q.code !== undefined) (where.push("error_code = :code"), (params.code = q.code));
    const filter = where.length > 0 ? `WHERE ${where.join(" AND ")}` : "";
    const totals = this.db.prepare(
      `SELECT account, day, operation, error_code, charge, count(*) AS calls, sum(price) AS amount FROM ledger ${filter}
       GROUP BY account, day, operation, error_code, charge ORDER BY day, account, operation, error_code`,
    );
    totals.setReadBigInts(true);
    const rows = this.db.prepare(`SELECT * FROM ledger ${filter} ORDER BY at DESC, request_id DESC LIMIT :limit`);
    rows.setReadBigInts(true);
    return {
      totals: (totals.all(params) as Record<string, unknown>[]).map((t) => ({
        account: (t.account as string | null) ?? undefined,
        day: t.day as string,
        operation: (t.operation as string | null) ?? undefined,
        code: Number(t.error_code) as ErrorCode,
        charge: t.charge as ChargeClass,
        calls: Number(t.calls),
        amount: t.amount as bigint,
      })),
      rows: q.rows ? (rows.all({ ...params, limit: q.rows }) as Record<string, unknown>[]).map(rowFromSql) : [],
    };
  }

  /** The newest request id in the ledger, so a restarted process never reuses one. */
  lastRequestId(): string | undefined {
    return (this.db.prepare("SELECT max(request_id) AS id FROM ledger").get() as { id: string | null }).id ?? undefined;
  }
}

function decrement(map: Map<string, number>, key: string): void {
  const n = (map.get(key) ?? 0) - 1;
  if (n <= 0) map.delete(key);
  else map.set(key, n);
}

function rowFromSql(r: Record<string, unknown>): LedgerRow {
  return {
    requestId: r.request_id as string,
    at: Number(r.at),
    day: r.day as string,
    account: (r.account as string | null) ?? undefined,
    operation: ((r.operation as string | null) ?? undefined) as OperationId | undefined,
    code: Number(r.error_code) as ErrorCode,
    charge: r.charge as ChargeClass,
    price: r.price as bigint,
    cacheHit: Number(r.cache_hit) === 1,
    latencyMicros: Number(r.latency_us),
    transport: r.transport as Transport,
  };
}
