import { chargeOf } from "../../contract/error-codes.ts";
import type { UsageTotal } from "../../core/meter.ts";
import { formatMoney } from "../../core/money.ts";

/** A usage total's fields as both services' `UsageTotal` messages name them (the AdminService's adds the account). */
export function usageTotalFields(t: UsageTotal) {
  return {
    day: t.day,
    operation: t.operation ?? "",
    errorCode: t.code,
    charge: chargeOf[t.charge],
    calls: BigInt(t.calls),
    amount: formatMoney(t.amount),
    cacheHits: BigInt(t.cacheHits),
    clientIp: t.clientIp ?? "",
  };
}
