import { createHmac, randomBytes, timingSafeEqual } from "node:crypto";
import { canonicalString, signingKeyLabel, type SignedCall } from "../contract/browser-signature.ts";
import { legacySigningKey } from "./legacy-signature.ts";
import { sha256 } from "./sha256.ts";
import type { OperationId } from "../contract/operations.ts";
import type { Micros } from "./money.ts";
import type { CallRate } from "./call-rate.ts";
import type { AlertSettings, KeptAlertSecret } from "./alerts.ts";
import { stillKept, type Grace } from "./secret-grace.ts";

/** Whether an operation added to an account may be called. */
export type OperationState = "enabled" | "stopped";

export interface Account {
  readonly key: string;
  readonly name: string;
  /** sha256(salt || secret), hex. The plain secret is never stored. */
  readonly secretHash: string;
  readonly secretSalt: string;
  /**
   * What signed calls are checked with, derived from the secret: the legacy
   * scheme's key (md5 of the secret, which is never 32 characters, so it is
   * not itself a usable secret) and the HMAC signing key. Absent on accounts
   * whose secret predates signed calls, until it is rotated.
   */
  readonly legacySigningKey?: string | undefined;
  readonly hmacKey?: string | undefined;
  /** The secrets rotations replaced, each still accepted until its time (a rotation with a grace), newest first (secret-grace.ts). */
  readonly previousSecrets?: readonly PreviousSecret[] | undefined;
  readonly status: "active" | "stopped";
  /** Operations added to the account; absent ones answer 4012. */
  readonly operations: ReadonlyMap<OperationId, OperationState>;
  /** Daily call maximum (the `max` of api_info); reaching it answers 4013. */
  readonly dailyMax: number;
  /** Calls in flight at once; one more answers 4008. */
  readonly concurrency: number;
  /** Calls a second, minute or hour, with their burst; one past it answers 4008. Undefined: no rate limit. */
  readonly rate?: CallRate | undefined;
  /** The addresses and networks the key works from (allowed-addresses.ts); a call from elsewhere answers 4005. Undefined: anywhere. */
  readonly allowedFrom?: readonly string[] | undefined;
  /**
   * Prepaid balance, or undefined for an account that is not billed by
   * balance. Charged calls deduct their operation's price; a call the
   * balance cannot cover answers 4016.
   */
  readonly balance: Micros | undefined;
  /** Price of one charged call, per operation; absent means free. */
  readonly prices: ReadonlyMap<OperationId, Micros>;
  /** Where and when the account is told of its usage and balance (alerts.ts); undefined: never. */
  readonly alerts?: AlertSettings | undefined;
  /** What its alerts are signed with: made when alerts are set, kept while they stay set, shown once. */
  readonly alertSecret?: string | undefined;
  /** The alert secrets new ones replaced, each still signed with until its time (a change of secret with a grace), newest first. */
  readonly previousAlertSecrets?: readonly KeptAlertSecret[] | undefined;
  /** Last day the key works, `YYYY-MM-DD`, in the account's zone. */
  readonly expires: string;
  /** IANA zone whose midnight starts the account's day. */
  readonly zone: string;
  readonly createdAt: number;
  /**
   * The operator's own id for the account (a customer or tenant in its
   * billing system), given when it was made; no two accounts share one.
   * Undefined: none.
   */
  readonly externalId?: string | undefined;
  /** What the request that made an account with an external id asked for, as a digest: a second request with the id is a repeat only if it asked for the same (AccountAdmin.create). */
  readonly createdWith?: string | undefined;
}

/**
 * What the store keeps of a replaced secret that is still accepted until
 * `until` (ms): a rotation with a grace, so the callers of a team can move
 * to the new secret one by one, with no moment where either is refused.
 */
export interface PreviousSecret extends Grace {
  readonly secretHash: string;
  readonly secretSalt: string;
  readonly legacySigningKey?: string | undefined;
  readonly hmacKey?: string | undefined;
}

