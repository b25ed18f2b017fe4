import { createHmac } from "node:crypto";
import { canonicalString } from "../client/browser-signature.ts";
import type { Operation } from "../contract/operations.ts";
import { ErrorCode } from "../gen/gateway/catalogue/v1/status_pb.js";
import { sameHex, secretMatches, type Account, type AccountStore } from "./accounts.ts";
import { dayOf, zonedTimeToEpoch } from "./clock.ts";
import { GatewayError } from "./gateway-error.ts";
import { legacySign } from "./legacy-signature.ts";

/** How a caller proves who it is (README, "Authentication"). */
export type Credentials =
  | { readonly kind?: "plain"; readonly key?: string | undefined; readonly secret?: string | undefined }
  | {
      readonly kind: "legacy-signed";
      readonly key: string | undefined;
      readonly dateline: string | undefined;
      readonly sign: string;
      /** Every parameter the caller sent, as signed (secret and sign are left out by the scheme). */
      readonly params: Readonly<Record<string, string>>;
    }
  | {
      readonly kind: "hmac";
      readonly key: string | undefined;
      readonly timestamp: string | undefined;
      readonly nonce: string | undefined;
      readonly signature: string;
      /** GET or POST on the legacy paths, RPC on the RPC paths. */
      readonly method: string;
      /** The operation's path as signed. */
      readonly path: string;
    };

/** Remembers signatures already used, for as long as they could be replayed. */
export interface ReplayGuard {
  /** Records `id`; true when it was already recorded and has not expired. */
  seen(id: string, now: number, ttlMs: number): boolean;
}

export interface AuthenticationOptions {
  /** How far a signed call's time may be from the server's, in seconds, either way. */
  readonly signatureWindowSeconds: number;
  /** Zone of the legacy `dateline`. */
  readonly timeZone: string;
  /** Failed authentications from one address before each answer is slowed… */
  readonly slowAfterFailures: number;
  /** …and before the address is refused (4008) for `lockSeconds`. */
  readonly lockAfterFailures: number;
  /** Failures count for this long. */
  readonly failureWindowSeconds: number;
  readonly lockSeconds: number;
}

export const defaultAuthenticationOptions: AuthenticationOptions = {
  signatureWindowSeconds: 300,
  timeZone: "Asia/Shanghai",
  slowAfterFailures: 5,
  lockAfterFailures: 20,
  failureWindowSeconds: 60,
  lockSeconds: 300,
};

/** Replay guard of one process: ids with their expiry, swept as they lapse. */
export class MemoryReplayGuard implements ReplayGuard {
  private readonly until = new Map<string, number>();
  private nextSweep = 0;

  seen(id: string, now: number, ttlMs: number): boolean {
    if (now >= this.nextSweep) {
      for (const [k, t] of this.until) if (t <= now) this.until.delete(k);
      this.nextSweep = now + 10_000;
    }
    const t = this.until.get(id);
    if (t !== undefined && t > now) return true;
    this.until.set(id, now + ttlMs);
    return false;
  }
}

interface FailureRecord {
  times: number[];
  lockedUntil: number;
}

const nonceForm = /^[A-Za-z0-9_-]{8,64}$/;
const hex64 = /^[0-9a-f]{64}$/;
const hex32 = /^[0-9a-f]{32}$/;
const maxKeyLength = 64;

/**
 * Checks credentials of every form against the account store, refuses
 * replays and stale signatures, and slows then refuses an address that keeps
 * failing. Reasons say what to fix, never how close a guess was.
 */
export class Authenticator {
  private readonly accounts: AccountStore;
  private readonly replays: ReplayGuard;
  private readonly options: AuthenticationOptions;
  private readonly failures = new Map<string, FailureRecord>();

  constructor(accounts: AccountStore, replays: ReplayGuard, options: Partial<AuthenticationOptions> = {}) {
    this.accounts = accounts;
    this.replays = replays;
    this.options = { ...defaultAuthenticationOptions, ...options };
  }

  /** Refuses an address locked out for failing too often (4008), before any work. */
  checkAddress(clientIp: string, now: number): void {
    const r = this.failures.get(clientIp);
    if (r !== undefined && r.lockedUntil > now) {
      const wait = Math.ceil((r.lockedUntil - now) / 1000);
      throw new GatewayError(ErrorCode.RATE_LIMIT_EXCEEDED, `too many failed authentications from this address; try again in ${wait} s`);
    }
  }

  /** Counts a failed authentication; returns how long to hold the answer back, in ms. */
  failed(clientIp: string, now: number): number {
    const o = this.options;
    let r = this.failures.get(clientIp);
    if (r === undefined) {
      if (this.failures.size > 100_000) this.forgetOld(now);
      r = { times: [], lockedUntil: 0 };
      this.failures.set(clientIp, r);
    }
    r.times = r.times.filter((t) => t > now - o.failureWindowSeconds * 1000);
    r.times.push(now);
    if (r.times.length >= o.lockAfterFailures) {
      r.lockedUntil = now + o.lockSeconds * 1000;
      r.times = [];
    }
    const over = r.times.length - o.slowAfterFailures;
    return over >= 0 ? Math.min(2000, 100 * (over + 1)) : 0;
  }

