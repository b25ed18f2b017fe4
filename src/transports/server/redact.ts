/** Query parameters whose values never reach a log line. */
const secretParams = new Set(["key", "secret", "sign", "signature", "dateline", "nonceStr", "timestamp"]);

/** A request URL with the values of credential parameters replaced, for logs. */
export function redactUrl(url: string): string {
  const q = url.indexOf("?");
  if (q < 0) return url;
  const params = new URLSearchParams(url.slice(q + 1));
  let redacted = false;
  for (const name of new Set(params.keys())) {
    if (secretParams.has(name)) {
      params.set(name, "[redacted]");
      redacted = true;
    }
  }
  return redacted ? `${url.slice(0, q)}?${params.toString()}` : url;
}
