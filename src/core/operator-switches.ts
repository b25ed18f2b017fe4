import type { OperationId } from "../contract/operations.ts";

/** Operator switches that hold for every account (maintenance: 4009 for everyone). */
export interface OperatorSwitches {
  inMaintenance(operation: OperationId): Promise<boolean>;
  setMaintenance(operation: OperationId, on: boolean): Promise<void>;
  maintenance(): Promise<OperationId[]>;
}
