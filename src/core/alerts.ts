import { createHmac, randomBytes } from "node:crypto";
import { dayOf } from "./clock.ts";
import { formatMoney, type Micros } from "./money.ts";
import { stillKept, type Grace } from "./secret-grace.ts";

/**
 * Usage alerts: an account may name a URL that the gateway tells, by a
 * signed POST, when the account's charged calls of a day reach given shares
 * of its daily maximum, when its balance falls below a floor, and when its
 * key's last day is near. So a team hears it is running out before its calls
 * answer 4013, 4016 or 4005.
 *
 * The store decides what to tell, in the transaction that moves the count
 * or the balance (triggers on its day counts and balances: schema step 20
 * embedded, 18 PostgreSQL), so each crossing is recorded exactly once
 * however many replicas charge the account at once, and never for calls
 * that were not committed. A key's expiry is looked for by the deliverers
 * (`AlertOutbox.recordExpiring`), once per last day. Delivery is at least
 * once: a delivery whose answer is lost is made again, with the same `id`.
 */
export interface AlertSettings {
  /** Where alerts are POSTed: an http or https URL. */
  readonly url: string;
  /** Shares of the daily maximum, in percent (1-1000), each told once a day when the day's charged calls reach it. */
  readonly usagePercents: readonly number[];
  /** Told each time a charged call takes the balance from at or above this to below it; undefined: never. */
  readonly balanceBelow?: Micros | undefined;
  /** Told once when the key's last day is this many days away or fewer (1-365); undefined: never. */
  readonly expiryDays?: number | undefined;
}

/** What an alert tells. */
export type AlertKind = "usage" | "balance" | "expiry";

/** An alert as the store recorded it, waiting to be delivered or delivered. */
export interface AlertRecord {
  /** The store's id; the delivered `id` is `alert-<id>`, the same on every attempt. */
  readonly id: number;
  readonly account: string;
  readonly kind: AlertKind;
  /** usage: the percent reached; balance: the floor crossed, in micro-units; expiry: the days asked for. */
  readonly level: bigint;
  /** usage: the day's charged calls when it was reached; balance: the balance it left, in micro-units; expiry: the days left then. */
  readonly value: bigint;
  /** usage: the daily maximum then. */
  readonly limit: bigint;
  /** usage: the account's day (YYYY-MM-DD); balance: the day (UTC) it fell; expiry: the key's last day. */
  readonly day: string;
  /** When the store recorded it (ms). */
  readonly at: number;
  /** Attempts made so far. */
  readonly attempts: number;
  /** When it was delivered (ms), if it was. */
  readonly deliveredAt: number | undefined;
  /** When the next attempt is due, if one is (ms); undefined once delivered or given up. */
  readonly nextAt: number | undefined;
  /** Why the last attempt failed, if it did: a status or an error, never the URL. */
  readonly lastError: string;
}

/** An alert claimed for one attempt, with what to send it to. */
export interface DueAlert extends AlertRecord {
  readonly url: string;
  readonly secret: string;
  /** The secrets the account's current one replaced, while alerts are still signed with them too (newest first). */
  readonly previousSecrets?: readonly KeptAlertSecret[] | undefined;
}

/**
 * An alert secret a new one replaced, still signed with until `until` (ms):
 * a change of secret with a grace, so a receiver can take the new one
 * without a moment where its check fails (secret-grace.ts).
 */
export interface KeptAlertSecret extends Grace {
  readonly secret: string;
}

/** The secrets an alert sent at `now` is signed with: the account's own, then those it replaced that are still kept. */
export function alertSecretsAt(secret: string, previous: readonly KeptAlertSecret[] | undefined, now: number): readonly string[] {
  return [secret, ...stillKept(previous, now).map((k) => k.secret)];
}

/** How an attempt ended. */
export type AlertAttempt = { readonly delivered: true } | { readonly delivered: false; readonly error: string };

/**
 * The store's side of alerts (each store records them by trigger): it hands
 * out the alerts due, each to one deliverer at a time (a claim that lapses,
 * so a replica that dies mid-attempt leaves it to another), and keeps how
 * each attempt ended.
 */
