import { pino, type Logger } from "pino";
import { redactUrl } from "./redact.ts";
import { traceIdOf } from "../../core/trace-context.ts";
import { defaultRepeatWindowSeconds, RepeatedLines } from "./repeated-lines.ts";
import { LogOutput } from "./log-output.ts";

export type { Logger } from "pino";

/**
 * The one logger of a running gateway: JSON lines, requests logged with
 * their credentials redacted and no headers, but for the trace id of a
 * W3C `traceparent` the request carries (`traceId`, core/trace-context.ts).
 * The runtime and the app share it. A warning or error that repeats is
 * written once a window and then counted (repeated-lines.ts), so a cause
 * every call meets cannot fill the disk; and on stdout, a line its reader
 * or disk cannot take is dropped and counted, never the process's end or a
 * pile in memory (log-output.ts).
 */
export function createLogger(options: { level: string; stream?: NodeJS.WritableStream | undefined; repeatWindowSeconds?: number | undefined }): Logger {
  const repeated = new RepeatedLines((options.repeatWindowSeconds ?? defaultRepeatWindowSeconds) * 1000);
  const logger = pino(
    {
      level: options.level,
      hooks: {
        logMethod(args, method, level) {
          repeated.hook(this, args, method as (this: unknown, ...a: unknown[]) => void, level);
        },
      },
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
    (options.stream ?? stdoutOutput()) as pino.DestinationStream,
  );
  repeated.attach(logger);
  repeatedOf.set(logger, repeated);
  if (options.stream === undefined) stdoutOutput().onRecovered ??= (fields, message) => logger.warn(fields, message);
  return logger;
}

let stdout: LogOutput | undefined;

/** The process's stdout as its loggers write to it (log-output.ts): one for the process, as stdout is; `options` count the first time. */
export function stdoutOutput(options?: { maxBacklogBytes?: number }): LogOutput {
  return (stdout ??= new LogOutput(options));
}

const repeatedOf = new WeakMap<object, RepeatedLines>();

/** Writes the counts a logger still holds (before a stop's last line). */
export function flushRepeatedLines(logger: object): void {
  repeatedOf.get(logger)?.flush();
}
