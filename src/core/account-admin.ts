import { createHash } from "node:crypto";
import type { OperationContract, OperationId } from "../contract/operations.ts";
import { fieldChanges, type AccountChangeKind, type AccountFields, type FieldChange } from "./account-history.ts";
import { ExternalIdTaken, type AccountStore } from "./account-store.ts";
import { balanceAccounting, BalanceReferenceConflict, type BalanceAccounting, type Meter, type RecordedBalanceChange } from "./meter.ts";
import { browserSignature, newKey, newNonce, newSecret, sealSecret, type Account, type OperationState } from "./accounts.ts";
import type { SignedCall } from "../contract/browser-signature.ts";
import { assertTimeZone, dayOf, isCalendarDay, type Clock } from "./clock.ts";
import { formatMoney, type Micros } from "./money.ts";
import { checkRate, type CallRate } from "./call-rate.ts";
import { accountPage, type AccountPage, type AccountPageRequest } from "./account-pages.ts";
import { parseAllowedAddresses, usageAddressFilter } from "./allowed-addresses.ts";
import { alertSecretsAt, checkAlertSettings, newAlertSecret, testAlertBody, type AlertOutbox, type AlertPost, type AlertRecord, type AlertSent, type AlertSettings } from "./alerts.ts";
import { keepReplaced } from "./secret-grace.ts";

/** What a new account gets unless told otherwise. */
export interface AccountPlan {
  name: string;
  /** Daily call maximum. */
  dailyMax: number;
  /** Calls in flight at once. */
  concurrency: number;
  /** The rate limit; undefined: none. */
  rate: CallRate | undefined;
  /** The addresses and networks the key works from (allowed-addresses.ts); undefined: anywhere. */
  allowedFrom: readonly string[] | undefined;
  /** Opening prepaid balance; undefined: not billed by balance. */
  balance: Micros | undefined;
  /** Price of a charged call, per operation. */
  prices: ReadonlyMap<OperationId, Micros>;
  /** Last day the key works, YYYY-MM-DD; empty means a year from today. */
  expires: string;
  zone: string;
  /** Operations added and enabled. */
  operations: OperationId[];
}

/** The plan's defaults; a new account gets every operation unless told otherwise. */
export const defaultPlan: Omit<AccountPlan, "operations"> = {
  name: "",
  dailyMax: 10000,
  concurrency: 20,
  rate: undefined,
  allowedFrom: undefined,
  balance: undefined,
  prices: new Map(),
  expires: "",
  zone: "Asia/Shanghai",
};

/** A list of addresses checked and written in one form (`any` or none: anywhere), or refused in words. */
function allowedAddresses(list: readonly string[]): readonly string[] | undefined {
  try {
    return parseAllowedAddresses(list);
  } catch (e) {
    throw new AccountAdminError(`allowed addresses: ${(e as Error).message}`);
  }
}

/** The address or network a usage query is narrowed to, checked and written in one form, or refused in words. */
export function usageAddress(text: string): string {
  try {
    return usageAddressFilter(text);
  } catch (e) {
    throw new AccountAdminError(`the calls' address: ${(e as Error).message}`);
  }
}

/** An account's balance accounted for (`AccountAdmin.balanceStatement`). */
export interface BalanceStatement extends BalanceAccounting {
  readonly account: Account;
}

/**
 * One entry of an account's history (`AccountAdmin.history`): a change of
 * its settings, or a move of its balance that was not a call's price (shown
 * as the balance before and after it).
 */
export interface AccountEvent {
  readonly at: number;
  readonly kind: AccountChangeKind | RecordedBalanceChange["kind"];
  readonly by: string;
  readonly changes: readonly FieldChange[];
}

/** A request an operator made that cannot be carried out as asked. */
export class AccountAdminError extends Error {
  override name = "AccountAdminError";
}

export class AccountNotFoundError extends AccountAdminError {
  override name = "AccountNotFoundError";
}

/** A creation naming an external id that an account made by another request has (AccountAdmin.create). */
export class AccountExistsError extends AccountAdminError {
  override name = "AccountExistsError";
}

/** What a new account may name as its external id: 1 to 128 printable ASCII characters, as a top-up's reference. */
const externalIdForm = /^[\x21-\x7e]{1,128}$/;