export interface AlertOutbox {
  /** Claims up to `limit` alerts due at `now` for `claimMs`, counting the attempt. */
  claimDue(now: number, limit: number, claimMs: number): Promise<DueAlert[]>;
  /** Records how a claimed attempt ended: delivered, or when to try again (undefined: given up). */
  settle(id: number, attempt: AlertAttempt, now: number, retryAt: number | undefined): Promise<void>;
  /** An account's alerts, newest first. */
  recent(account: string, limit: number): Promise<AlertRecord[]>;
  /**
   * Records an expiry alert for each active account whose key's last day is
   * within its `expiryDays` at `now` (in the account's zone), once per last
   * day however often it is asked and by however many replicas; returns how
   * many it recorded.
   */
  recordExpiring(now: number): Promise<number>;
}

/** An account whose alerts ask to hear of its key's expiry, as the stores read it for `expiringAlerts`. */
export interface ExpiryWatch {
  readonly key: string;
  readonly expires: string;
  readonly zone: string;
  readonly expiryDays: number;
}

/** The expiry alerts due at `now`: each account's last day with the days left, where that is within its days. */
export function expiringAlerts(watched: readonly ExpiryWatch[], now: number): { account: string; expires: string; days: number; left: number }[] {
  const out = [];
  for (const w of watched) {
    const today = dayOf(now, w.zone);
    const left = Math.round((Date.parse(`${w.expires}T00:00:00Z`) - Date.parse(`${today}T00:00:00Z`)) / 86_400_000);
    // Past its last day the key no longer works (4005): that is no longer a warning.
    if (left >= 0 && left <= w.expiryDays) out.push({ account: w.key, expires: w.expires, days: w.expiryDays, left });
  }
  return out;
}

/** How one POST of an alert went: a 2xx answer, or what else came (never the URL). */
export type AlertSent =
  | { readonly delivered: true; readonly status: number; readonly ms: number }
  | { readonly delivered: false; readonly status: number | undefined; readonly error: string; readonly ms: number; readonly final?: boolean };

/** What POSTs an alert, signed, to a URL (the exporter's AlertSender). */
export interface AlertPost {
  /** `secrets`: what it is signed with, one `v1` each (alertSignature). */
  send(url: string, secrets: readonly string[], id: string, body: string, unixSeconds: number): Promise<AlertSent>;
}

/**
 * A test alert's body (`alert.test`, with nothing to tell), signed and sent
 * as a real one is, so a receiver's URL and its check of the signature can be
 * tried before anything happens. Its id is its own, never an alert's.
 */
export function testAlertBody(account: string, at: number): { readonly id: string; readonly body: string } {
  const id = `alert-test-${randomBytes(6).toString("hex")}`;
  return { id, body: JSON.stringify({ id, type: "alert.test", account, created: new Date(at).toISOString(), data: {} }) };
}

/** The most shares of the daily maximum an account may be told of. */
export const maxUsagePercents = 8;