  authenticate(operation: Operation, credentials: Credentials, args: Readonly<Record<string, string | undefined>>, now: number): Account {
    const key = credentials.key;
    if (key === undefined || key === "") throw new GatewayError(ErrorCode.MISSING_URL_PARAM, "missing url param: key");
    const account = key.length <= maxKeyLength ? this.accounts.find(key) : undefined;
    if (account === undefined) throw new GatewayError(ErrorCode.ACCOUNT_NOT_FOUND, "no account has this key");
    switch (credentials.kind) {
      case "legacy-signed":
        this.checkLegacySigned(account, credentials, operation, now);
        break;
      case "hmac":
        this.checkHmac(account, credentials, args, now);
        break;
      default:
        if (credentials.secret === undefined || credentials.secret === "") throw new GatewayError(ErrorCode.INVALID_CREDENTIALS, "missing secret");
        if (!secretMatches(account, credentials.secret)) throw new GatewayError(ErrorCode.INVALID_CREDENTIALS, "the secret does not match the key");
    }
    if (account.status === "stopped") throw new GatewayError(ErrorCode.ACCOUNT_STOPPED, "this account is stopped");
    if (dayOf(now, account.zone) > account.expires) throw new GatewayError(ErrorCode.INVALID_CREDENTIALS, `the key expired on ${account.expires}`);
    const state = account.operations.get(operation.id);
    if (state === undefined) throw new GatewayError(ErrorCode.API_NOT_ADDED, `${operation.id} has not been added to this account`);
    if (state === "stopped") throw new GatewayError(ErrorCode.API_STOPPED, `${operation.id} is stopped for this account`);
    return account;
  }

  private windowMs(): number {
    return this.options.signatureWindowSeconds * 1000;
  }

  private checkTime(at: number, now: number, what: string): void {
    if (Math.abs(now - at) > this.windowMs()) {
      throw new GatewayError(ErrorCode.INVALID_CREDENTIALS, `${what} is more than ${this.options.signatureWindowSeconds} s away from the server's time; sign the call anew`);
    }
  }

  private checkLegacySigned(account: Account, c: Extract<Credentials, { kind: "legacy-signed" }>, operation: Operation, now: number): void {
    if (c.dateline === undefined || c.dateline === "") throw new GatewayError(ErrorCode.INVALID_CREDENTIALS, "a signed call needs dateline");
    const at = zonedTimeToEpoch(c.dateline, this.options.timeZone);
    if (at === undefined) throw new GatewayError(ErrorCode.INVALID_CREDENTIALS, `dateline must be YYYY-MM-DD HH:MM:SS in ${this.options.timeZone}`);
    this.checkTime(at, now, "dateline");
    if (account.legacySigningKey === undefined) throw new GatewayError(ErrorCode.INVALID_CREDENTIALS, "this account's secret predates signed calls; rotate it to sign calls");
    const expected = legacySign({ ...c.params, api_name: operation.apiName }, account.legacySigningKey);
    if (!hex32.test(c.sign) || !sameHex(expected, c.sign)) {
      throw new GatewayError(ErrorCode.INVALID_CREDENTIALS, "sign does not match the parameters; sign every parameter sent but secret and sign, plus api_name");
    }
    if (this.replays.seen(`legacy\u0000${account.key}\u0000${c.sign}`, now, 2 * this.windowMs())) {
      throw new GatewayError(ErrorCode.INVALID_CREDENTIALS, "this sign was already used; sign each call anew");
    }
  }

  private checkHmac(account: Account, c: Extract<Credentials, { kind: "hmac" }>, args: Readonly<Record<string, string | undefined>>, now: number): void {
    if (c.timestamp === undefined || !/^\d{1,12}$/.test(c.timestamp)) throw new GatewayError(ErrorCode.INVALID_CREDENTIALS, "a signed call needs timestamp, in Unix seconds");
    if (c.nonce === undefined || !nonceForm.test(c.nonce)) throw new GatewayError(ErrorCode.INVALID_CREDENTIALS, "a signed call needs nonceStr: 8 to 64 letters, digits, _ or -");
    this.checkTime(Number(c.timestamp) * 1000, now, "timestamp");
    if (account.hmacKey === undefined) throw new GatewayError(ErrorCode.INVALID_CREDENTIALS, "this account's secret predates signed calls; rotate it to sign calls");
    const canonical = canonicalString({ method: c.method, path: c.path, args, timestamp: Number(c.timestamp), nonce: c.nonce });
    const expected = createHmac("sha256", Buffer.from(account.hmacKey, "hex")).update(canonical).digest("hex");
    if (!hex64.test(c.signature) || !sameHex(expected, c.signature)) {
      throw new GatewayError(ErrorCode.INVALID_CREDENTIALS, `signature does not match; sign "${c.method} ${c.path}" with the call's arguments, timestamp and nonce`);
    }
    if (this.replays.seen(`hmac\u0000${account.key}\u0000${c.nonce}`, now, 2 * this.windowMs())) {
      throw new GatewayError(ErrorCode.INVALID_CREDENTIALS, "this nonce was already used; use a fresh nonceStr for every call");
    }
  }

  private forgetOld(now: number): void {
    for (const [ip, r] of this.failures) {
      if (r.lockedUntil <= now && r.times.every((t) => t <= now - this.options.failureWindowSeconds * 1000)) this.failures.delete(ip);
    }
  }
}
