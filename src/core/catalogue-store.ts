import type { CatalogueSource } from "./catalogue-source.ts";
import type { RecordKind } from "./operation.ts";

/** A record ready to store: its kind, catalogue and key, as the import reads them. */
export interface StoredRecord {
  readonly kind: RecordKind;
  readonly catalogue: string;
  readonly key: string;
  readonly record: unknown;
  readonly obtainable: boolean;
}

/**
 * A catalogue the gateway holds itself (as opposed to an upstream provider):
 * a source of answers and the place imports write to.
 */
export interface CatalogueStore extends CatalogueSource {
  /** Writes the records stamped with `storedAt` (Unix seconds), in one transaction: all land or none. */
  storeBatch(records: readonly StoredRecord[], storedAt: number): Promise<void>;
  /** Whether it holds no record at all. */
  empty(): Promise<boolean>;
  /** Records held, per `<catalogue>/<kind>`. */
  size(): Promise<Map<string, number>>;
}
