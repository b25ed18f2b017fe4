import { pino, type Logger } from "pino";
import { redactUrl } from "./redact.ts";
import { traceIdOf } from "../../core/trace-context.ts";

export type { Logger } from "pino";

/**
 * The one logger of a running gateway: JSON lines, requests logged with
 * their credentials redacted and no headers, but for the trace id of a
 * W3C `traceparent` the request carries (`traceId`, core/trace-context.ts).
 * The runtime and the app share it.
 */
export function createLogger(options: { level: string; stream?: NodeJS.WritableStream | undefined }): Logger {
  return pino(
    {
      level: options.level,
      serializers: {
        err: pino.stdSerializers.err,
        req: (req: { method: string; url: string; ip?: string; clientIp?: string; headers?: { traceparent?: string | string[] | undefined } }) => ({
          method: req.method,
          url: redactUrl(req.url),
          remoteAddress: req.clientIp ?? req.ip,
          traceId: traceIdOf(req.headers?.traceparent),
        }),
      },
    },
    (options.stream ?? process.stdout) as pino.DestinationStream,
  );
}
