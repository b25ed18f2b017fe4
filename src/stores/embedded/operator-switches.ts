import type { DatabaseSync, StatementSync } from "node:sqlite";
import type { OperationId } from "../../contract/operations.ts";
import type { OperatorSwitches } from "../../core/operator-switches.ts";
import type { ChangeWatch } from "./change-watch.ts";

/** Maintenance switches in the embedded store, kept in memory and reread when another process commits. */
export class SqliteOperatorSwitches implements OperatorSwitches {
  private readonly watch: ChangeWatch;
  private seenVersion = -1;
  private onNow = new Set<OperationId>();
  private readonly all: StatementSync;
  private readonly on: StatementSync;
  private readonly off: StatementSync;

  constructor(db: DatabaseSync, watch: ChangeWatch) {
    this.watch = watch;
    this.all = db.prepare("SELECT operation FROM maintenance ORDER BY operation");
    this.on = db.prepare("INSERT OR IGNORE INTO maintenance (operation) VALUES (?)");
    this.off = db.prepare("DELETE FROM maintenance WHERE operation = ?");
  }

  inMaintenance(operation: OperationId): boolean {
    const version = this.watch.current();
    if (version !== this.seenVersion) {
      this.onNow = new Set(this.read());
      this.seenVersion = version;
    }
    return this.onNow.has(operation);
  }

  async setMaintenance(operation: OperationId, on: boolean): Promise<void> {
    (on ? this.on : this.off).run(operation);
    this.onNow = new Set(this.read());
  }

  async maintenance(): Promise<OperationId[]> {
    return this.read();
  }

  private read(): OperationId[] {
    return (this.all.all() as { operation: OperationId }[]).map((r) => r.operation);
  }
}
