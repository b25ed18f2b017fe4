import { clone, toBinary, type DescService } from "@bufbuild/protobuf";
import { legacyBinary } from "../catalogue/legacy-binary.ts";
import { isObject, numericId, readLegacyMessage, requireComplete, requireId } from "../catalogue/legacy-message.ts";
import { legacyLayouts } from "../contract/legacy-layout.ts";
import { operationContract, type OperationArg } from "../contract/operations.ts";
import type { Operation, RecordKind } from "../core/operation.ts";
import { ItemDetailSchema, type ItemDetail } from "../gen/gateway/catalogue/v1/retail_pb.js";

/**
 * The item detail record (spec 2.3) and the `item_get` operation every
 * catalogue that has detail records serves with it.
 */

/**
 * An import line `{"kind":"item_detail","catalogue":"…","item":{…},"obtainable":true}`:
 * `catalogue` defaults to retail (files from before the wholesale detail
 * records), `obtainable` to true (false makes item_get answer 2000). An item
 * that cannot be obtained never shows its fields, so its id is enough.
 */
export const itemDetailRecord: RecordKind<ItemDetail> = {
  name: "item_detail",
  schema: ItemDetailSchema,
  defaultCatalogue: "retail",
  read(line) {
    // The short path, when the record takes it; else the general reader, which says what is wrong.
    const bytes = legacyBinary(ItemDetailSchema, line.item);
    const item = bytes === undefined ? readLegacyMessage(ItemDetailSchema, line.item, "item") : undefined;
    const raw = line.item as { num_iid?: unknown; numIid?: unknown };
    const key = requireId(item === undefined ? (raw.num_iid ?? raw.numIid) : item.numIid, "item.num_iid", numericId);
    if (line.obtainable !== undefined && typeof line.obtainable !== "boolean") throw new Error("obtainable must be true or false");
    const obtainable = line.obtainable !== false;
    if (item === undefined) return { key, bytes: bytes!, obtainable };
    if (obtainable) requireComplete(ItemDetailSchema, line.item, "item");
    return { key, bytes: toBinary(ItemDetailSchema, item), obtainable };
  },
};

/** The item as sold without a promotion: the original prices in place of the promotion prices (changes `out`, the caller's own copy). */
function withoutPromotion(out: ItemDetail): ItemDetail {
  const original = Number.parseFloat(out.orginalPrice);
  if (Number.isFinite(original)) {
    out.price = original;
    out.totalPrice = original;
  }
  for (const sku of out.skus?.sku ?? []) {
    if (sku.orginalPrice !== "") sku.price = sku.orginalPrice;
  }
  return out;
}

/** Splits `a:b:c` into its first `n - 1` parts and the rest. */
function parts(text: string, separator: string, n: number): string[] {
  const all = text.split(separator);
  return all.length <= n ? all : [...all.slice(0, n - 1), all.slice(n - 1).join(separator)];
}

/**
 * The texts of a detail record: the title, the location, the shop title,
 * property names and values, aliases and SKU property names. Numbers, ids,
 * URLs and `<pid>:<vid>` codes are never touched, and the `;`/`:`/`,`
 * structure of the compound fields is rebuilt exactly.
 */
export function translateItemDetail(item: ItemDetail, t: (text: string) => string): ItemDetail {
  const out = clone(ItemDetailSchema, item);
  const entries = (text: string, translatable: number[]) =>
    text
      .split(";")
      .map((entry) => {
        const p = parts(entry, ":", Math.max(...translatable) + 1);
        return p.map((x, i) => (translatable.includes(i) ? t(x) : x)).join(":");
      })
      .join(";");
  out.title = t(item.title);
  out.location = t(item.location);
  if (out.sellerInfo) out.sellerInfo.title = t(out.sellerInfo.title);
  for (const prop of out.props) {
    prop.name = t(prop.name);
    prop.value = prop.value.split(",").map(t).join(",");
  }
  out.propsName = item.propsName === "" ? "" : entries(item.propsName, [2, 3]);
  out.propertyAlias = item.propertyAlias === "" ? "" : entries(item.propertyAlias, [2]);
  for (const code of Object.keys(out.propsList)) out.propsList[code] = parts(out.propsList[code]!, ":", 2).map(t).join(":");
  for (const sku of out.skus?.sku ?? []) sku.propertiesName = sku.propertiesName === "" ? "" : entries(sku.propertiesName, [2, 3]);
  return out;
}

const args: OperationArg[] = [
  { name: "num_iid", required: true, accepts: "numeric", maxLength: 20 },
  { name: "is_promotion", required: false, accepts: ["", "0", "1"], maxLength: 1 },
];

/**
 * `item_get` of one catalogue: the full detail record of one item, with the
 * promotion prices when `is_promotion=1` and the original prices otherwise.
 * Its RPC is `methodName` of `service`, whose `google.api.http` path names
 * the catalogue.
 */
export function itemGetOperation(service: DescService, methodName: string, options: { readonly ttlSeconds: number }): Operation<ItemDetail, ItemDetail> {
  const contract = operationContract(service, methodName, args);
  if (contract.item.message.typeName !== ItemDetailSchema.typeName || contract.item.list) throw new Error(`${contract.method.output.typeName}.item must be one ItemDetail`);
  return {
    ...contract,
    legacyLayout: legacyLayouts.itemDetail,
    ttlSeconds: options.ttlSeconds,
    record: itemDetailRecord,
    recordKey: (a) => a.num_iid!,
    answer: (item, a) => ({ value: a.is_promotion === "1" ? item : withoutPromotion(item) }),
    notFound: (a) => `item ${a.num_iid} was not found`,
    unobtainable: (a) => `item ${a.num_iid} cannot be obtained`,
    upstreamArgs: (a) => ({ num_iid: a.num_iid!, ...(a.is_promotion === "1" ? { is_promotion: "1" } : {}) }),
    translate: translateItemDetail,
    lastId: () => "0",
    example(lines) {
      const line = lines.find((l) => l.kind === itemDetailRecord.name && (l.catalogue ?? itemDetailRecord.defaultCatalogue) === contract.catalogue && l.obtainable !== false);
      return line !== undefined && isObject(line.item) ? { num_iid: String(line.item.num_iid), is_promotion: "1" } : undefined;
    },
  };
}
