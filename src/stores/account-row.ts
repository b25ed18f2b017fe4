import type { OperationId } from "../contract/operations.ts";
import type { AccountChange, AccountChangeKind, AccountFields } from "../core/account-history.ts";
import type { Account, OperationState, PreviousSecret } from "../core/accounts.ts";
import type { CallRate } from "../core/call-rate.ts";
import type { AlertSettings, KeptAlertSecret } from "../core/alerts.ts";
import { keptFromJson } from "../core/secret-grace.ts";

/**
 * An account as both SQL stores keep it: the same columns, operations and
 * prices as JSON, the balance read beside it from the meter's table. Each
 * driver hands the values in its own types (SQLite: JSON text and bigint;
 * PostgreSQL: parsed jsonb and text for int8), so the reader takes either.
 */
export interface AccountRow {
  readonly key: string;
  readonly name: string;
  readonly secret_hash: string;
  readonly secret_salt: string;
  readonly legacy_signing_key: string | null;
  readonly hmac_key: string | null;
  readonly status: string;
  readonly operations: string | Record<string, OperationState>;
  readonly daily_max: number | bigint | string;
  readonly concurrency: number | bigint | string;
  readonly prices: string | Record<string, string>;
  readonly expires: string;
  readonly zone: string;
  /** The replaced secrets still accepted, as a JSON list (`PreviousSecret`; one object as kept before a rotation could keep several), or null. */
  readonly previous_secret: string | PreviousSecret | PreviousSecret[] | null;
  /** The rate limit as JSON (`CallRate`), or null for none. */
  readonly rate: string | CallRate | null;
  /** The addresses the key works from, as a JSON list, or null for anywhere. */
  readonly allowed_from?: string | string[] | null;
  /** Alert settings as JSON (`AlertsJson`), or null for none. */
  readonly alerts?: string | AlertsJson | null;
  readonly alert_secret?: string | null;
  /** The replaced alert secrets still signed with, as a JSON list (`KeptAlertSecret`), or null. */
  readonly previous_alert_secret?: string | KeptAlertSecret | KeptAlertSecret[] | null;
  readonly external_id?: string | null;
  readonly created_with?: string | null;
  readonly created_at: number | bigint | string;
  readonly balance: bigint | string | null;
}

/** The columns an account is written with (the balance is the meter's), in the order the PostgreSQL store binds them (`created_at` last). */
export const accountColumns = [
  "key", "name", "secret_hash", "secret_salt", "legacy_signing_key", "hmac_key", "status", "operations", "daily_max", "concurrency", "prices", "expires", "zone", "previous_secret", "rate", "allowed_from", "alerts", "alert_secret", "previous_alert_secret", "external_id", "created_with", "created_at",
] as const;

/** Alert settings as both stores keep them: the floor as a decimal string of micro-units (the stores' triggers read `usage` and `below`). */
export interface AlertsJson {
  readonly url: string;
  readonly usage: readonly number[];
  readonly below?: string;
  readonly expiryDays?: number;
}

function alertsFromJson(a: AlertsJson): AlertSettings {
  return { url: a.url, usagePercents: a.usage, ...(a.below !== undefined ? { balanceBelow: BigInt(a.below) } : {}), ...(a.expiryDays !== undefined ? { expiryDays: a.expiryDays } : {}) };
}

function alertsToJson(a: AlertSettings): string {
  return JSON.stringify({
    url: a.url,
    usage: a.usagePercents,
    ...(a.balanceBelow !== undefined ? { below: a.balanceBelow.toString() } : {}),
    ...(a.expiryDays !== undefined ? { expiryDays: a.expiryDays } : {}),
  } satisfies AlertsJson);
}

const json = <T>(v: string | T): T => (typeof v === "string" ? (JSON.parse(v) as T) : v);

