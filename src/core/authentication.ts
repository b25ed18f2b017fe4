import { signatureScheme } from "../contract/browser-signature.ts";
import { AddressNotAllowed, addressAllowed } from "./allowed-addresses.ts";
import type { OperationContract as Operation } from "../contract/operations.ts";
import { ErrorCode } from "../gen/gateway/catalogue/v1/status_pb.js";
import type { AccountStore } from "./account-store.ts";
import { browserSignature, previousSecretsAt, sameHex, secretMatches, type Account } from "./accounts.ts";
import { dayOf, zonedTimeToEpoch } from "./clock.ts";
import { GatewayError } from "./gateway-error.ts";
import { legacySign } from "./legacy-signature.ts";
import { thenMaybe, type MaybeAsync } from "./maybe-async.ts";
import type { ReplayGuard } from "./replay-guard.ts";

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
      /** Every parameter the call sent, as signed (see `canonicalString`). */
      readonly params: Readonly<Record<string, string | undefined>>;
    }
  | {
      /** An Authorization header in a scheme the gateway does not know: refused (4005), never guessed at. */
      readonly kind: "unsupported";
      readonly key?: undefined;
      readonly scheme: string;
    };

export interface AuthenticationOptions {
  /** How far a signed call's time may be from the server's, in seconds, either way. */
  readonly signatureWindowSeconds: number;
  /** Zone of the legacy `dateline`. */
  readonly timeZone: string;
}

export const defaultAuthenticationOptions: AuthenticationOptions = {
  signatureWindowSeconds: 300,
  timeZone: "Asia/Shanghai",
};

const nonceForm = /^[A-Za-z0-9_-]{8,64}$/;
const hex64 = /^[0-9a-f]{64}$/;
const hex32 = /^[0-9a-f]{32}$/;
const maxKeyLength = 64;

/** The keys a signed call of the account may be signed with now: its secret's, and within a rotation's grace the replaced one's. */
function signingKeys(account: Account, kind: "legacySigningKey" | "hmacKey", now: number): string[] {
  const keys: string[] = [];
  if (account[kind] !== undefined) keys.push(account[kind]);
  for (const previous of previousSecretsAt(account, now)) if (previous[kind] !== undefined) keys.push(previous[kind]);
  return keys;
}

/**
 * Checks credentials of every form against the account store, and refuses
 * replays and stale signatures. Reasons say what to fix, never how close a
 * guess was. Who the caller is (`identify`) is kept apart from what the
 * account may do (`authorize`), so a refusal of a known account is still
 * that account's.
 */
export class Authenticator {
  private readonly accounts: AccountStore;
  private readonly replays: ReplayGuard;
  private readonly options: AuthenticationOptions;

  constructor(accounts: AccountStore, replays: ReplayGuard, options: Partial<AuthenticationOptions> = {}) {
    this.accounts = accounts;
    this.replays = replays;
    this.options = { ...defaultAuthenticationOptions, ...options };
  }

  /**
   * The account whose credentials these are: 4014 without a key, 4004 for
   * an unknown one, 4005 when they do not prove it. At once (a refusal
   * thrown) when the store answers at once and the credentials are a
   * secret; a signed call waits for its replay check (MaybeAsync). Without
   * an operation (a read of the caller's own account), a legacy `sign`,
   * which signs an operation's parameters, proves nothing.
   */
  identify(operation: Operation | undefined, credentials: Credentials, now: number): MaybeAsync<Account> {
    if (credentials.kind === "unsupported") {
      throw new GatewayError(ErrorCode.INVALID_CREDENTIALS, `the Authorization scheme ${credentials.scheme.slice(0, 32)} is not supported; send the key alone, Bearer <key>, Gateway-Key <key> or ${signatureScheme}`);
    }
    const key = credentials.key;
    if (key === undefined || key === "") throw new GatewayError(ErrorCode.MISSING_URL_PARAM, "missing url param: key");
    const found = key.length <= maxKeyLength ? this.accounts.find(key) : undefined;
    return thenMaybe(found, (account) => this.proven(account, credentials, operation, now));
  }

  /** The account found for the key, once the credentials prove it. */
  private proven(account: Account | undefined, credentials: Exclude<Credentials, { kind: "unsupported" }>, operation: Operation | undefined, now: number): MaybeAsync<Account> {
    if (account === undefined) throw new GatewayError(ErrorCode.ACCOUNT_NOT_FOUND, "no account has this key");
    switch (credentials.kind) {
      case "legacy-signed":
        if (operation === undefined) throw new GatewayError(ErrorCode.INVALID_CREDENTIALS, "a legacy sign signs a catalogue call; send the secret or an HMAC signature of this method");
        return this.checkLegacySigned(account, credentials, operation, now).then(() => account);
      case "hmac":
        return this.checkHmac(account, credentials, now).then(() => account);
      default:
        if (credentials.secret === undefined || credentials.secret === "") throw new GatewayError(ErrorCode.INVALID_CREDENTIALS, "missing secret");
        if (!secretMatches(account, credentials.secret, now)) throw new GatewayError(ErrorCode.INVALID_CREDENTIALS, "the secret does not match the key");
        return account;
    }
  }

