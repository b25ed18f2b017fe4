import { pino, type Logger } from "pino";
import { redactUrl } from "./redact.ts";

export type { Logger } from "pino";

/**
 * The one logger of a running gateway: JSON lines, requests logged with
 * their credentials redacted and no headers. The runtime and the app share it.
 */
export function createLogger(options: { level: string; stream?: NodeJS.WritableStream | undefined }): Logger {
  return pino(
    {
      level: options.level,
      serializers: {
        err: pino.stdSerializers.err,
        req: (req: { method: string; url: string; ip?: string; clientIp?: string }) => ({ method: req.method, url: redactUrl(req.url), remoteAddress: req.clientIp ?? req.ip }),
      },
    },
    (options.stream ?? process.stdout) as pino.DestinationStream,
  );
}
