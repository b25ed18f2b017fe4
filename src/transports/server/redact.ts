import { credentialNames } from "../credentials.ts";

/** A parameter name as a reader would take it: percent-decoded, trimmed, lowercased. */
function normalName(raw: string): string {
  let name = raw.replace(/\+/g, " ");
  try {
    name = decodeURIComponent(name);
  } catch {
    // a malformed escape: judged as written
  }
  return name.trim().toLowerCase();
}

/**
 * A request URL with the value of every credential parameter replaced, for
 * logs. Names match whatever their case or percent-encoding (`SECRET=`,
 * `se%63ret=`, `secret%20=`); the rest of the URL is kept as sent.
 */
export function redactUrl(url: string): string {
  const q = url.indexOf("?");
  if (q < 0) return url;
  let redacted = false;
  const parts = url
    .slice(q + 1)
    .split("&")
    .map((part) => {
      const eq = part.indexOf("=");
      const name = eq < 0 ? part : part.slice(0, eq);
      if (!credentialNames.has(normalName(name))) return part;
      redacted = true;
      return `${name}=[redacted]`;
    });
  return redacted ? `${url.slice(0, q)}?${parts.join("&")}` : url;
}
