import type { FastifyBaseLogger } from "fastify";

/**
 * Writes a request's first access line and returns the writer of its last, or undefined when info lines are off.
 * `traceparent`: the request's header, whose trace id the line names (logger.ts).
 */
export type AccessLog = (requestId: string, method: string, url: string, clientIp: string, traceparent: string | string[] | undefined) => ((statusCode: number) => void) | undefined;

/** Whether the logger writes info lines (Fastify's no-op logger, with logging off, cannot say, and writes nothing). */
function infoEnabled(log: FastifyBaseLogger): boolean {
  const pinoLike = log as FastifyBaseLogger & { isLevelEnabled?: (level: string) => boolean };
  return typeof pinoLike.isLevelEnabled === "function" && pinoLike.isLevelEnabled("info");
}

/**
 * The two access lines Fastify writes for each request ("incoming request",
 * "request completed", on a child logger bound to the request id), for the
 * fast paths that answer before Fastify sees the request: the app's
 * logger, so its serializers (credentials redacted from the URL) apply.
 */
export function accessLog(log: FastifyBaseLogger): AccessLog {
  if (!infoEnabled(log)) return () => undefined;
  return (requestId, method, url, clientIp, traceparent) => {
    const started = performance.now();
    const child = log.child({ requestId });
    child.info({ req: { method, url, clientIp, headers: { traceparent } } }, "incoming request");
    return (statusCode) => child.info({ res: { statusCode }, responseTime: performance.now() - started }, "request completed");
  };
}