  /** Whether an identified account may call the operation now: 4007, expired 4005, 4012, 4006. */
  authorize(account: Account, operation: Operation, now: number, clientIp: string): void {
    // Before anything else of the account's: a caller elsewhere learns nothing of it but that its key does not work there.
    if (!addressAllowed(account.allowedFrom, clientIp)) throw new AddressNotAllowed(clientIp);
    if (account.status === "stopped") throw new GatewayError(ErrorCode.ACCOUNT_STOPPED, "this account is stopped");
    if (dayOf(now, account.zone) > account.expires) throw new GatewayError(ErrorCode.INVALID_CREDENTIALS, `the key expired on ${account.expires}`);
    const state = account.operations.get(operation.id);
    if (state === undefined) throw new GatewayError(ErrorCode.API_NOT_ADDED, `${operation.id} has not been added to this account`);
    if (state === "stopped") throw new GatewayError(ErrorCode.API_STOPPED, `${operation.id} is stopped for this account`);
  }

  private windowMs(): number {
    return this.options.signatureWindowSeconds * 1000;
  }

  private checkTime(at: number, now: number, what: string): void {
    if (Math.abs(now - at) > this.windowMs()) {
      throw new GatewayError(ErrorCode.INVALID_CREDENTIALS, `${what} is more than ${this.options.signatureWindowSeconds} s away from the server's time; sign the call anew`);
    }
  }

  private async checkLegacySigned(account: Account, c: Extract<Credentials, { kind: "legacy-signed" }>, operation: Operation, now: number): Promise<void> {
    if (c.dateline === undefined || c.dateline === "") throw new GatewayError(ErrorCode.INVALID_CREDENTIALS, "a signed call needs dateline");
    const at = zonedTimeToEpoch(c.dateline, this.options.timeZone);
    if (at === undefined) throw new GatewayError(ErrorCode.INVALID_CREDENTIALS, `dateline must be YYYY-MM-DD HH:MM:SS in ${this.options.timeZone}`);
    this.checkTime(at, now, "dateline");
    const keys = signingKeys(account, "legacySigningKey", now);
    if (keys.length === 0) throw new GatewayError(ErrorCode.INVALID_CREDENTIALS, "this account's secret predates signed calls; rotate it to sign calls");
    if (!hex32.test(c.sign) || !keys.some((key) => sameHex(legacySign({ ...c.params, api_name: operation.apiName }, key), c.sign))) {
      throw new GatewayError(ErrorCode.INVALID_CREDENTIALS, "sign does not match the parameters; sign every parameter sent but secret and sign, plus api_name");
    }
    if (await this.used(`legacy\u0000${account.key}\u0000${c.sign}`, now)) {
      throw new GatewayError(ErrorCode.INVALID_CREDENTIALS, "this sign was already used; sign each call anew");
    }
  }

  private async checkHmac(account: Account, c: Extract<Credentials, { kind: "hmac" }>, now: number): Promise<void> {
    if (c.timestamp === undefined || !/^\d{1,12}$/.test(c.timestamp)) throw new GatewayError(ErrorCode.INVALID_CREDENTIALS, "a signed call needs timestamp, in Unix seconds");
    if (c.nonce === undefined || !nonceForm.test(c.nonce)) throw new GatewayError(ErrorCode.INVALID_CREDENTIALS, "a signed call needs nonceStr: 8 to 64 letters, digits, _ or -");
    this.checkTime(Number(c.timestamp) * 1000, now, "timestamp");
    const keys = signingKeys(account, "hmacKey", now);
    if (keys.length === 0) throw new GatewayError(ErrorCode.INVALID_CREDENTIALS, "this account's secret predates signed calls; rotate it to sign calls");
    const call = { method: c.method, path: c.path, params: c.params, timestamp: Number(c.timestamp), nonce: c.nonce };
    if (!hex64.test(c.signature) || !keys.some((key) => sameHex(browserSignature(key, call), c.signature))) {
      throw new GatewayError(ErrorCode.INVALID_CREDENTIALS, `signature does not match; sign "${c.method} ${c.path}" with every parameter the call sends, its timestamp and nonce`);
    }
    if (await this.used(`hmac\u0000${account.key}\u0000${c.nonce}`, now)) {
      throw new GatewayError(ErrorCode.INVALID_CREDENTIALS, "this nonce was already used; use a fresh nonceStr for every call");
    }
  }

  /** Records a signature as used; a guard that cannot record it refuses the call (4000) rather than risk a replay. */
  private async used(id: string, now: number): Promise<boolean> {
    try {
      return await this.replays.seen(id, now, 2 * this.windowMs());
    } catch (e) {
      throw new GatewayError(ErrorCode.SERVER_INTERNAL_ERROR, "used signatures cannot be recorded, so signed calls are refused for now", { cause: e });
    }
  }
}
