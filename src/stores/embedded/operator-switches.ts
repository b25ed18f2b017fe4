import type { DatabaseSync, StatementSync } from "node:sqlite";
import type { OperationId } from "../../contract/operations.ts";
import type { MaintenanceChange, OperatorSwitches } from "../../core/operator-switches.ts";
import type { ChangeWatch } from "./change-watch.ts";
import { writeTransaction } from "./sqlite-database.ts";

/** Maintenance switches in the embedded store, kept in memory and reread when another process commits. */
export class SqliteOperatorSwitches implements OperatorSwitches {
  private readonly db: DatabaseSync;
  private readonly watch: ChangeWatch;
  private seenVersion = -1;
  private onNow = new Set<OperationId>();
  private readonly all: StatementSync;
  private readonly on: StatementSync;
  private readonly off: StatementSync;
  private readonly record: StatementSync;
  private readonly changes: StatementSync;

  constructor(db: DatabaseSync, watch: ChangeWatch) {
    this.db = db;
    this.watch = watch;
    this.all = db.prepare("SELECT operation FROM maintenance ORDER BY operation");
    this.on = db.prepare("INSERT OR IGNORE INTO maintenance (operation) VALUES (?)");
    this.off = db.prepare("DELETE FROM maintenance WHERE operation = ?");
    this.record = db.prepare("INSERT INTO maintenance_changes (at, operation, switched_on, actor) VALUES (?, ?, ?, ?)");
    this.changes = db.prepare("SELECT at, operation, switched_on, actor FROM maintenance_changes ORDER BY id");
  }

  inMaintenance(operation: OperationId): boolean {
    const version = this.watch.current();
    if (version !== this.seenVersion) {
      this.onNow = new Set(this.read());
      this.seenVersion = version;
    }
    return this.onNow.has(operation);
  }

  async setMaintenance(operation: OperationId, on: boolean, change: { readonly at: number; readonly by: string }): Promise<void> {
    writeTransaction(this.db, () => {
      if (Number((on ? this.on : this.off).run(operation).changes) === 1) this.record.run(change.at, operation, on ? 1 : 0, change.by);
    });
    this.onNow = new Set(this.read());
  }

  async maintenanceChanges(): Promise<MaintenanceChange[]> {
    return (this.changes.all() as { at: number; operation: OperationId; switched_on: number; actor: string }[]).map((r) => ({ at: r.at, operation: r.operation, on: r.switched_on === 1, by: r.actor }));
  }

  async maintenance(): Promise<OperationId[]> {
    return this.read();
  }

  private read(): OperationId[] {
    return (this.all.all() as { operation: OperationId }[]).map((r) => r.operation);
  }
}
