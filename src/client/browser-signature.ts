/**
 * Signing a call in the browser-safe form, for the gateway's callers. It uses
 * only WebCrypto, so the same module runs in Node and in a browser; the
 * canonical string and the key-derivation label are the contract's
 * (contract/browser-signature.ts).
 *
 * The caller's back end, which holds the secret, derives the signing key
 * once (`deriveSigningKey`), and signs each call (`signCall`); the browser
 * receives `timestamp`, `nonceStr` and `signature` and never the secret.
 */
import { canonicalString, signingKeyLabel, type SignedCall } from "../contract/browser-signature.ts";

export { canonicalString, signatureFields, signatureScheme, type SignedCall } from "../contract/browser-signature.ts";

const text = new TextEncoder();

function hex(bytes: ArrayBuffer): string {
  return [...new Uint8Array(bytes)].map((b) => b.toString(16).padStart(2, "0")).join("");
}

function fromHex(h: string): Uint8Array<ArrayBuffer> {
  const out = new Uint8Array(h.length / 2);
  for (let i = 0; i < out.length; i++) out[i] = Number.parseInt(h.slice(i * 2, i * 2 + 2), 16);
  return out;
}

async function hmac(key: Uint8Array<ArrayBuffer>, message: string): Promise<string> {
  const k = await crypto.subtle.importKey("raw", key, { name: "HMAC", hash: "SHA-256" }, false, ["sign"]);
  return hex(await crypto.subtle.sign("HMAC", k, text.encode(message)));
}

/** The signing key of a secret, as lowercase hex. Only the caller's back end (and the gateway) hold it. */
export function deriveSigningKey(secret: string): Promise<string> {
  return hmac(text.encode(secret) as Uint8Array<ArrayBuffer>, signingKeyLabel);
}

/** The signature of one call, as lowercase hex. */
export function signCall(signingKeyHex: string, call: SignedCall): Promise<string> {
  return hmac(fromHex(signingKeyHex), canonicalString(call));
}

/** A fresh nonce: 22 characters from a cryptographic source. */
export function newNonce(): string {
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  return btoa(String.fromCharCode(...bytes)).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}
