/**
 * The top-level keys of each legacy response shape, in wire order
 * (legacy-wire-notes.md). Records inside `item` follow their proto field
 * order, which is declared in the legacy order.
 */
export const legacyLayouts = {
  itemDetail: [
    "item", "error", "secache", "secache_time", "secache_date", "translate_status", "translate_time",
    "language", "reason", "error_code", "cache", "api_info", "execution_time", "server_time", "client_ip",
    "call_args", "api_type", "translate_language", "translate_engine", "server_memory", "request_id", "last_id",
  ],
  peerViewed: [
    "item", "error", "reason", "error_code", "cache", "api_info", "execution_time", "server_time", "client_ip",
    "call_args", "api_type", "translate_language", "translate_engine", "server_memory", "request_id", "_ddf", "last_id",
  ],
  error: [
    "error", "reason", "error_code", "success", "cache", "api_info", "execution_time", "server_time",
    "call_args", "api_type", "translate_language", "translate_engine", "server_memory", "request_id",
  ],
} as const;

export type LegacyStatusKey = Exclude<(typeof legacyLayouts)[keyof typeof legacyLayouts][number], "item">;

/** Legacy keys that are not the proto field name (proto names must be snake_case). */
export const legacyKeyOfField: Readonly<Record<string, string>> = {
  brand_id: "brandId",
  root_cat_id: "rootCatId",
};
