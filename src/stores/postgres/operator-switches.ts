import type pg from "pg";
import type { OperationId } from "../../contract/operations.ts";
import type { MaintenanceChange, OperatorSwitches } from "../../core/operator-switches.ts";
import type { MaybeAsync } from "../../core/maybe-async.ts";
import { readWithin } from "../../core/clock.ts";
import { callStatement, databaseFault } from "./postgres-database.ts";

/** How long a replica trusts what it read of the switches: every replica sees a change within this. */
export const switchesFreshMs = 1000;

/** Maintenance switches in the shared store, read at most once a second per replica. */
export class PostgresOperatorSwitches implements OperatorSwitches {
  private readonly pool: pg.Pool;
  private readonly now: () => number;
  private known: { on: Set<OperationId>; at: number } | undefined;
  private reading: Promise<Set<OperationId>> | undefined;

  constructor(pool: pg.Pool, now: () => number = Date.now) {
    this.pool = pool;
    this.now = now;
  }

  /** At once (MaybeAsync) from what was read less than `switchesFreshMs` ago, else after one shared reread. */
  inMaintenance(operation: OperationId): MaybeAsync<boolean> {
    if (this.known !== undefined && readWithin(this.known.at, this.now(), switchesFreshMs)) return this.known.on.has(operation);
    // One read at a time; calls arriving meanwhile wait for it.
    this.reading ??= this.read()
      .catch((e: unknown) => {
        throw databaseFault(e);
      })
      .finally(() => (this.reading = undefined));
    return this.reading.then((on) => on.has(operation));
  }

  async setMaintenance(operation: OperationId, on: boolean, change: { readonly at: number; readonly by: string }): Promise<void> {
    // The switch and its record in one statement: recorded only where it changed something.
    const switched = on
      ? "INSERT INTO maintenance (operation) VALUES ($1) ON CONFLICT DO NOTHING RETURNING operation"
      : "DELETE FROM maintenance WHERE operation = $1 RETURNING operation";
    await this.pool.query(
      `WITH switched AS (${switched}) INSERT INTO maintenance_changes (at, operation, switched_on, actor) SELECT $2, operation, $3, $4 FROM switched`,
      [operation, String(change.at), on, change.by],
    );
    this.known = undefined;
  }

  async maintenanceChanges(): Promise<MaintenanceChange[]> {
    const r = await this.pool.query<{ at: string; operation: OperationId; switched_on: boolean; actor: string }>(
      "SELECT at::text AS at, operation, switched_on, actor FROM maintenance_changes ORDER BY id",
    );
    return r.rows.map((row) => ({ at: Number(row.at), operation: row.operation, on: row.switched_on, by: row.actor }));
  }

  async maintenance(): Promise<OperationId[]> {
    return [...(await this.read())].sort();
  }

  private async read(): Promise<Set<OperationId>> {
    const at = this.now();
    const on = new Set((await this.pool.query<{ operation: string }>(callStatement("SELECT operation FROM maintenance"))).rows.map((r) => r.operation));
    this.known = { on, at };
    return on;
  }
}
