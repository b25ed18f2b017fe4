import { RetailService } from "../gen/gateway/catalogue/v1/retail_pb.js";
import { itemGetOperation } from "./item-detail.ts";

/** The retail catalogue's item detail (spec 4.3): `GET /retail/item_get/`, `RetailService/ItemGet`. */
export const retailItemGet = itemGetOperation(RetailService, "ItemGet", { ttlSeconds: 600 });
