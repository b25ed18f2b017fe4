import { alertTypes, type AlertRecord, type AlertSettings } from "../../core/alerts.ts";
import { formatMoney } from "../../core/money.ts";

/** An alert's id, type, time and delivery as both services' alert messages name them (each adds what it tells in its own form). */
export function alertFields(a: AlertRecord) {
  return {
    id: `alert-${a.id}`,
    type: alertTypes[a.kind],
    createdAtMs: BigInt(a.at),
    attempts: a.attempts,
    ...(a.deliveredAt !== undefined ? { deliveredAtMs: BigInt(a.deliveredAt) } : {}),
    ...(a.nextAt !== undefined ? { nextAttemptMs: BigInt(a.nextAt) } : {}),
    lastError: a.lastError,
  };
}

/** An account's alert lines as both services' settings messages name them (each adds where the alerts go, in its own form). */
export function alertLineFields(s: AlertSettings) {
  return {
    usagePercents: [...s.usagePercents],
    ...(s.balanceBelow !== undefined ? { balanceBelow: formatMoney(s.balanceBelow) } : {}),
    ...(s.expiryDays !== undefined ? { expiryDays: s.expiryDays } : {}),
  };
}
