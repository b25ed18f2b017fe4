// A ledger row as the console shows it, one cell a column: the same on the
// Usage screen's "Latest calls" and on Live calls.
import type { UsageRow } from "../gen/gateway/admin/v1/admin_pb.js";
import { fourDigits } from "./api.ts";
import { h } from "./dom.ts";

export const callColumns = ["Time", "Request id", "Account", "Operation", "Code", "Transport", "Address", "Cache", "Latency ms", "Price"];

/** The columns that hold figures, aligned right. */
export const callNumeric = [8, 9];

export function callCells(r: UsageRow): (string | Node)[] {
  return [new Date(Number(r.atMs)).toISOString().replace("T", " ").slice(0, 19), h("code", {}, r.requestId), r.account || "(none)", r.operation, fourDigits(r.errorCode), r.transport, r.clientIp || "(not kept)", r.cacheHit ? "hit" : "", (Number(r.latencyUs) / 1000).toFixed(1), r.price];
}
