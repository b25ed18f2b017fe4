import { createHash } from "node:crypto";

const md5 = (s: string) => createHash("md5").update(s, "utf8").digest("hex");

/**
 * The legacy signed-call scheme (legacy-wire-notes.md, "Signed calls"):
 * the signing key is the secret when it is 32 characters long, else its md5;
 * the signed text is every parameter but `secret` and `sign` whose value is
 * not empty and does not start with `@`, sorted by name and joined as
 * `name=value` with `&`, values raw; `sign` is md5(text + signing key).
 */
export function legacySigningKey(secret: string): string {
  return secret.length === 32 ? secret : md5(secret);
}

export function legacySign(params: Readonly<Record<string, string>>, signingKey: string): string {
  const text = Object.keys(params)
    .filter((name) => name !== "secret" && name !== "sign")
    .filter((name) => params[name] !== "" && !params[name]!.startsWith("@"))
    .sort()
    .map((name) => `${name}=${params[name]}`)
    .join("&");
  return md5(text + signingKey);
}
