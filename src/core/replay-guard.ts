/** Remembers signatures already used, for as long as they could be replayed. */
export interface ReplayGuard {
  /** Records `id`; true when it was already recorded and has not expired. */
  seen(id: string, now: number, ttlMs: number): Promise<boolean>;
}

/** Replay guard of one process: ids with their expiry, swept as they lapse. */
export class MemoryReplayGuard implements ReplayGuard {
  private readonly until = new Map<string, number>();
  private nextSweep = 0;

  async seen(id: string, now: number, ttlMs: number): Promise<boolean> {
    if (now >= this.nextSweep) {
      for (const [k, t] of this.until) if (t <= now) this.until.delete(k);
      this.nextSweep = now + 10_000;
    }
    const t = this.until.get(id);
    if (t !== undefined && t > now) return true;
    this.until.set(id, now + ttlMs);
    return false;
  }
}
