import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { createHash } from "node:crypto";
import type { DatabaseSync, StatementSync } from "node:sqlite";
import type { CatalogueSource, Found, NotFound } from "../../core/catalogue-source.ts";
import { ItemDetailSchema, type ItemDetail } from "../../gen/gateway/catalogue/v1/retail_pb.js";
import { ItemSearchPeerbuyResponseSchema, type PeerViewedItem } from "../../gen/gateway/catalogue/v1/wholesale_pb.js";

function entryToken(...parts: (string | number)[]): string {
  return createHash("md5").update(parts.join("\u0000")).digest("hex");
}

/** The item as sold without a promotion: the original prices in place of the promotion prices. */
function withoutPromotion(item: ItemDetail): ItemDetail {
  const original = Number.parseFloat(item.orginalPrice);
  if (Number.isFinite(original)) {
    item.price = original;
    item.totalPrice = original;
  }
  for (const sku of item.skus?.sku ?? []) {
    if (sku.orginalPrice !== "") sku.price = sku.orginalPrice;
  }
  return item;
}

/**
 * The embedded catalogue: item detail and peer-viewed records in the SQLite
 * store, kept as protobuf bytes. It is both a catalogue source and the place
 * imports write to.
 */
export class EmbeddedCatalogue implements CatalogueSource {
  readonly label = "embedded";
  private readonly db: DatabaseSync;
  private readonly detailById: StatementSync;
  private readonly peersById: StatementSync;
  private readonly putDetail: StatementSync;
  private readonly putPeers: StatementSync;
  private readonly counts: StatementSync;

  constructor(db: DatabaseSync) {
    this.db = db;
    this.detailById = db.prepare("SELECT detail, obtainable, stored_at FROM retail_items WHERE num_iid = ?");
    this.peersById = db.prepare("SELECT items, stored_at FROM wholesale_peers WHERE num_iid = ? AND sid = ?");
    this.putDetail = db.prepare("INSERT OR REPLACE INTO retail_items (num_iid, detail, obtainable, stored_at) VALUES (?, ?, ?, ?)");
    this.putPeers = db.prepare("INSERT OR REPLACE INTO wholesale_peers (num_iid, sid, items, stored_at) VALUES (?, ?, ?, ?)");
    this.counts = db.prepare("SELECT (SELECT count(*) FROM retail_items) AS retail, (SELECT count(*) FROM wholesale_peers) AS wholesale");
  }

  async itemDetail(numIid: string, promotion: boolean): Promise<Found<ItemDetail> | NotFound> {
    const row = this.detailById.get(numIid) as { detail: Uint8Array; obtainable: number; stored_at: number } | undefined;
    if (row === undefined) return { found: false, reason: `item ${numIid} was not found` };
    if (row.obtainable === 0) return { found: false, reason: `item ${numIid} cannot be obtained` };
    const item = fromBinary(ItemDetailSchema, row.detail);
    return {
      found: true,
      value: promotion ? item : withoutPromotion(item),
      storedAt: row.stored_at,
      token: entryToken("retail/item_get", numIid, promotion ? 1 : 0, row.stored_at),
    };
  }

  async peerViewed(numIid: string, sid: string): Promise<Found<PeerViewedItem[]> | NotFound> {
    const row = this.peersById.get(numIid, sid) as { items: Uint8Array; stored_at: number } | undefined;
    if (row === undefined) return { found: false, reason: `item ${numIid} of shop ${sid} was not found` };
    const items = fromBinary(ItemSearchPeerbuyResponseSchema, row.items).item;
    if (items.length === 0) return { found: false, reason: `no peer-viewed items for item ${numIid} of shop ${sid}` };
    return { found: true, value: items, storedAt: row.stored_at, token: entryToken("wholesale/item_search_peerbuy", numIid, sid, row.stored_at) };
  }

  storeItemDetail(item: ItemDetail, obtainable: boolean, storedAt: number): void {
    this.putDetail.run(item.numIid, toBinary(ItemDetailSchema, item), obtainable ? 1 : 0, storedAt);
  }

  storePeerViewed(numIid: string, sid: string, items: PeerViewedItem[], storedAt: number): void {
    this.putPeers.run(numIid, sid, toBinary(ItemSearchPeerbuyResponseSchema, create(ItemSearchPeerbuyResponseSchema, { item: items })), storedAt);
  }

  /** Runs the writes of `work` in one transaction: all land or none. */
  transaction<T>(work: () => T): T {
    this.db.exec("BEGIN IMMEDIATE");
    try {
      const result = work();
      this.db.exec("COMMIT");
      return result;
    } catch (e) {
      this.db.exec("ROLLBACK");
      throw e;
    }
  }

  size(): { retail: number; wholesale: number } {
    return this.counts.get() as unknown as { retail: number; wholesale: number };
  }
}
