/**
 * The browser-safe signature's contract: the scheme name, the label the
 * signing key is derived with, and the canonical string. The gateway
 * (core/authentication.ts, core/accounts.ts) and its callers
 * (client/browser-signature.ts) both read it from here, so the two sides
 * cannot drift apart.
 *
 * The canonical string is five lines joined by "\n":
 *
 *     GATEWAY-HMAC-SHA256
 *     <method>        GET or POST on the legacy paths, RPC on the RPC paths
 *     <path>          /<catalogue>/<api_name>/ or /<package>.<Service>/<Method>
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
 * the signing key is HMAC-SHA256(key = the secret, signingKeyLabel).
 */

export const signatureScheme = "GATEWAY-HMAC-SHA256";

/** The message the secret signs to make the signing key. */
export const signingKeyLabel = "gateway-browser-signing-v1";

/** Parameters the signature carries itself: the key selects the signing key, the rest have their own lines. */
export const signatureFields: ReadonlySet<string> = new Set(["key", "timestamp", "nonceStr", "signature"]);

export interface SignedCall {
  /** GET or POST (legacy paths) or RPC. */
  readonly method: string;
  /** The operation's path: legacy (/<catalogue>/<api_name>/) or RPC (/<package>.<Service>/<Method>). */
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
