import type { Account } from "./accounts.ts";
import { formatMoney } from "./money.ts";
import { formatRate } from "./call-rate.ts";
import { formatAllowedAddresses } from "./allowed-addresses.ts";
import { formatAlertSettings } from "./alerts.ts";
import { latestUntil } from "./secret-grace.ts";

/** What an operator did to an account; balance moves are the meter's (`BalanceChange`) and are recorded there. */
export type AccountChangeKind = "created" | "status" | "plan" | "operation" | "price" | "secret" | "alerts";

/** One setting as it was and as it became; empty text for "none" (an operation not added, a price not set). */
export interface FieldChange {
  readonly field: string;
  readonly before: string;
  readonly after: string;
}

/**
 * One change of an account's settings, as its history keeps it: when, what
 * kind, who asked (`by`: the CLI's user and host, or the admin API's caller
 * address), and each setting it moved. Secrets never appear: a rotation is
 * recorded as `secret: → rotated`, and the old secret's grace as the time it ends.
 */
export interface AccountChange {
  readonly at: number;
  readonly kind: AccountChangeKind;
  readonly by: string;
  readonly changes: readonly FieldChange[];
}

/** A settings change to make: the fields to write, and the record of it. */
export interface AccountEdit {
  readonly fields: AccountFields;
  readonly change: AccountChange;
}

/** What an operator can change of an account: everything but its key, external id, creation and balance (the meter's). */
export type AccountFields = Partial<Omit<Account, "key" | "createdAt" | "balance" | "externalId" | "createdWith">>;

const instant = (ms: number) => new Date(ms).toISOString();

/** The settings of an account as text, one entry per field; the secret not at all (`fieldChanges` marks a new one). */
function settings(a: Account): Map<string, string> {
  const out = new Map<string, string>([
    ["name", a.name],
    // Only where one was given (it is given once, when the account is made).
    ...(a.externalId === undefined ? [] : [["externalId", a.externalId] as [string, string]]),
    ["status", a.status],
    ["dailyMax", String(a.dailyMax)],
    ["concurrency", String(a.concurrency)],
    // Only where one is set: an account without a rate limit says nothing of it (and its older history stays as it was).
    ...(a.rate === undefined ? [] : [["rate", formatRate(a.rate)] as [string, string]]),
    // The same: an account that may call from anywhere says nothing of it.
    ...(a.allowedFrom === undefined ? [] : [["allowedFrom", formatAllowedAddresses(a.allowedFrom)] as [string, string]]),
    // Its URL's origin only: a receiver's URL often holds its token.
    ...(a.alerts === undefined ? [] : [["alerts", formatAlertSettings(a.alerts)] as [string, string]]),
    ["expires", a.expires],
    ["zone", a.zone],
  ]);
  for (const [op, state] of [...a.operations].sort(([x], [y]) => (x < y ? -1 : 1))) out.set(`operations[${op}]`, state);
  for (const [op, price] of [...a.prices].sort(([x], [y]) => (x < y ? -1 : 1))) out.set(`prices[${op}]`, formatMoney(price));
  // Until when a replaced secret works: the latest kept (each has its own time; secret-grace.ts).
  const oldSecretUntil = latestUntil(a.previousSecrets);
  if (oldSecretUntil !== undefined) out.set("oldSecretUntil", instant(oldSecretUntil));
  const oldAlertSecretUntil = latestUntil(a.previousAlertSecrets);
  if (oldAlertSecretUntil !== undefined) out.set("oldAlertSecretUntil", instant(oldAlertSecretUntil));
  return out;
}

/**
 * Every setting that differs between two states of an account, in a fixed
 * order (with `before` empty for an account that did not exist). A new
 * secret shows as `secret: → rotated`: never a hash, salt or key.
 */
export function fieldChanges(before: Account | undefined, after: Account): FieldChange[] {
  const was = before === undefined ? new Map<string, string>() : settings(before);
  const now = settings(after);
  const changes: FieldChange[] = [];
  for (const field of new Set([...now.keys(), ...was.keys()])) {
    const b = was.get(field) ?? "";
    const a = now.get(field) ?? "";
    if (a !== b) changes.push({ field, before: b, after: a });
  }
  if (before !== undefined && before.secretHash !== after.secretHash) changes.push({ field: "secret", before: "", after: "rotated" });
  if (before?.alertSecret !== after.alertSecret) changes.push({ field: "alertSecret", before: "", after: after.alertSecret === undefined ? "removed" : "made" });
  return changes;
}
