import type { DatabaseSync, StatementSync } from "node:sqlite";
import type { Found, NotFound } from "../../core/catalogue-source.ts";
import { storedAnswer, type CatalogueStore, type StoredRecord } from "../../core/catalogue-store.ts";
import type { Args, Operation } from "../../core/operation.ts";
import { WalCheckpointer } from "./wal-checkpointer.ts";

/**
 * The embedded catalogue: every record kind the operations read, in one
 * SQLite table keyed by catalogue, kind and the operation's record key, kept
 * as protobuf bytes. A lookup is one indexed read and one decode. It is both
 * a catalogue source and the place imports write to.
 */
export class EmbeddedCatalogue implements CatalogueStore {
  readonly label = "embedded";
  readonly local = true;
  private readonly db: DatabaseSync;
  private readonly byKey: StatementSync;
  private readonly put: StatementSync;
  private readonly counts: StatementSync;
  private readonly anyRow: StatementSync;
  private readonly bulkWalLimitBytes: number | undefined;
  /** While a bulk run is on: the thread that checkpoints the WAL in place of the commits. */
  private checkpointer: WalCheckpointer | undefined;

  /** `bulkWalLimitBytes`: how long the WAL may grow in a bulk run (default: the checkpointer's). */
  constructor(db: DatabaseSync, options: { readonly bulkWalLimitBytes?: number } = {}) {
    this.db = db;
    this.bulkWalLimitBytes = options.bulkWalLimitBytes;
    this.byKey = db.prepare("SELECT record, obtainable, stored_at FROM catalogue_records WHERE catalogue = ? AND kind = ? AND key = ?");
    this.put = db.prepare("INSERT OR REPLACE INTO catalogue_records (catalogue, kind, key, record, obtainable, stored_at) VALUES (?, ?, ?, ?, ?, ?)");
    this.counts = db.prepare("SELECT catalogue, kind, count(*) AS n FROM catalogue_records GROUP BY catalogue, kind");
    this.anyRow = db.prepare("SELECT 1 AS one FROM catalogue_records LIMIT 1");
  }

  async fetch(operation: Operation, args: Args): Promise<Found | NotFound> {
    const row = this.byKey.get(operation.catalogue, operation.record.name, operation.recordKey(args)) as { record: Uint8Array; obtainable: number; stored_at: number } | undefined;
    return storedAnswer(operation, args, row && { record: row.record, obtainable: row.obtainable !== 0, storedAt: row.stored_at });
  }

  async storeBatch(records: readonly StoredRecord[], storedAt: number): Promise<void> {
    this.db.exec("BEGIN IMMEDIATE");
    try {
      for (const r of records) {
        this.put.run(r.catalogue, r.kind.name, r.key, r.bytes, r.obtainable ? 1 : 0, storedAt);
      }
      this.db.exec("COMMIT");
    } catch (e) {
      if (this.db.isTransaction) this.db.exec("ROLLBACK");
      throw e;
    }
    await this.checkpointer?.written();
  }

  /** For an import: checkpoints move to a thread of their own (see wal-checkpointer.ts) until the answer is called. */
  beginBulk(): () => Promise<void> {
    if (this.checkpointer !== undefined) throw new Error("a bulk run is already on");
    const checkpointer = (this.checkpointer = WalCheckpointer.start(this.db, this.bulkWalLimitBytes));
    return async () => {
      if (this.checkpointer !== checkpointer) return;
      this.checkpointer = undefined;
      await checkpointer?.close();
    };
  }

  /** Records held, per catalogue and kind (`retail/item_detail` → 320). */
  async size(): Promise<Map<string, number>> {
    const rows = this.counts.all() as { catalogue: string; kind: string; n: number }[];
    return new Map(rows.map((r) => [`${r.catalogue}/${r.kind}`, r.n]));
  }

  /** Whether the catalogue holds no record at all. */
  async empty(): Promise<boolean> {
    return this.anyRow.get() === undefined;
  }
}
