/**
 * Warnings and errors that repeat are written once a window, then counted.
 *
 * A cause that every call meets (a shared database that cannot be reached, a
 * ledger that cannot be written, a fault of the gateway's own) would
 * otherwise write its line, stack and all, for every call: measured at 24 MB
 * of log a second from one replica during a database outage, enough to fill
 * a disk in an hour and to bury everything else. So the first line of a cause
 * is written whole, with its stack; the same line again within
 * `windowSeconds` is not written but counted; when the window ends, one line
 * says how many there were (`repeated`), since when, and the first and last
 * request ids among them. The next line of that cause opens a new window,
 * written whole again. Each call's own request id and four-digit code stay
 * on its access line, which this never holds back.
 *
 * The same line: the same level, message (before interpolation) and error:
 * its type, `code`, message and the first frame of its stack, so two faults
 * with the same words from different places stay apart. Info and below
 * (access lines, lifecycle) and `fatal` are never held; neither is a line
 * marked with `everyLine` (one that names calls to refund, say).
 */

/** Marks a line's fields so that it is written every time, whatever repeats. Not written itself (a symbol). */
export const keepEveryLine: unique symbol = Symbol("gateway.log.keepEveryLine");

/** A line's fields, marked to be written every time. */
export function everyLine<T extends object>(fields: T): T {
  return Object.assign(fields, { [keepEveryLine]: true });
}

/** The default window: a storm writes one whole line and one count in 10 s per cause. */
export const defaultRepeatWindowSeconds = 10;

/** How many causes are held at once; a line past that is written whole (a message that varies call by call is no repeat). */
const maxCauses = 1_000;

/** pino's numeric levels: warn and error are held, fatal never. */
const warnLevel = 40;
const fatalLevel = 60;

type LogMethod = (this: unknown, ...args: unknown[]) => void;

interface Cause {
  readonly since: number;
  readonly method: LogMethod;
  readonly message: string;
  /** The first line's error, written again with the count (its stack too: one a window). */
  readonly err: unknown;
  repeated: number;
  firstRequestId: string | undefined;
  lastRequestId: string | undefined;
  timer: ReturnType<typeof setTimeout> | undefined;
}

export class RepeatedLines {
  private readonly causes = new Map<string, Cause>();
  /** The logger the counts are written through (the root, so no request's bindings ride on them). */
  private root: unknown;

  private readonly windowMs: number;
  private readonly now: () => number;

  constructor(windowMs: number, now: () => number = Date.now) {
    this.windowMs = windowMs;
    this.now = now;
  }

  /** The root logger, once made. */
  attach(root: unknown): void {
    this.root = root;
  }

  /** pino's `hooks.logMethod`: writes the line, or counts it. */
  hook(logger: unknown, args: unknown[], method: LogMethod, level: number): void {
    if (level < warnLevel || level >= fatalLevel || this.windowMs <= 0) return void method.apply(logger, args);
    const line = lineOf(args);
    if (line === undefined) return void method.apply(logger, args);
    const now = this.now();
    const seen = this.causes.get(line.key);
    if (seen === undefined) {
      if (this.causes.size < maxCauses) {
        this.causes.set(line.key, { since: now, method, message: line.message, err: line.err, repeated: 0, firstRequestId: undefined, lastRequestId: undefined, timer: undefined });
        // A cause met once and never again is forgotten at its window's end.
        this.schedule(line.key);
      }
      return void method.apply(logger, args);
    }
    seen.repeated += 1;
    const requestId = requestIdOf(args[0], logger);
    if (requestId !== undefined) {
      seen.firstRequestId ??= requestId;
      seen.lastRequestId = requestId;
    }
  }

  /** Writes every count still held (a stop): nothing counted goes unsaid. */
  flush(): void {
    for (const key of [...this.causes.keys()]) this.close(key);
  }

  private schedule(key: string): void {
    const cause = this.causes.get(key);
    if (cause === undefined) return;
    cause.timer = setTimeout(() => this.close(key), this.windowMs);
    cause.timer.unref();
  }

  /** Ends a cause's window: its count, if any, is written, and its next line is written whole. */
  private close(key: string): void {
    const cause = this.causes.get(key);
    if (cause === undefined) return;
    this.causes.delete(key);
    if (cause.timer !== undefined) clearTimeout(cause.timer);
    if (cause.repeated === 0) return;
    const fields = {
      err: cause.err,
      repeated: cause.repeated,
      repeatedSince: new Date(cause.since).toISOString(),
      repeatedSeconds: Math.round((this.now() - cause.since) / 100) / 10,
      firstRequestId: cause.firstRequestId,
      lastRequestId: cause.lastRequestId,
    };
    cause.method.call(this.root, fields, cause.message);
  }
}

interface Line {
  readonly key: string;
  readonly message: string;
  readonly err: unknown;
}

/** What makes a line the same line, from pino's arguments: `(fields, message)`, `(error, message)` or `(message)`. */
function lineOf(args: readonly unknown[]): Line | undefined {
  const [first, second] = args;
  let message: string;
  let err: unknown;
  if (typeof first === "string") message = first;
  else if (first instanceof Error) {
    err = first;
    message = typeof second === "string" ? second : first.message;
  } else if (typeof first === "object" && first !== null) {
    if ((first as { [keepEveryLine]?: boolean })[keepEveryLine] === true) return undefined;
    err = (first as { err?: unknown }).err;
    message = typeof second === "string" ? second : "";
  } else return undefined;
  return { key: `${message}\u0000${errorKey(err)}`, message, err };
}

/** An error's part of a line's key: its type, code, message and where it was made. */
function errorKey(err: unknown): string {
  if (err === undefined || err === null) return "";
  if (!(err instanceof Error)) return typeof err === "object" ? "object" : `${typeof err}\u0000${String(err).slice(0, 500)}`;
  const code = (err as { code?: unknown }).code;
  return `${err.constructor?.name ?? err.name}\u0000${typeof code === "string" || typeof code === "number" ? code : ""}\u0000${err.message.slice(0, 500)}\u0000${firstFrame(err.stack)}`;
}

function firstFrame(stack: string | undefined): string {
  if (stack === undefined) return "";
  const at = stack.indexOf("\n    at ");
  if (at < 0) return "";
  const end = stack.indexOf("\n", at + 1);
  return stack.slice(at + 1, end < 0 ? undefined : end);
}

/** The call a held line was about: its own `requestId`, or its logger's (a request's child). */
function requestIdOf(fields: unknown, logger: unknown): string | undefined {
  const own = typeof fields === "object" && fields !== null ? (fields as { requestId?: unknown }).requestId : undefined;
  if (typeof own === "string") return own;
  const bindings = (logger as { bindings?: () => { requestId?: unknown } }).bindings?.();
  return typeof bindings?.requestId === "string" ? bindings.requestId : undefined;
}
