import type { DatabaseSync, StatementSync } from "node:sqlite";
import type { OperationId } from "../../contract/operations.ts";
import type { OperatorSwitches } from "../../core/meter.ts";

/** Maintenance switches in the embedded store, read on every call so a change applies at once. */
export class SqliteOperatorSwitches implements OperatorSwitches {
  private readonly one: StatementSync;
  private readonly all: StatementSync;
  private readonly on: StatementSync;
  private readonly off: StatementSync;

  constructor(db: DatabaseSync) {
    this.one = db.prepare("SELECT 1 AS on_ FROM maintenance WHERE operation = ?");
    this.all = db.prepare("SELECT operation FROM maintenance ORDER BY operation");
    this.on = db.prepare("INSERT OR IGNORE INTO maintenance (operation) VALUES (?)");
    this.off = db.prepare("DELETE FROM maintenance WHERE operation = ?");
  }

  inMaintenance(operation: OperationId): boolean {
    return this.one.get(operation) !== undefined;
  }

  setMaintenance(operation: OperationId, on: boolean): void {
    (on ? this.on : this.off).run(operation);
  }

  maintenance(): OperationId[] {
    return (this.all.all() as { operation: OperationId }[]).map((r) => r.operation);
  }
}
