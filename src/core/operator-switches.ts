import type { OperationId } from "../contract/operations.ts";
import type { MaybeAsync } from "./maybe-async.ts";

/** Operator switches that hold for every account (maintenance: 4009 for everyone). */
export interface OperatorSwitches {
  /** On every call's path: answered at once where the switches are at hand (MaybeAsync). */
  inMaintenance(operation: OperationId): MaybeAsync<boolean>;
  setMaintenance(operation: OperationId, on: boolean): Promise<void>;
  maintenance(): Promise<OperationId[]>;
}