/** A new account's plan as one text, for telling a creation sent again from another with the same external id: the settings as asked, defaults filled in, lists in one order. */
function planDigest(p: AccountPlan, allowedFrom: readonly string[] | undefined): string {
  const sorted = <T>(xs: Iterable<T>) => [...xs].sort((a, b) => (String(a) < String(b) ? -1 : String(a) > String(b) ? 1 : 0));
  const asked = [
    p.name,
    p.dailyMax,
    p.concurrency,
    p.rate === undefined ? null : [p.rate.calls, p.rate.seconds, p.rate.burst],
    allowedFrom === undefined ? null : sorted(allowedFrom),
    p.balance === undefined ? null : p.balance.toString(),
    sorted([...p.prices].map(([op, price]) => `${op}=${price}`)),
    p.expires,
    p.zone,
    sorted(p.operations),
  ];
  return createHash("sha256").update(JSON.stringify(asked)).digest("hex");
}

/** A new account: its secret (shown once; empty when `repeated`), and whether it is one an earlier creation with the same external id made. */
export interface CreatedAccount {
  readonly account: Account;
  readonly secret: string;
  readonly repeated: boolean;
}

/** The longest a rotation may keep the old secret working: long enough for a release cycle, short enough that a leaked secret dies. */
export const maxKeepOldMs = 30 * 86_400_000;

/** The largest balance the store can hold: a signed 64-bit count of micro-units. */
const maxBalance: Micros = 2n ** 63n - 1n;

/** The longest name an account may have, in characters of any script. */
const maxAccountNameChars = 200;
/**
 * What a name may not hold: control characters (an escape sequence run by
 * the operator's terminal when `accounts list` prints it, a NUL in a CSV),
 * line and paragraph separators, and direction overrides, which make a name
 * read as another.
 */
const unfitInName = /[\p{Cc}\p{Zl}\p{Zp}\u202A-\u202E\u2066-\u2069]/u;

/** The name with what a name may not hold written as escapes (`\u001b`): for a refusal, and for a terminal, where a name given before the check may still hold some. */
export function printableName(name: string): string {
  return name.replace(new RegExp(unfitInName.source, "gu"), (c) => `\\u${c.codePointAt(0)!.toString(16).padStart(4, "0")}`);
}

function checkName(name: string): void {
  const chars = [...name].length;
  if (chars > maxAccountNameChars) throw new AccountAdminError(`an account's name is at most ${maxAccountNameChars} characters, not ${chars}`);
  if (unfitInName.test(name)) throw new AccountAdminError(`an account's name cannot hold control characters, line separators or direction overrides: "${printableName(name.slice(0, 64))}"`);
}

function checkLimits(p: Pick<AccountPlan, "dailyMax" | "concurrency" | "rate" | "expires" | "zone">): void {
  if (!Number.isSafeInteger(p.dailyMax) || p.dailyMax < 0) throw new AccountAdminError("the daily maximum must be a whole number, 0 or more");
  if (!Number.isSafeInteger(p.concurrency) || p.concurrency < 1) throw new AccountAdminError("the concurrency limit must be a whole number, 1 or more");
  try {
    if (p.rate !== undefined) checkRate(p.rate);
  } catch (e) {
    throw new AccountAdminError((e as Error).message);
  }
  if (p.expires !== "" && !isCalendarDay(p.expires)) throw new AccountAdminError(`the expiry must be a date as YYYY-MM-DD, not ${p.expires}`);
  try {
    assertTimeZone(p.zone);
  } catch {
    throw new AccountAdminError(`unknown time zone ${p.zone}`);
  }
}

/**
 * Account administration over the account store: creation, status and
 * operation switches. The CLI uses it; an admin API can use the same.
 */
export class AccountAdmin {
  private readonly store: AccountStore;
  private readonly balances: Pick<Meter, "adjustBalance" | "balanceRecord">;
  private readonly clock: Clock;
  private readonly operations: readonly OperationContract[];
  /** Who the changes made through this admin are recorded as made by. */
  readonly by: string;
  /** The hosts alert URLs may name (GATEWAY_ALERT_HOSTS); empty: any. */
  private readonly alertHosts: readonly string[];

  /**
   * `balances`: the meter, which owns balances; `operations`: every operation
   * the gateway serves (what accounts may be given); `by`: who changes made
   * through it are recorded as made by (`as` gives the same admin for another).
   */
  constructor(store: AccountStore, balances: Pick<Meter, "adjustBalance" | "balanceRecord">, clock: Clock, operations: readonly OperationContract[], by = "gateway", alertHosts: readonly string[] = []) {
    this.store = store;
    this.balances = balances;
    this.clock = clock;
    this.operations = operations;
    this.by = by;
    this.alertHosts = alertHosts;
  }

