import type { Credentials } from "../core/authentication.ts";
import { parseAuthorization } from "./authorization-header.ts";

/**
 * Every credential a caller may send, by its legacy parameter name and its
 * RPC header (gRPC metadata). Redaction, CORS and the banner read this table.
 */
export const credentialFields = {
  key: { param: "key", header: "x-api-key" },
  secret: { param: "secret", header: "x-api-secret" },
  /** The legacy signed form. */
  dateline: { param: "dateline", header: "x-api-dateline" },
  sign: { param: "sign", header: "x-api-sign" },
  /** The browser-safe form (also accepted as an Authorization header). */
  timestamp: { param: "timestamp", header: "x-api-timestamp" },
  nonce: { param: "nonceStr", header: "x-api-nonce" },
  signature: { param: "signature", header: "x-api-signature" },
} as const;

export type CredentialField = keyof typeof credentialFields;

/** The RPC headers, by field. */
export const credentialHeaders = Object.fromEntries(Object.entries(credentialFields).map(([k, v]) => [k, v.header])) as {
  readonly [K in CredentialField]: (typeof credentialFields)[K]["header"];
};

/** Names whose values never reach a log line or a reason, lowercased: the parameters, the headers, Authorization. */
export const credentialNames: ReadonlySet<string> = new Set([
  ...Object.values(credentialFields).flatMap((f) => [f.param.toLowerCase(), f.header]),
  "authorization",
]);

/** Where one request's credentials come from, whichever transport carried it. */
export interface CredentialSource {
  /** A credential field as the request carries it (legacy: parameter; RPC: header). */
  field(name: CredentialField): string | undefined;
  readonly authorization: string | undefined;
  /** What an HMAC signature binds: GET/POST on the legacy paths, RPC on the RPC paths, and the path. */
  readonly method: string;
  readonly path: string;
  /** Every parameter the call sends, as the signatures cover them; read only for a signed call. */
  params(): Readonly<Record<string, string | undefined>>;
}

/**
 * The caller's credentials in whichever form it used: the HMAC form in the
 * Authorization header, the legacy signed form (`sign`), the browser form
 * (`signature`), or key and secret. The key may also come alone in the
 * Authorization header (`KEY`, `Bearer KEY`, `Gateway-Key KEY`).
 */
export function readCredentials(source: CredentialSource): Credentials {
  const header = parseAuthorization(source.authorization);
  if (header?.scheme === "unsupported") return { kind: "unsupported", scheme: header.name };
  const key = source.field("key") ?? (header?.scheme === "key" ? header.key : undefined);
  const { method, path } = source;
  if (header?.scheme === "hmac") {
    return { kind: "hmac", key: header.key ?? key, timestamp: header.timestamp, nonce: header.nonce, signature: header.signature, method, path, params: source.params() };
  }
  const sign = source.field("sign");
  if (sign !== undefined) {
    const signed: Record<string, string> = {};
    for (const [name, value] of Object.entries(source.params())) if (value !== undefined) signed[name] = value;
    if (key !== undefined) signed.key = key;
    const dateline = source.field("dateline");
    if (dateline !== undefined) signed.dateline = dateline;
    delete signed.sign;
    delete signed.secret;
    return { kind: "legacy-signed", key, dateline, sign, params: signed };
  }
  const signature = source.field("signature");
  if (signature !== undefined) {
    return { kind: "hmac", key, timestamp: source.field("timestamp"), nonce: source.field("nonce"), signature, method, path, params: source.params() };
  }
  return { kind: "plain", key, secret: source.field("secret") };
}