/** A URL alerts may be sent to, or the reason it may not; the reason never repeats the URL, which may hold a token. */
function checkAlertUrl(text: string): string {
  if (text.length > 2048) throw new Error("the alert URL is longer than 2048 characters");
  let url: URL;
  try {
    url = new URL(text);
  } catch {
    throw new Error("the alert URL is not a URL");
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") throw new Error("the alert URL must be http or https");
  if (url.username !== "" || url.password !== "") throw new Error("the alert URL cannot carry a user or password: alerts are signed instead");
  if (url.hash !== "") throw new Error("the alert URL cannot have a fragment");
  return url.href;
}

/**
 * Whether alerts may go to a URL's host under an operator's list of hosts
 * (GATEWAY_ALERT_HOSTS): a name or address as written (`hooks.example.com`,
 * `10.0.0.7`, `::1`), or `.example.com` for it and every name under it. An
 * empty list allows any.
 */
export function alertHostAllowed(url: string, hosts: readonly string[]): boolean {
  if (hosts.length === 0) return true;
  const host = new URL(url).hostname.toLowerCase().replace(/^\[(.*)\]$/, "$1");
  return hosts.some((h) => {
    const entry = h.toLowerCase();
    return entry.startsWith(".") ? host === entry.slice(1) || host.endsWith(entry) : host === entry;
  });
}

/** Why an alert may not go to a URL's host; never the URL. */
export const alertHostRefused = "the alert URL's host is not one this gateway sends alerts to (GATEWAY_ALERT_HOSTS)";

/**
 * Settings checked and written in one form (the URL normalized, the percents
 * sorted without repeats), or refused in words; `hosts`: the operator's list
 * of hosts alerts may go to (alertHostAllowed).
 */
export function checkAlertSettings(s: AlertSettings, hosts: readonly string[] = []): AlertSettings {
  const url = checkAlertUrl(s.url);
  if (!alertHostAllowed(url, hosts)) throw new Error(alertHostRefused);
  const usagePercents = [...new Set(s.usagePercents)].sort((a, b) => a - b);
  for (const p of usagePercents) {
    if (!Number.isInteger(p) || p < 1 || p > 1000) throw new Error(`a usage alert is a whole percent of the daily maximum from 1 to 1000, not ${p}`);
  }
  if (usagePercents.length > maxUsagePercents) throw new Error(`at most ${maxUsagePercents} usage alerts`);
  if (s.balanceBelow !== undefined && s.balanceBelow <= 0n) throw new Error("a balance alert's floor must be above 0");
  if (s.expiryDays !== undefined && (!Number.isInteger(s.expiryDays) || s.expiryDays < 1 || s.expiryDays > 365)) throw new Error(`an expiry alert comes 1 to 365 whole days before the key's last day, not ${s.expiryDays}`);
  if (usagePercents.length === 0 && s.balanceBelow === undefined && s.expiryDays === undefined) throw new Error("alerts need a usage share, a balance floor or a key's expiry to tell of");
  return { url, usagePercents, ...(s.balanceBelow !== undefined ? { balanceBelow: s.balanceBelow } : {}), ...(s.expiryDays !== undefined ? { expiryDays: s.expiryDays } : {}) };
}

/**
 * The URL as histories and listings show it: its origin and whether it has
 * more, never its path or query (a receiver's URL often holds its token).
 */
export function shownAlertUrl(url: string): string {
  const u = new URL(url);
  return u.pathname === "/" && u.search === "" ? u.origin : `${u.origin}/…`;
}

/** Settings as one line of text (account histories, the CLI). */
export function formatAlertSettings(s: AlertSettings): string {
  const parts = [shownAlertUrl(s.url)];
  if (s.usagePercents.length > 0) parts.push(`at ${s.usagePercents.map((p) => `${p}%`).join(",")}`);
  if (s.balanceBelow !== undefined) parts.push(`balance below ${formatMoney(s.balanceBelow)}`);
  if (s.expiryDays !== undefined) parts.push(`key expiry ${s.expiryDays} ${s.expiryDays === 1 ? "day" : "days"} before`);
  return parts.join("; ");
}

/** A new signing secret for an account's alerts: 32 random bytes, as `whsec_` and base64url. */
export function newAlertSecret(): string {
  return `whsec_${randomBytes(32).toString("base64url")}`;
}

/** Each kind's `type`, as the body and the AdminService name it. */
export const alertTypes: Record<AlertKind, string> = { usage: "usage.threshold", balance: "balance.low", expiry: "key.expiring" };

/** What an alert tells, as its body's `data`. */
export function alertData(a: AlertRecord): Record<string, string | number> {
  return a.kind === "usage"
    ? { day: a.day, percent: Number(a.level), calls: Number(a.value), dailyMax: Number(a.limit) }
    : a.kind === "balance"
      ? { balance: formatMoney(a.value), below: formatMoney(a.level) }
      : { expires: a.day, daysLeft: Number(a.value) };
}

/** The alert's body, as JSON: what happened, to which account, and the figures. */
export function alertBody(a: AlertRecord): string {
  return JSON.stringify({ id: `alert-${a.id}`, type: alertTypes[a.kind], account: a.account, created: new Date(a.at).toISOString(), data: alertData(a) });
}

/**
 * The `Gateway-Signature` field of a delivery: `t=<unix seconds>,v1=<hex>`,
 * where the hex is HMAC-SHA256 under the account's alert secret of
 * `<t>.<body>`. A receiver recomputes it over the raw body and refuses old
 * times, so a captured delivery cannot be replayed later. While a replaced
 * secret is kept, a second `v1` is signed with it (as Stripe does while a
 * secret is rolled): a receiver accepts the delivery if any `v1` matches
 * the secret it holds.
 */
export function alertSignature(secrets: readonly string[], unixSeconds: number, body: string): string {
  return `t=${unixSeconds}${secrets.map((s) => `,v1=${createHmac("sha256", s).update(`${unixSeconds}.${body}`).digest("hex")}`).join("")}`;
}

/** Attempts after which an alert is given up: the last about 22 hours after the first. */
export const alertAttempts = 30;

/** When the attempt after the `attempts`th failed one is due: 10 s, then doubling, at most an hour apart; undefined once `alertAttempts` were made. */
export function alertRetryAt(attempts: number, now: number): number | undefined {
  if (attempts >= alertAttempts) return undefined;
  return now + Math.min(3_600_000, 10_000 * 2 ** (attempts - 1));
}