  /** The same admin, recording its changes as made by `by` (the CLI's user, an admin API caller). */
  as(by: string): AccountAdmin {
    return new AccountAdmin(this.store, this.balances, this.clock, this.operations, by, this.alertHosts);
  }

  /**
   * One change of an account's settings, made on the account as committed
   * (under the store's lock, so a change made at the same time elsewhere is
   * neither lost nor undone) and recorded with what it moved. `make` may
   * refuse by throwing; a change that moves nothing is not recorded.
   */
  private async edit(key: string, kind: AccountChangeKind, make: (current: Account) => AccountFields): Promise<Account> {
    const next = await this.store.change(key, (current) => {
      const fields = make(current);
      const changes = fieldChanges(current, { ...current, ...fields });
      return changes.length === 0 ? undefined : { fields, change: { at: this.clock.now(), kind, by: this.by, changes } };
    });
    if (next === undefined) throw new AccountNotFoundError(`no account has the key ${key}`);
    return next;
  }

  /**
   * Creates an account; the secret is returned once and only its hash is
   * kept. With an external id (the operator's own id for the account),
   * creation may be sent again safely: while an account has the id, the
   * same request answers that account (`repeated`, no secret, nothing
   * credited again) and another request is refused (AccountExistsError).
   */
  async create(plan: Partial<AccountPlan> & { readonly externalId?: string | undefined } = {}): Promise<CreatedAccount> {
    const { externalId, ...asked } = plan;
    const p: AccountPlan = { ...defaultPlan, operations: this.operations.map((op) => op.id), ...asked };
    checkName(p.name);
    checkLimits(p);
    const allowedFrom = p.allowedFrom === undefined ? undefined : allowedAddresses(p.allowedFrom);
    const operations = p.operations.map((name) => this.operation(name));
    const prices = new Map([...p.prices].map(([name, price]) => [this.operation(name), price]));
    if (p.balance !== undefined && p.balance < 0n) throw new AccountAdminError("the opening balance cannot be negative");
    if (externalId !== undefined && !externalIdForm.test(externalId)) throw new AccountAdminError("an external id must be 1 to 128 printable ASCII characters, no spaces");
    const createdWith = externalId === undefined ? undefined : planDigest({ ...p, operations, prices }, allowedFrom);
    if (externalId !== undefined) {
      const made = await this.store.findByExternalId(externalId);
      if (made !== undefined) return this.madeBefore(made, externalId, createdWith!);
    }
    let expires = p.expires;
    if (expires === "") {
      const d = new Date(`${dayOf(this.clock.now(), p.zone)}T00:00:00Z`);
      d.setUTCFullYear(d.getUTCFullYear() + 1);
      expires = d.toISOString().slice(0, 10);
    }
    const secret = newSecret();
    const account: Account = {
      key: newKey(),
      name: p.name,
      ...sealSecret(secret),
      status: "active",
      operations: new Map(operations.map((id) => [id, "enabled" as OperationState])),
      dailyMax: p.dailyMax,
      concurrency: p.concurrency,
      ...(p.rate !== undefined ? { rate: p.rate } : {}),
      ...(allowedFrom !== undefined ? { allowedFrom } : {}),
      balance: p.balance,
      prices,
      expires,
      zone: p.zone,
      createdAt: this.clock.now(),
      ...(externalId !== undefined ? { externalId, createdWith } : {}),
    };
    // The balance first: an account must never exist, even for a moment, unbilled when it should be prepaid.
    if (account.balance !== undefined) await this.balances.adjustBalance(account.key, { kind: "opening", amount: account.balance, at: account.createdAt, by: this.by });
    try {
      await this.store.insert(account, { at: account.createdAt, kind: "created", by: this.by, changes: fieldChanges(undefined, account) });
    } catch (e) {
      // The same id made at the same moment elsewhere (another replica, the CLI): that one stands, and this key's
      // opening balance is taken back (recorded as unbilled under a key no account has, so the sum of balances holds).
      if (!(e instanceof ExternalIdTaken)) throw e;
      if (account.balance !== undefined) await this.balances.adjustBalance(account.key, { kind: "unbilled", at: this.clock.now(), by: this.by });
      const made = await this.store.findByExternalId(e.externalId);
      if (made === undefined) throw e;
      return this.madeBefore(made, e.externalId, createdWith!);
    }
    return { account, secret, repeated: false };
  }

