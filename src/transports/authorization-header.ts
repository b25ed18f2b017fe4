import { signatureScheme } from "../client/browser-signature.ts";

/** What an `Authorization` header says, when it is one of the gateway's forms. */
export type AuthorizationHeader =
  | { readonly scheme: "hmac"; readonly key?: string; readonly timestamp?: string; readonly nonce?: string; readonly signature: string }
  | { readonly scheme: "key"; readonly key: string };

/**
 * Reads `Authorization: GATEWAY-HMAC-SHA256 key=…, timestamp=…, nonce=…, signature=…`
 * (values optionally quoted) or `Authorization: Gateway-Key <key>`. Anything
 * else is not the gateway's and is left alone.
 */
export function parseAuthorization(header: string | undefined | null): AuthorizationHeader | undefined {
  if (header === undefined || header === null) return undefined;
  const space = header.indexOf(" ");
  const scheme = space < 0 ? header : header.slice(0, space);
  const rest = space < 0 ? "" : header.slice(space + 1).trim();
  if (scheme.toLowerCase() === "gateway-key" && rest !== "") return { scheme: "key", key: rest };
  if (scheme.toUpperCase() !== signatureScheme) return undefined;
  const fields: Record<string, string> = {};
  for (const part of rest.split(",")) {
    const eq = part.indexOf("=");
    if (eq < 0) continue;
    fields[part.slice(0, eq).trim().toLowerCase()] = part.slice(eq + 1).trim().replace(/^"(.*)"$/, "$1");
  }
  return {
    scheme: "hmac",
    signature: fields.signature ?? "",
    ...(fields.key !== undefined ? { key: fields.key } : {}),
    ...(fields.timestamp !== undefined ? { timestamp: fields.timestamp } : {}),
    ...(fields.nonce !== undefined ? { nonce: fields.nonce } : {}),
  };
}
