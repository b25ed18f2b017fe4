/** The app's CORS settings, as @fastify/cors takes them: its `origin` option (false: CORS off) and the headers it exposes. */
export interface CorsSettings {
  readonly origin: false | string | readonly string[];
  readonly exposedHeaders: readonly string[];
}

/** The settings for `GATEWAY_CORS_ORIGINS`: none (off), `*` among them (any origin), or the list. */
export function corsSettings(origins: readonly string[], exposedHeaders: readonly string[]): CorsSettings {
  return { origin: origins.length === 0 ? false : origins.includes("*") ? "*" : [...origins], exposedHeaders };
}

/**
 * The headers @fastify/cors adds, with our options, to the answer to a
 * request from `origin` (its onRequest hook): for any origin, that one; for
 * a list, `Vary: Origin` and the origin reflected when listed; the exposed
 * headers either way. None with CORS off. An answer written outside
 * Fastify (a fast path's, or a refusal by the HTTP layer) adds the same, so
 * a browser reads it as it reads any answer. `origin` undefined: none was
 * sent, or the request's head could not be read.
 */
export function corsHeaders(settings: CorsSettings, origin: string | undefined): Record<string, string> {
  if (settings.origin === false) return {};
  const out: Record<string, string> = {};
  if (typeof settings.origin === "string") out["access-control-allow-origin"] = settings.origin;
  else {
    out.vary = "Origin";
    if (origin !== undefined && settings.origin.includes(origin)) out["access-control-allow-origin"] = origin;
  }
  out["access-control-expose-headers"] = settings.exposedHeaders.join(", ");
  return out;
}