  /** A creation naming an account's external id: that account, if it was made by the same request; refused if not. */
  private madeBefore(made: Account, externalId: string, createdWith: string): CreatedAccount {
    if (made.createdWith !== createdWith) {
      throw new AccountExistsError(`the external id ${externalId} is account ${made.key}'s, made with other settings: send the same settings again, or change the account with its own calls`);
    }
    return { account: made, secret: "", repeated: true };
  }

  async get(key: string): Promise<Account> {
    const account = await this.store.find(key);
    if (account === undefined) throw new AccountNotFoundError(`no account has the key ${key}`);
    return account;
  }

  /** The account with an external id (the operator's own id for it). */
  async byExternalId(externalId: string): Promise<Account> {
    const account = await this.store.findByExternalId(externalId);
    if (account === undefined) throw new AccountNotFoundError(externalIdForm.test(externalId) ? `no account has the external id ${externalId}` : "no account has this external id");
    return account;
  }

  async list(): Promise<Account[]> {
    return this.store.list();
  }

  /** A page of the accounts that match a query and a status (account-pages.ts). */
  async page(request: AccountPageRequest): Promise<AccountPage> {
    return accountPage((ask) => this.store.listing(ask), request);
  }

  async setStatus(key: string, status: Account["status"]): Promise<Account> {
    return this.edit(key, "status", () => ({ status }));
  }

  /** Adds and enables, stops (4006), or removes (4012) an operation for an account. */
  async setOperation(key: string, operation: string, state: OperationState | "removed"): Promise<Account> {
    const id = this.operation(operation);
    return this.edit(key, "operation", (account) => {
      const next = new Map(account.operations);
      if (state === "removed") next.delete(id);
      else next.set(id, state);
      return { operations: next };
    });
  }

  /**
   * Changes the daily maximum, concurrency, rate limit (null: none), the
   * rate's burst alone, the addresses the key works from (null: anywhere),
   * expiry or zone; what is not given stays.
   */
  async setPlan(key: string, plan: Partial<Pick<AccountPlan, "dailyMax" | "concurrency" | "expires" | "zone"> & { rate: CallRate | null; burst: number; allowedFrom: readonly string[] | null }>): Promise<Account> {
    return this.edit(key, "plan", (account) => {
      let rate = plan.rate === null ? undefined : (plan.rate ?? account.rate);
      if (plan.burst !== undefined) {
        if (rate === undefined) throw new AccountAdminError("a burst needs a rate: this account has none");
        rate = { ...rate, burst: plan.burst };
      }
      const next = {
        dailyMax: plan.dailyMax ?? account.dailyMax,
        concurrency: plan.concurrency ?? account.concurrency,
        expires: plan.expires ?? account.expires,
        zone: plan.zone ?? account.zone,
        rate,
        allowedFrom: plan.allowedFrom === null ? undefined : plan.allowedFrom === undefined ? account.allowedFrom : allowedAddresses(plan.allowedFrom),
      };
      checkLimits(next);
      return next;
    });
  }

  /**
   * Sets where and when the account is told of its usage and balance
   * (alerts.ts), or turns its alerts off (null). The secret its alerts are
   * signed with is made when alerts are first set, or anew when asked
   * (`newSecret`), and returned then only; it is dropped with the alerts.
   * A new secret may keep the one it replaces signing too for `keepOldMs`
   * (at most 30 days; 0: it stops at once, with any kept before).
   */
  async setAlerts(
    key: string,
    alerts: AlertSettings | null,
    options: { readonly newSecret?: boolean; readonly keepOldMs?: number } = {},
  ): Promise<{ readonly account: Account; readonly secret: string | undefined }> {
    const keepOldMs = options.keepOldMs ?? 0;
    if (!Number.isSafeInteger(keepOldMs) || keepOldMs < 0 || keepOldMs > maxKeepOldMs) throw new AccountAdminError("the old alert secret can be kept for 0 to 30 days");
    if (keepOldMs > 0 && options.newSecret !== true) throw new AccountAdminError("keeping the old alert secret needs a new one: ask for a new secret");
    let made: string | undefined;
    let checked: AlertSettings | undefined;
    if (alerts !== null) {
      try {
        checked = checkAlertSettings(alerts, this.alertHosts);
      } catch (e) {
        throw new AccountAdminError((e as Error).message);
      }
    } else if (options.newSecret === true) {
      throw new AccountAdminError("a new alert secret needs alerts: this request turns them off");
    }
    const account = await this.edit(key, "alerts", (current) => {
      if (checked === undefined) return { alerts: undefined, alertSecret: undefined, previousAlertSecrets: undefined };
      made = current.alertSecret === undefined || options.newSecret === true ? newAlertSecret() : undefined;
      if (made === undefined) return { alerts: checked };
      // The replaced secret signs too until its time, where asked, beside any kept before (a new secret asked for
      // twice keeps the first working); otherwise it, and any kept before, stops now.
      const now = this.clock.now();
      const kept = keepOldMs > 0 && current.alertSecret !== undefined ? keepReplaced(current.previousAlertSecrets, { secret: current.alertSecret, until: now + keepOldMs }, now) : undefined;
      return { alerts: checked, alertSecret: made, previousAlertSecrets: kept };
    });
    return { account, secret: made };
  }

