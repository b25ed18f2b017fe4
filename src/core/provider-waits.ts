/**
 * The waits a paid provider asked for (its Retry-After), shared by every
 * replica that calls it: one replica told to wait makes them all wait, so
 * the provider that asked is sent nothing more by any of them, rather than
 * one more request for each replica that had not been told yet; and a
 * replica started during a wait (a new one, or one started again) holds
 * what is left of it. Keyed by the gateway's catalogue name (each
 * catalogue's source waits on its own). A wait is a duration (ms): each
 * replica holds it from when it hears, on its own monotonic clock, so
 * replicas' clocks need not agree. Redis keeps them in shared mode; the
 * embedded store keeps one gateway's through its restarts.
 */
export interface ProviderWaits {
  /** This replica was told to wait `ms` by the provider of `catalogue`: every other replica is told too. */
  tell(catalogue: string, ms: number): void;
  /**
   * `hold` is called with what is left of each wait for `catalogue` told
   * elsewhere: as it is told, and, for a wait told before this replica
   * heard (it started, or its link was down), as soon as it can know.
   */
  listen(catalogue: string, hold: (ms: number) => void): void;
  close(): void;
}
