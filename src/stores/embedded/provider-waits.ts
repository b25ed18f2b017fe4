import type { DatabaseSync, StatementSync } from "node:sqlite";
import type { ProviderWaits } from "../../core/provider-waits.ts";

/**
 * The providers' waits in the embedded store (ProviderWaits), so a gateway
 * started again while one lasts (a deploy, a restart, a crash and its
 * supervisor) sends the provider nothing before it is over, as the process
 * that was told would not have. A provider that is sent requests during the
 * wait it asked for may count them against the account, or block it.
 *
 * There is one serving process per data directory, so nobody else is told:
 * a wait is kept as the time it ends, on the store's clock (the wall clock:
 * a process started again shares no monotonic clock with the one before),
 * and read back as what is left of it when the source listens, on start.
 * A clock set back while the gateway was down can lengthen what is left by
 * as much; the source holds no wait past the longest it honours (5 min).
 *
 * Keeping a wait is one statement on the serving connection, and only when
 * a provider asks for one. A write that fails (a full disk) is let go: the
 * process that was told holds the wait in memory either way, and what is
 * lost is only its survival of a restart.
 */
export class SqliteProviderWaits implements ProviderWaits {
  private readonly now: () => number;
  private readonly keep: StatementSync;
  private readonly read: StatementSync;

  constructor(db: DatabaseSync, now: () => number) {
    this.now = now;
    // A longer wait already kept stands; one that is over is replaced.
    this.keep = db.prepare("INSERT INTO provider_waits (catalogue, until) VALUES (?, ?) ON CONFLICT (catalogue) DO UPDATE SET until = max(until, excluded.until)");
    this.read = db.prepare("SELECT until FROM provider_waits WHERE catalogue = ?");
  }

  tell(catalogue: string, ms: number): void {
    if (!(ms > 0)) return;
    try {
      this.keep.run(catalogue, this.now() + Math.ceil(ms));
    } catch {
      // held in memory by the source that was told; only the restart's memory of it is lost
    }
  }

  listen(catalogue: string, hold: (ms: number) => void): void {
    let until: number | undefined;
    try {
      until = (this.read.get(catalogue) as { until: number } | undefined)?.until;
    } catch {
      return; // a store that cannot be read now fails the readiness check on its own
    }
    const left = until === undefined ? 0 : until - this.now();
    if (left > 0) hold(left);
  }

  close(): void {}
}