  /** Sends the account's alert URL a test alert at once (alerts.ts, testAlertBody), signed with its secret, and says how it went. */
  async testAlerts(key: string, post: AlertPost): Promise<AlertSent & { readonly id: string }> {
    const account = await this.get(key);
    if (account.alerts === undefined || account.alertSecret === undefined) throw new AccountAdminError("this account has no alerts to test: set them first");
    const now = this.clock.now();
    const { id, body } = testAlertBody(account.key, now);
    return { id, ...(await post.send(account.alerts.url, alertSecretsAt(account.alertSecret, account.previousAlertSecrets, now), id, body, Math.floor(now / 1000))) };
  }

  /** The account's alerts, newest first: what each told, and whether it was delivered. */
  async alerts(key: string, outbox: AlertOutbox, limit = 50): Promise<AlertRecord[]> {
    await this.get(key);
    return outbox.recent(key, limit);
  }

  /**
   * Adds a positive amount to the balance (an unbilled account becomes
   * prepaid). `reference`: the payment it is for (BalanceChange.reference):
   * a second top-up with it adds nothing (`repeated`), and one with another
   * amount is refused.
   */
  async topUp(key: string, amount: Micros, reference?: string): Promise<{ readonly account: Account; readonly repeated: boolean }> {
    const account = await this.get(key);
    if (amount <= 0n) throw new AccountAdminError("a top-up must be more than 0");
    if (reference !== undefined && !/^[\x21-\x7e]{1,128}$/.test(reference)) throw new AccountAdminError("a top-up's reference must be 1 to 128 printable ASCII characters, no spaces");
    if ((account.balance ?? 0n) + amount > maxBalance) throw new AccountAdminError(`a top-up of ${formatMoney(amount)} would take the balance past the largest it can hold, ${formatMoney(maxBalance)}`);
    let outcome: "applied" | "repeated";
    try {
      outcome = await this.balances.adjustBalance(key, { kind: "top-up", amount, at: this.clock.now(), by: this.by, reference });
    } catch (e) {
      if (e instanceof BalanceReferenceConflict) {
        throw new AccountAdminError(`the reference ${e.reference} already topped up ${formatMoney(e.amount)}, not ${formatMoney(amount)}: a top-up of another amount needs another reference`);
      }
      throw e;
    }
    return { account: await this.get(key), repeated: outcome === "repeated" };
  }

  /**
   * The account's balance accounted for: every recorded change (what it
   * added, the balance it left) with what charged calls took from the
   * balance between the change before and it, and what they took since the
   * last. Every change that is not a call's price is recorded in the
   * transaction that makes it, so between two changes only calls moved the
   * balance, and the differences are exact.
   */
  async balanceStatement(key: string): Promise<BalanceStatement> {
    const known = await this.get(key);
    // The balance comes with its changes, as one moment left them: the account this process remembers may be
    // older than a top-up made elsewhere, and the statement would then show that top-up as taken by calls.
    const record = await this.balances.balanceRecord(key);
    return { account: { ...known, balance: record.balance }, ...balanceAccounting(record) };
  }