/** The replaced secrets still accepted at `now`, newest first. */
export function previousSecretsAt(account: Account, now: number): readonly PreviousSecret[] {
  return stillKept(account.previousSecrets, now);
}

export type NewAccount = Omit<Account, "secretHash" | "secretSalt" | "createdAt">;

const alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";

function randomText(length: number, chars: string): string {
  // Rejection sampling keeps every character equally likely.
  const limit = 256 - (256 % chars.length);
  let out = "";
  while (out.length < length) {
    for (const b of randomBytes(length)) {
      if (b < limit && out.length < length) out += chars[b % chars.length];
    }
  }
  return out;
}

/** A new account key: 16 lowercase letters and digits. */
export function newKey(): string {
  return randomText(16, alphabet.slice(0, 26) + alphabet.slice(52));
}

/**
 * A new secret: 40 characters, about 238 bits. Not 32 characters on purpose:
 * the legacy signing scheme uses a 32-character secret as its own signing key,
 * so a secret of another length keeps the signing key (its md5) distinct from
 * the secret itself.
 */
export function newSecret(): string {
  return randomText(40, alphabet);
}

/** The salted SHA-256 of a secret, on every plain call (sha256.ts: node:crypto's set-up cost more than the digest). */
function saltedDigest(secret: string, salt: string): Buffer {
  return sha256(salt + secret);
}

/** The salted hash the store keeps of a secret, as hex. */
export function hashSecret(secret: string, salt: string): string {
  return saltedDigest(secret, salt).toString("hex");
}

/** Everything the store keeps of a secret: a salted hash for plain calls and the two signing keys. */
export function sealSecret(secret: string): { secretHash: string; secretSalt: string; legacySigningKey: string; hmacKey: string } {
  const secretSalt = randomBytes(16).toString("hex");
  return {
    secretHash: hashSecret(secret, secretSalt),
    secretSalt,
    legacySigningKey: legacySigningKey(secret),
    // The same derivation as deriveSigningKey in src/client/browser-signature.ts.
    hmacKey: createHmac("sha256", secret).update(signingKeyLabel).digest("hex"),
  };
}

/** The browser-safe signature of a call under an account's HMAC signing key, as lowercase hex: what the gateway checks and what AdminService.SignCall hands out. */
export function browserSignature(hmacKey: string, call: SignedCall): string {
  return createHmac("sha256", Buffer.from(hmacKey, "hex")).update(canonicalString(call)).digest("hex");
}

/** A fresh nonce for a signed call: 22 characters of A-Z a-z 0-9 _ - from a cryptographic source. */
export function newNonce(): string {
  return randomBytes(16).toString("base64url");
}

/** Compares two hex digests in constant time; a length mismatch compares against itself first. */
export function sameHex(expected: string, presented: string): boolean {
  const a = Buffer.from(expected, "utf8");
  const b = Buffer.from(presented, "utf8");
  if (a.length !== b.length) {
    timingSafeEqual(a, a);
    return false;
  }
  return timingSafeEqual(a, b);
}

/** Each secret's stored hash as bytes (an account's, or a replaced one's), read from its hex once. */
const expectedDigests = new WeakMap<Account | PreviousSecret, Buffer>();

function digestMatches(sealed: Account | PreviousSecret, presented: string): boolean {
  let expected = expectedDigests.get(sealed);
  if (expected === undefined) {
    expected = Buffer.from(sealed.secretHash, "hex");
    expectedDigests.set(sealed, expected);
  }
  const actual = saltedDigest(presented, sealed.secretSalt);
  return expected.length === actual.length && timingSafeEqual(expected, actual);
}

/** Constant-time check of a presented secret against the stored hash, and within a rotation's grace against the replaced one's. */
export function secretMatches(account: Account, presented: string, now: number): boolean {
  if (digestMatches(account, presented)) return true;
  for (const previous of previousSecretsAt(account, now)) if (digestMatches(previous, presented)) return true;
  return false;
}
