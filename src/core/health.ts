import { within } from "./within.ts";

/** One thing the gateway needs in order to serve: a store that must answer and take writes. */
export interface HealthCheck {
  readonly name: string;
  /**
   * A store the gateway serves without, less well (Redis: a cache): failing, it leaves the gateway ready, and reports
   * name it as degraded. Taking every replica out for a store they all share would refuse even the calls that need
   * none of it.
   */
  readonly degradesOnly?: boolean;
  /** Why it cannot serve now, or undefined when it can. May throw: that counts as failing, with the error's message. */
  run(): Promise<string | undefined>;
}

export interface CheckResult {
  readonly name: string;
  readonly ok: boolean;
  readonly reason?: string;
  /** Failing, it only degrades the gateway (HealthCheck.degradesOnly). */
  readonly degradesOnly?: boolean;
}

export interface ReadinessReport {
  readonly ready: boolean;
  readonly checks: readonly CheckResult[];
}

export interface ReadinessOptions {
  /** A check that has not answered in this long fails. */
  readonly timeoutMs: number;
  /** Reports younger than this are reused, so a storm of probes costs the stores one round of checks. */
  readonly reuseMs: number;
  /** While someone watches, the checks run this often and watchers hear of every change. */
  readonly watchIntervalMs: number;
}

export const defaultReadinessOptions: ReadinessOptions = { timeoutMs: 2000, reuseMs: 250, watchIntervalMs: 1000 };

const drainingCheck = "draining";

/**
 * Whether the gateway should be sent traffic: every check passes and it is
 * not draining. Draining is one-way: once `drain` is called (on SIGTERM) the
 * gateway stays unready until it exits, so load balancers stop sending it
 * calls before its connections close.
 */
export class Readiness {
  private readonly checks: readonly HealthCheck[];
  private readonly options: ReadinessOptions;
  private isDraining = false;
  private last: { at: number; report: ReadinessReport } | undefined;
  private running: Promise<ReadinessReport> | undefined;
  private readonly watchers = new Set<(report: ReadinessReport) => void>();
  private poller: NodeJS.Timeout | undefined;
  private readonly drained = new AbortController();

  constructor(checks: readonly HealthCheck[], options: Partial<ReadinessOptions> = {}) {
    this.checks = checks;
    this.options = { ...defaultReadinessOptions, ...options };
  }

  get draining(): boolean {
    return this.isDraining;
  }

  /** Aborted when draining starts: what waits without a deadline of its own (a WatchCalls stream) ends then. */
  get drainSignal(): AbortSignal {
    return this.drained.signal;
  }

  /** The names of the checks, draining included, as reports list them. */
  get checkNames(): readonly string[] {
    return [drainingCheck, ...this.checks.map((c) => c.name)];
  }

  drain(): void {
    if (this.isDraining) return;
    this.isDraining = true;
    this.drained.abort();
    this.last = undefined;
    void this.report().then((r) => this.tell(r));
  }

  /** Runs every check at once (or reuses a report younger than `reuseMs`). */
  report(): Promise<ReadinessReport> {
    const now = performance.now();
    if (this.last !== undefined && now - this.last.at < this.options.reuseMs) return Promise.resolve(this.last.report);
    this.running ??= this.runChecks().finally(() => (this.running = undefined));
    return this.running;
  }

  /** How many listen (`watch`): each health Watch stream open, while it is. */
  get watching(): number {
    return this.watchers.size;
  }

  /** Calls `listener` with every report whose readiness differs from the one before; returns the way to stop. */
  watch(listener: (report: ReadinessReport) => void): () => void {
    this.watchers.add(listener);
    this.poller ??= setInterval(() => void this.report().then((r) => this.tell(r)), this.options.watchIntervalMs);
    this.poller.unref();
    return () => {
      this.watchers.delete(listener);
      if (this.watchers.size === 0 && this.poller !== undefined) {
        clearInterval(this.poller);
        this.poller = undefined;
      }
    };
  }

  private lastTold: boolean | undefined;

  private tell(report: ReadinessReport): void {
    if (report.ready === this.lastTold) return;
    this.lastTold = report.ready;
    for (const watcher of this.watchers) watcher(report);
  }

  private async runChecks(): Promise<ReadinessReport> {
    const results = await Promise.all(this.checks.map((check) => this.runOne(check)));
    const checks: CheckResult[] = [this.isDraining ? { name: drainingCheck, ok: false, reason: "the gateway is shutting down" } : { name: drainingCheck, ok: true }, ...results];
    const report = { ready: checks.every((c) => c.ok || c.degradesOnly === true), checks };
    this.last = { at: performance.now(), report };
    return report;
  }

  private async runOne(check: HealthCheck): Promise<CheckResult> {
    try {
      const reason = await within(check.run(), this.options.timeoutMs, `no answer within ${this.options.timeoutMs} ms`);
      return reason === undefined ? { name: check.name, ok: true } : { name: check.name, ok: false, reason, ...degrading(check) };
    } catch (e) {
      return { name: check.name, ok: false, reason: (e as Error)?.message ?? String(e), ...degrading(check) };
    }
  }
}

function degrading(check: HealthCheck): Pick<CheckResult, "degradesOnly"> {
  return check.degradesOnly === true ? { degradesOnly: true } : {};
}