  /**
   * Everything done to the account, oldest first: its creation, each change
   * of its settings (what moved, and who made it), and each move of its
   * balance that was not a call's price (the balance before and after). Each
   * was recorded in the transaction that made it.
   */
  async history(key: string): Promise<AccountEvent[]> {
    await this.get(key);
    const [changes, { changes: balance }] = await Promise.all([this.store.history(key), this.balances.balanceRecord(key)]);
    let billed = false;
    const moves: AccountEvent[] = balance.map((c) => {
      const before = !billed ? "" : formatMoney((c.balance ?? 0n) - c.amount);
      billed = c.balance !== undefined;
      const after = c.balance === undefined ? "" : formatMoney(c.balance);
      const moved = [{ field: "balance", before: c.kind === "unbilled" ? formatMoney(-c.amount) : before, after }];
      // The payment a top-up was for, where its maker named one.
      if (c.reference !== "") moved.push({ field: "reference", before: "", after: c.reference });
      return { at: c.at, kind: c.kind, by: c.by, changes: moved };
    });
    // By time; the sort is stable, so a settings change comes before a balance move of the same millisecond.
    return [...changes, ...moves].sort((a, b) => a.at - b.at);
  }

  /** Sets the price of a charged call of one operation for the account. */
  async setPrice(key: string, operation: string, price: Micros): Promise<Account> {
    if (price < 0n) throw new AccountAdminError("a price cannot be negative");
    const id = this.operation(operation);
    return this.edit(key, "price", (account) => {
      const prices = new Map(account.prices);
      prices.set(id, price);
      return { prices };
    });
  }

  /**
   * Replaces the secret; the new one is returned once. With `keepOldMs`,
   * the old one is still accepted for that long (plain and signed calls
   * alike), so callers can move to the new one without a moment where
   * either is refused, and so are those earlier rotations still keep (up to
   * `maxKeptSecrets`): a rotation sent again because its answer was lost
   * does not cut off the secret every caller still uses. Without, it stops
   * working at once, and so does every secret earlier rotations were keeping.
   */
  async rotateSecret(key: string, keepOldMs = 0): Promise<string> {
    if (!Number.isInteger(keepOldMs) || keepOldMs < 0 || keepOldMs > maxKeepOldMs) {
      throw new AccountAdminError(`the old secret can be kept for at most ${maxKeepOldMs / 86_400_000} days (${maxKeepOldMs / 1000} s), not ${keepOldMs / 1000} s`);
    }
    const secret = newSecret();
    const sealed = sealSecret(secret);
    // The secret kept is the one committed now, not one read earlier: a rotation elsewhere in between is kept, not undone.
    await this.edit(key, "secret", (account) => {
      const now = this.clock.now();
      const replaced = { secretHash: account.secretHash, secretSalt: account.secretSalt, legacySigningKey: account.legacySigningKey, hmacKey: account.hmacKey, until: now + keepOldMs };
      return { ...sealed, previousSecrets: keepOldMs === 0 ? undefined : keepReplaced(account.previousSecrets, replaced, now) };
    });
    return secret;
  }

  /**
   * Signs one call for the account in the browser-safe form, now, with a
   * fresh nonce: the signing endpoint a page calls instead of holding the
   * secret. An account whose secret predates signed calls cannot sign until
   * its secret is rotated; a stopped account can (its call is refused 4007,
   * as any other).
   */
  async signCall(key: string, call: Omit<SignedCall, "timestamp" | "nonce">): Promise<{ timestamp: number; nonce: string; signature: string }> {
    const account = await this.get(key);
    if (account.hmacKey === undefined) throw new AccountAdminError(`account ${key}'s secret predates signed calls; rotate it first`);
    if (!/^(GET|POST|RPC)$/.test(call.method)) throw new AccountAdminError("method must be GET or POST (legacy paths) or RPC");
    if (!call.path.startsWith("/")) throw new AccountAdminError("path must start with /");
    const signed = { ...call, timestamp: Math.floor(this.clock.now() / 1000), nonce: newNonce() };
    return { timestamp: signed.timestamp, nonce: signed.nonce, signature: browserSignature(account.hmacKey, signed) };
  }

  /**
   * The operation an operator names: its full id (`<catalogue>/<api_name>`),
   * or its bare api name when only one operation has it. A name that fits
   * several is refused rather than guessed: enabling or pricing the wrong
   * one bills the wrong thing.
   */
  operation(name: string): OperationId {
    const exact = this.operations.find((o) => o.id === name);
    if (exact !== undefined) return exact.id;
    const named = this.operations.filter((o) => o.apiName === name);
    if (named.length === 1) return named[0]!.id;
    const all = this.operations.map((o) => o.id).join(", ");
    if (named.length > 1) throw new AccountAdminError(`${name} names ${named.length} operations (${named.map((o) => o.id).join(", ")}); give the full id`);
    throw new AccountAdminError(`no operation ${name}; operations: ${all}`);
  }
}
