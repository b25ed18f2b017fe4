import { writeSync } from "node:fs";
import { Socket } from "node:net";

/**
 * Where a serving gateway's log lines go: its stdout, whatever is on the
 * other end, without that end ever stopping the serving.
 *
 * Written to `process.stdout` as it was, three ends took the gateway down
 * (measured on an embedded demo gateway, 300 calls or 20 callers):
 * - a reader that went away (`gateway serve | shipper` and the shipper
 *   restarted, or `| head`): the next line's EPIPE was an unhandled error,
 *   and the process ended;
 * - a log file on a full disk: the next line's ENOSPC, the same;
 * - a reader that stopped reading (a stuck shipper): the lines piled up in
 *   memory, 151 MB to 601 MB in 15 s, past the memory budget, and a SIGTERM
 *   then waited for the reader; a terminal that stopped taking output
 *   stopped the process itself at its next line (Node writes a terminal
 *   synchronously), /healthz included.
 *
 * Now a line the end cannot take is dropped and counted, and serving goes on:
 * - a file (or `/dev/null`) is written line by line as before (the same
 *   system calls); a line whose write fails (ENOSPC, EIO) is dropped, and
 *   the next is tried;
 * - a pipe, socket or terminal is written through Node's stream, a terminal
 *   too without blocking, and a line that finds `maxBufferedBytes` already waiting is dropped; a
 *   reader gone (EPIPE, or any error, after which the stream is closed)
 *   drops every line after it.
 * When lines go through again after some were dropped, one warning says how
 * many, since when and why; `gateway_log_lines_dropped_total{reason}` counts
 * them. A stop waits for waiting lines at most `settle`'s time.
 */
export type LogDropReason = "backlog" | "write_error" | "reader_gone";

export const logDropReasons: readonly LogDropReason[] = ["backlog", "write_error", "reader_gone"];

/** Lines a slow reader may leave waiting: 16 MiB, some 35,000 access lines, a second or two of a busy gateway's. */
export const defaultLogBacklogBytes = 16 * 1_048_576;

export interface LogOutputCounts {
  readonly dropped: Readonly<Record<LogDropReason, number>>;
}

export class LogOutput implements LogOutputCounts {
  readonly dropped: Record<LogDropReason, number> = { backlog: 0, write_error: 0, reader_gone: 0 };
  /** Told once lines go through again after drops (the logger, which writes it here). */
  onRecovered: ((fields: Record<string, unknown>, message: string) => void) | undefined;
  private readonly stream: Socket | undefined;
  private readonly fd: number;
  private readonly maxBacklog: number;
  private gone: string | undefined;
  /** The drops not yet told of: how many, since when, why and the last error. */
  private untold: { lines: number; bytes: number; since: number; reason: LogDropReason; error: string | undefined } | undefined;
  private telling = false;

  constructor(options: { stdout?: NodeJS.WriteStream; fd?: number; maxBacklogBytes?: number } = {}) {
    const stdout = options.stdout ?? process.stdout;
    this.fd = options.fd ?? 1;
    this.maxBacklog = options.maxBacklogBytes ?? defaultLogBacklogBytes;
    // Node makes stdout a Socket for a pipe, a socket or a terminal, and a synchronous stream for a file.
    this.stream = stdout instanceof Socket ? stdout : undefined;
    // A terminal's writes Node makes blocking (tty.WriteStream), so a terminal that stops taking output (Ctrl-S, an
    // SSH session whose client went to sleep, a multiplexer's stuck pane) stopped the whole process: no call, not even
    // /healthz, was answered while it stayed stopped. Written asynchronously, its lines wait like a pipe's, within
    // the backlog, then drop. libuv opened the terminal anew for this process, so the shell's own stays as it was.
    if (stdout.isTTY === true) (stdout as unknown as { _handle?: { setBlocking?(blocking: boolean): unknown } })._handle?.setBlocking?.(false);
    // An error on stdout (EPIPE: the reader is gone) is not the process's end. A stream is closed after it; a
    // file is written here directly, each line tried anew (what failed was a write of someone else's).
    stdout.on("error", (e: NodeJS.ErrnoException) => {
      if (this.stream !== undefined) this.gone ??= e.code ?? e.message;
    });
  }

  /** pino's destination: one line a call. */
  write(line: string): boolean {
    if (this.gone !== undefined) return this.drop(line, "reader_gone", this.gone);
    if (this.stream !== undefined) {
      if (this.stream.writableLength > this.maxBacklog) return this.drop(line, "backlog", undefined);
      this.stream.write(line);
    } else {
      try {
        writeWhole(this.fd, line);
      } catch (e) {
        return this.drop(line, "write_error", (e as NodeJS.ErrnoException).code ?? (e as Error).message);
      }
    }
    if (this.untold !== undefined) this.tell();
    return true;
  }

  /** Resolves once the lines waiting for the reader are written, or `withinMs` passed: whether they were. */
  settle(withinMs: number): Promise<boolean> {
    const stream = this.stream;
    if (stream === undefined || this.gone !== undefined || stream.writableLength === 0) return Promise.resolve(true);
    return new Promise((resolve) => {
      const done = (ok: boolean) => {
        clearTimeout(timer);
        stream.off("drain", drained);
        resolve(ok);
      };
      const drained = () => done(true);
      const timer = setTimeout(() => done(false), withinMs);
      stream.on("drain", drained);
    });
  }

  private drop(line: string, reason: LogDropReason, error: string | undefined): boolean {
    this.dropped[reason] += 1;
    const u = (this.untold ??= { lines: 0, bytes: 0, since: Date.now(), reason, error });
    u.lines += 1;
    u.bytes += Buffer.byteLength(line);
    u.reason = reason;
    u.error = error ?? u.error;
    return false;
  }

  /** Says what was dropped, through the logger (which writes here: once, not again from inside). */
  private tell(): void {
    const u = this.untold;
    if (u === undefined || this.telling) return;
    this.untold = undefined;
    this.telling = true;
    try {
      const why = u.reason === "backlog" ? "the reader of stdout fell behind" : `stdout could not be written (${u.error ?? "an error"})`;
      this.onRecovered?.(
        { droppedLines: u.lines, droppedBytes: u.bytes, droppedSince: new Date(u.since).toISOString(), reason: u.reason, ...(u.error !== undefined ? { error: u.error } : {}) },
        `${u.lines} log line${u.lines === 1 ? " was" : "s were"} dropped: ${why}; calls were served meanwhile`,
      );
    } finally {
      this.telling = false;
    }
  }
}

/** Writes a whole line to a file descriptor, through short writes (a disk nearly full, a signal). */
function writeWhole(fd: number, line: string): void {
  const written = writeSync(fd, line);
  const length = written === line.length ? written : Buffer.byteLength(line);
  if (written === length) return;
  const bytes = Buffer.from(line);
  for (let at = written; at < bytes.length; ) at += writeSync(fd, bytes, at, bytes.length - at);
}
