import { dayOf } from "./clock.ts";
import type { Meter } from "./meter.ts";

export interface LedgerRetentionOptions {
  /** Rows of days older than this many days are folded (GATEWAY_LEDGER_RETENTION_DAYS); 0 keeps every row. */
  readonly days: number;
  /** The gateway's zone: the days counted back are its days, as the ledger's are. */
  readonly timeZone: string;
  readonly now: () => number;
  /** How often a run starts after the first (an hour). */
  readonly everyMs?: number;
  /** What an operator hears: the rows folded by a run, and a run that failed. */
  readonly onFolded?: (removed: number, beforeDay: string) => void;
  readonly onError?: (e: unknown) => void;
}

/**
 * Retention on either store: `Meter.expire` for the days past the setting,
 * once at start and then hourly, in the serving process only (the CLI's
 * runtimes do not fold). A store that answers at once (the embedded store)
 * has folded when `start` returns, before the first call is served; a
 * remote one folds in the background, in steps, and `close` stops it
 * between two steps and waits for the step under way, so a shutdown never
 * leaves a fold half done (each step is one transaction anyway).
 */
export class LedgerRetention {
  private readonly stopping = new AbortController();
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<void> | undefined;

  private readonly meter: Pick<Meter, "expire">;
  private readonly options: LedgerRetentionOptions;

  constructor(meter: Pick<Meter, "expire">, options: LedgerRetentionOptions) {
    this.meter = meter;
    this.options = options;
  }

  start(): void {
    if (this.options.days <= 0) return;
    this.run();
    this.timer = setInterval(() => this.run(), this.options.everyMs ?? 3_600_000);
    this.timer.unref();
  }

  /** One run now, unless one is still under way (a long first fold of a shared ledger outlasts the hour). */
  run(): void {
    if (this.running !== undefined || this.stopping.signal.aborted) return;
    const beforeDay = dayOf(this.options.now() - this.options.days * 86_400_000, this.options.timeZone);
    const done = (removed: number) => {
      if (removed > 0) this.options.onFolded?.(removed, beforeDay);
    };
    try {
      const removed = this.meter.expire(beforeDay, this.stopping.signal);
      if (!(removed instanceof Promise)) return done(removed);
      this.running = removed.then(done, (e: unknown) => this.options.onError?.(e)).finally(() => (this.running = undefined));
    } catch (e) {
      this.options.onError?.(e);
    }
  }

  async close(): Promise<void> {
    clearInterval(this.timer);
    this.stopping.abort();
    await this.running;
  }
}
