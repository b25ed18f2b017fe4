import type { AlertKind, AlertRecord, DueAlert, KeptAlertSecret } from "../core/alerts.ts";
import { keptFromJson } from "../core/secret-grace.ts";

/** An alert as both SQL stores keep it (SQLite hands integers as bigint or number, PostgreSQL int8 as text). */
export interface AlertRow {
  readonly id: number | bigint | string;
  readonly account: string;
  readonly kind: string;
  readonly level: number | bigint | string;
  readonly value: number | bigint | string;
  readonly lim: number | bigint | string;
  readonly day: string;
  readonly at: number | bigint | string;
  readonly attempts: number | bigint | string;
  readonly next_at: number | bigint | string | null;
  readonly delivered_at: number | bigint | string | null;
  readonly last_error: string;
}

const optional = (v: number | bigint | string | null): number | undefined => (v === null ? undefined : Number(v));

export function alertFromRow(r: AlertRow): AlertRecord {
  return {
    id: Number(r.id),
    account: r.account,
    kind: r.kind as AlertKind,
    level: BigInt(r.level),
    value: BigInt(r.value),
    limit: BigInt(r.lim),
    day: r.day,
    at: Number(r.at),
    attempts: Number(r.attempts),
    deliveredAt: optional(r.delivered_at),
    nextAt: optional(r.next_at),
    lastError: r.last_error,
  };
}

/** A claimed alert with the account's URL and secret as they are now (none when its alerts were turned off since). */
export function dueAlertFromRow(
  r: AlertRow & { readonly url: string | null; readonly secret: string | null; readonly previous: string | KeptAlertSecret | KeptAlertSecret[] | null },
): DueAlert {
  const previous = keptFromJson(typeof r.previous === "string" ? (JSON.parse(r.previous) as KeptAlertSecret[]) : r.previous);
  return { ...alertFromRow(r), url: r.url ?? "", secret: r.secret ?? "", ...(previous !== undefined ? { previousSecrets: previous } : {}) };
}
