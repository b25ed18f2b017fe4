import { clone, create, toBinary } from "@bufbuild/protobuf";
import { legacyBinaryList } from "../catalogue/legacy-binary.ts";
import { isObject, numericId, readLegacyMessage, requireComplete, requireId, shopId } from "../catalogue/legacy-message.ts";
import { legacyLayouts } from "../contract/legacy-layout.ts";
import { operationContract } from "../contract/operations.ts";
import type { Operation, RecordKind } from "../core/operation.ts";
import {
  ItemSearchPeerbuyResponseSchema,
  PeerViewedItemSchema,
  WholesaleService,
  type ItemSearchPeerbuyResponse,
  type PeerViewedItem,
} from "../gen/gateway/catalogue/v1/wholesale_pb.js";

/**
 * An import line `{"kind":"peer_viewed","num_iid":"…","sid":"…","item":[{…}]}`:
 * the peer-viewed items of one item of one shop (an empty list answers 2000).
 * Stored as the response message holding just the list.
 */
export const peerViewedRecord: RecordKind<ItemSearchPeerbuyResponse> = {
  name: "peer_viewed",
  schema: ItemSearchPeerbuyResponseSchema,
  defaultCatalogue: "wholesale",
  read(line) {
    const numIid = requireId(line.num_iid, "num_iid", numericId);
    const sid = requireId(line.sid, "sid", shopId);
    if (!Array.isArray(line.item)) throw new Error("item must be a list of peer-viewed items");
    const key = `${numIid}/${sid}`;
    // The short path, when every item takes it; else the general reader, which says what is wrong.
    const bytes = legacyBinaryList(ItemSearchPeerbuyResponseSchema.field.item, line.item);
    if (bytes !== undefined) return { key, bytes, obtainable: true };
    const items = line.item.map((e, i) => readLegacyMessage(PeerViewedItemSchema, e, `item[${i}]`));
    line.item.forEach((e, i) => requireComplete(PeerViewedItemSchema, e, `item[${i}]`));
    return { key, bytes: toBinary(ItemSearchPeerbuyResponseSchema, create(ItemSearchPeerbuyResponseSchema, { item: items })), obtainable: true };
  },
};

/**
 * Peer-viewed items (spec 4.2): `GET /wholesale/item_search_peerbuy/`,
 * `WholesaleService/ItemSearchPeerbuy`. Given an item and its shop, the
 * items buyers of peer shops are also viewing.
 */
export const wholesaleItemSearchPeerbuy: Operation<PeerViewedItem[], ItemSearchPeerbuyResponse> = {
  ...operationContract(WholesaleService, "ItemSearchPeerbuy", [
    { name: "num_iid", required: true, accepts: "numeric", maxLength: 20 },
    { name: "sid", required: true, accepts: "token", maxLength: 64 },
  ]),
  legacyLayout: legacyLayouts.peerViewed,
  ttlSeconds: 600,
  record: peerViewedRecord,
  recordKey: (a) => `${a.num_iid}/${a.sid}`,
  answer: (stored, a) =>
    stored.item.length === 0 ? { notFound: `no peer-viewed items for item ${a.num_iid} of shop ${a.sid}` } : { value: stored.item },
  notFound: (a) => `no peer-viewed items for item ${a.num_iid} of shop ${a.sid}`,
  unobtainable: (a) => `the peer-viewed items of item ${a.num_iid} of shop ${a.sid} cannot be obtained`,
  upstreamArgs: (a) => ({ num_iid: a.num_iid!, sid: a.sid! }),
  translate: (items, t) =>
    items.map((i) => {
      const out = clone(PeerViewedItemSchema, i);
      out.title = t(i.title);
      return out;
    }),
  lastId: (items) => items.at(-1)?.numIid ?? "0",
  example(lines) {
    const line = lines.find((l) => l.kind === peerViewedRecord.name && Array.isArray(l.item) && l.item.length > 0 && l.item.every(isObject));
    return line === undefined ? undefined : { num_iid: String(line.num_iid), sid: String(line.sid) };
  },
};
