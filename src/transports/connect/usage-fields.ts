import { chargeOf } from "../../contract/error-codes.ts";
import type { BalanceAccounting, LedgerRow, UsageTotal } from "../../core/meter.ts";
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

/** A ledger row's fields as both services' call messages name them (the AdminService's `UsageRow` adds the account). */
export function callFields(r: LedgerRow) {
  return {
    requestId: r.requestId,
    atMs: BigInt(r.at),
    day: r.day,
    operation: r.operation ?? "",
    errorCode: r.code,
    charge: chargeOf[r.charge],
    price: formatMoney(r.price),
    cacheHit: r.cacheHit,
    latencyUs: BigInt(r.latencyMicros),
    transport: r.transport,
    clientIp: r.clientIp ?? "",
  };
}

/** A balance statement's entry as both services' `BalanceChange` messages name its fields, but its kind (each package has its own enum). */
export function balanceChangeFields(e: BalanceAccounting["entries"][number]) {
  return {
    atMs: BigInt(e.at),
    amount: formatMoney(e.amount),
    ...(e.balance !== undefined ? { balance: formatMoney(e.balance) } : {}),
    takenBefore: formatMoney(e.takenBefore),
    reference: e.reference,
  };
}