export function accountFromRow(r: AccountRow): Account {
  return {
    key: r.key,
    name: r.name,
    secretHash: r.secret_hash,
    secretSalt: r.secret_salt,
    legacySigningKey: r.legacy_signing_key ?? undefined,
    hmacKey: r.hmac_key ?? undefined,
    previousSecrets: keptFromJson(r.previous_secret === null || r.previous_secret === undefined ? undefined : json<PreviousSecret | PreviousSecret[]>(r.previous_secret)),
    status: r.status === "stopped" ? "stopped" : "active",
    operations: new Map(Object.entries(json<Record<string, OperationState>>(r.operations))) as Map<OperationId, OperationState>,
    dailyMax: Number(r.daily_max),
    concurrency: Number(r.concurrency),
    rate: r.rate === null || r.rate === undefined ? undefined : json<CallRate>(r.rate),
    allowedFrom: r.allowed_from === null || r.allowed_from === undefined ? undefined : json<string[]>(r.allowed_from),
    alerts: r.alerts === null || r.alerts === undefined ? undefined : alertsFromJson(json<AlertsJson>(r.alerts)),
    alertSecret: r.alert_secret ?? undefined,
    previousAlertSecrets: keptFromJson(r.previous_alert_secret === null || r.previous_alert_secret === undefined ? undefined : json<KeptAlertSecret | KeptAlertSecret[]>(r.previous_alert_secret)),
    balance: r.balance === null ? undefined : BigInt(r.balance),
    prices: new Map(Object.entries(json<Record<string, string>>(r.prices)).map(([op, micros]) => [op as OperationId, BigInt(micros)])),
    expires: r.expires,
    zone: r.zone,
    createdAt: Number(r.created_at),
    ...(r.external_id === null || r.external_id === undefined ? {} : { externalId: r.external_id, createdWith: r.created_with ?? undefined }),
  };
}

/** The values of `accountColumns` for an account, JSON as text. */
export function accountToRow(a: Omit<Account, "balance">): Record<(typeof accountColumns)[number], string | number | null> {
  return {
    key: a.key,
    name: a.name,
    secret_hash: a.secretHash,
    secret_salt: a.secretSalt,
    legacy_signing_key: a.legacySigningKey ?? null,
    hmac_key: a.hmacKey ?? null,
    status: a.status,
    operations: JSON.stringify(Object.fromEntries(a.operations)),
    daily_max: a.dailyMax,
    concurrency: a.concurrency,
    prices: JSON.stringify(Object.fromEntries([...a.prices].map(([op, micros]) => [op, micros.toString()]))),
    expires: a.expires,
    zone: a.zone,
    previous_secret: a.previousSecrets === undefined || a.previousSecrets.length === 0 ? null : JSON.stringify(a.previousSecrets),
    rate: a.rate === undefined ? null : JSON.stringify({ calls: a.rate.calls, seconds: a.rate.seconds, burst: a.rate.burst }),
    allowed_from: a.allowedFrom === undefined ? null : JSON.stringify(a.allowedFrom),
    alerts: a.alerts === undefined ? null : alertsToJson(a.alerts),
    alert_secret: a.alertSecret ?? null,
    previous_alert_secret: a.previousAlertSecrets === undefined || a.previousAlertSecrets.length === 0 ? null : JSON.stringify(a.previousAlertSecrets.map((k) => ({ secret: k.secret, until: k.until }))),
    external_id: a.externalId ?? null,
    created_with: a.createdWith ?? null,
    created_at: a.createdAt,
  };
}

type Column = (typeof accountColumns)[number];

/** The column each settable field of an account is written to. */
const fieldColumns: Record<keyof Required<AccountFields>, Column> = {
  name: "name",
  secretHash: "secret_hash",
  secretSalt: "secret_salt",
  legacySigningKey: "legacy_signing_key",
  hmacKey: "hmac_key",
  previousSecrets: "previous_secret",
  status: "status",
  operations: "operations",
  dailyMax: "daily_max",
  concurrency: "concurrency",
  rate: "rate",
  allowedFrom: "allowed_from",
  alerts: "alerts",
  alertSecret: "alert_secret",
  previousAlertSecrets: "previous_alert_secret",
  prices: "prices",
  expires: "expires",
  zone: "zone",
};

/**
 * What a change writes: the columns of the fields it names (a field named
 * with `undefined` is cleared) whose stored value it moves, in
 * `accountColumns` order, and their new values.
 */
export function changedColumns(current: Account, next: Account, fields: AccountFields): { columns: Column[]; values: (string | number | null)[] } {
  const named = new Set(Object.keys(fields).map((f) => fieldColumns[f as keyof AccountFields]));
  const before = accountToRow(current);
  const after = accountToRow(next);
  const columns = accountColumns.filter((c) => named.has(c) && before[c] !== after[c]);
  return { columns, values: columns.map((c) => after[c]) };
}

/** A recorded change as both SQL stores keep it: its moves as JSON `[field, before, after]` triples. */
export interface AccountChangeRow {
  readonly at: number | bigint | string;
  readonly kind: string;
  readonly actor: string;
  readonly changes: string | [string, string, string][];
}

export function changesToJson(change: AccountChange): string {
  return JSON.stringify(change.changes.map((c) => [c.field, c.before, c.after]));
}

export function accountChangeFromRow(r: AccountChangeRow): AccountChange {
  return {
    at: Number(r.at),
    kind: r.kind as AccountChangeKind,
    by: r.actor,
    changes: json<[string, string, string][]>(r.changes).map(([field, before, after]) => ({ field, before, after })),
  };
}
