/**
 * The browser-safe signature, shared by the gateway and its callers. It uses
 * only WebCrypto, so the same module runs in Node and in a browser.
 *
 * The caller's back end, which holds the secret, derives the signing key
 * once (`deriveSigningKey`), and signs each call (`signCall`); the browser
 * receives `timestamp`, `nonceStr` and `signature` and never the secret.
 *
 * The canonical string is five lines joined by "\n":
 *
 *     GATEWAY-HMAC-SHA256
 *     <method>        GET or POST on the legacy paths, RPC on the RPC paths
 *     <path>          /retail/item_get/ or /gateway.catalogue.v1.RetailService/ItemGet
 *     <parameters>    every parameter the call sends with a value, sorted by name,
 *                     as name=value with both sides percent-encoded
 *                     (encodeURIComponent), joined by "&": on the legacy
 *                     paths every query and body parameter (num_iid, cache,
 *                     lang, result_type, …) but the signature's own key,
 *                     timestamp, nonceStr and signature; on the RPC paths the
 *                     request's fields under their legacy names (num_iid,
 *                     is_promotion, sid, cache=yes|no, lang=cn|en|ru)
 *     <timestamp>     Unix seconds, as decimal text
 *     <nonce>         8 to 64 characters of A-Z a-z 0-9 _ -, never reused
 *
 * signature = lowercase hex HMAC-SHA256(signing key, canonical string), where
 * the signing key is HMAC-SHA256(key = the secret, "gateway-browser-signing-v1").
 */

export const signatureScheme = "GATEWAY-HMAC-SHA256";
const derivationLabel = "gateway-browser-signing-v1";

/** Parameters the signature carries itself: the key selects the signing key, the rest have their own lines. */
export const signatureFields: ReadonlySet<string> = new Set(["key", "timestamp", "nonceStr", "signature"]);

export interface SignedCall {
  /** GET or POST (legacy paths) or RPC. */
  readonly method: string;
  /** The operation's path: legacy (/retail/item_get/) or RPC (/gateway.catalogue.v1.RetailService/ItemGet). */
  readonly path: string;
  /** Every parameter the call sends (see above); empty values are left out. */
  readonly params: Readonly<Record<string, string | undefined>>;
  /** Unix seconds. */
  readonly timestamp: number;
  readonly nonce: string;
}

export function canonicalString(call: SignedCall): string {
  const params = Object.keys(call.params)
    .filter((name) => !signatureFields.has(name) && (call.params[name] ?? "") !== "")
    .sort()
    .map((name) => `${encodeURIComponent(name)}=${encodeURIComponent(call.params[name]!)}`)
    .join("&");
  return [signatureScheme, call.method, call.path, params, String(call.timestamp), call.nonce].join("\n");
}

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
  return hmac(text.encode(secret) as Uint8Array<ArrayBuffer>, derivationLabel);
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
