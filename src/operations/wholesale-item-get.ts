import { WholesaleService } from "../gen/gateway/catalogue/v1/wholesale_pb.js";
import { itemGetOperation } from "./item-detail.ts";

/**
 * The wholesale catalogue's item detail: `GET /wholesale/item_get/`,
 * `WholesaleService/ItemGet`. Spec 4.2's `sid` "is obtainable from the item
 * detail operation of the same catalogue": it is this answer's
 * `seller_info.sid`, which `item_search_peerbuy` takes for the same item.
 */
export const wholesaleItemGet = itemGetOperation(WholesaleService, "ItemGet", { ttlSeconds: 600 });
