import type { OperationId } from "../contract/operations.ts";
import type { MaybeAsync } from "./maybe-async.ts";

/** One switch of an operation into or out of maintenance, with who made it (`AccountChange.by`). */
export interface MaintenanceChange {
  readonly at: number;
  readonly operation: OperationId;
  /** true: put under maintenance; false: taken out. */
  readonly on: boolean;
  readonly by: string;
}

/** Operator switches that hold for every account (maintenance: 4009 for everyone). */
export interface OperatorSwitches {
  /** On every call's path: answered at once where the switches are at hand (MaybeAsync). */
  inMaintenance(operation: OperationId): MaybeAsync<boolean>;
  /**
   * Switches an operation into or out of maintenance. A switch that changes
   * something is recorded with when and by whom, in the transaction (or
   * statement) that makes it; one that changes nothing is not.
   */
  setMaintenance(operation: OperationId, on: boolean, change: { readonly at: number; readonly by: string }): Promise<void>;
  maintenance(): Promise<OperationId[]>;
  /** Every recorded switch, oldest first. */
  maintenanceChanges(): Promise<MaintenanceChange[]>;
}
