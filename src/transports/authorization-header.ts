import { signatureScheme } from "../contract/browser-signature.ts";

/** What an `Authorization` header says. */
export type AuthorizationHeader =
  | { readonly scheme: "hmac"; readonly key?: string; readonly timestamp?: string; readonly nonce?: string; readonly signature: string }
  | { readonly scheme: "key"; readonly key: string }
  | { readonly scheme: "unsupported"; readonly name: string };

/**
 * Reads the Authorization forms a caller may use:
 * - `GATEWAY-HMAC-SHA256 key=…, timestamp=…, nonce=…, signature=…` (values optionally quoted);
 * - the key alone (`Authorization: KEY`, as legacy client examples send it),
 *   `Bearer KEY` or `Gateway-Key KEY`: the key, the secret coming as usual.
 * Any other scheme is `unsupported`, named so the caller can be told.
 */
export function parseAuthorization(header: string | undefined | null): AuthorizationHeader | undefined {
  if (header === undefined || header === null) return undefined;
  const trimmed = header.trim();
  if (trimmed === "") return undefined;
  const space = trimmed.indexOf(" ");
  if (space < 0) return { scheme: "key", key: trimmed };
  const scheme = trimmed.slice(0, space);
  const rest = trimmed.slice(space + 1).trim();
  const lower = scheme.toLowerCase();
  if ((lower === "gateway-key" || lower === "bearer") && rest !== "" && !rest.includes(" ")) return { scheme: "key", key: rest };
  if (scheme.toUpperCase() !== signatureScheme) return { scheme: "unsupported", name: /^[A-Za-z0-9._~+-]{1,32}$/.test(scheme) ? scheme : "given" };
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
