import type pg from "pg";
import type { Found, NotFound } from "../../core/catalogue-source.ts";
import { storedAnswer, type CatalogueStore, type StoredRecord } from "../../core/catalogue-store.ts";
import { callStatement, databaseFault } from "./postgres-database.ts";
import type { Args, Operation } from "../../core/operation.ts";

/**
 * The catalogue in the shared store: one table keyed by catalogue, kind and
 * the operation's record key, records as protobuf bytes, exactly as the
 * embedded store keeps them (so `gateway migrate` copies them as they are).
 */
export class PostgresCatalogue implements CatalogueStore {
  /** The `_ddf` marker: the gateway's own catalogue, as opposed to the upstream provider. */
  readonly label = "embedded";
  readonly local = true;
  private readonly pool: pg.Pool;

  constructor(pool: pg.Pool) {
    this.pool = pool;
  }

  async fetch(operation: Operation, args: Args): Promise<Found | NotFound> {
    let r: pg.QueryResult<{ record: Buffer; obtainable: boolean; stored_at: string }>;
    try {
      r = await this.pool.query(
        callStatement("SELECT record, obtainable, stored_at::text AS stored_at FROM catalogue_records WHERE catalogue = $1 AND kind = $2 AND key = $3", [
          operation.catalogue,
          operation.record.name,
          operation.recordKey(args),
        ]),
      );
    } catch (e) {
      throw databaseFault(e);
    }
    const row = r.rows[0];
    return storedAnswer(operation, args, row && { record: row.record, obtainable: row.obtainable, storedAt: Number(row.stored_at) });
  }

  async storeBatch(records: readonly StoredRecord[], storedAt: number): Promise<void> {
    if (records.length === 0) return;
    await this.pool.query(
      `INSERT INTO catalogue_records (catalogue, kind, key, record, obtainable, stored_at)
       SELECT c, k, key, r, o, $6 FROM unnest($1::text[], $2::text[], $3::text[], $4::bytea[], $5::boolean[]) AS t (c, k, key, r, o)
       ON CONFLICT (catalogue, kind, key) DO UPDATE SET record = excluded.record, obtainable = excluded.obtainable, stored_at = excluded.stored_at`,
      [
        records.map((x) => x.catalogue),
        records.map((x) => x.kind.name),
        records.map((x) => x.key),
        records.map((x) => Buffer.from(x.bytes.buffer, x.bytes.byteOffset, x.bytes.byteLength)),
        records.map((x) => x.obtainable),
        storedAt,
      ],
    );
  }

  async empty(): Promise<boolean> {
    return (await this.pool.query("SELECT 1 FROM catalogue_records LIMIT 1")).rowCount === 0;
  }

  async size(): Promise<Map<string, number>> {
    const r = await this.pool.query<{ catalogue: string; kind: string; n: string }>("SELECT catalogue, kind, count(*)::text AS n FROM catalogue_records GROUP BY 1, 2 ORDER BY 1, 2");
    return new Map(r.rows.map((x) => [`${x.catalogue}/${x.kind}`, Number(x.n)]));
  }
}
