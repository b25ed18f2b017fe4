import { createReadStream } from "node:fs";
import { availableParallelism } from "node:os";
import { Worker } from "node:worker_threads";
import type { CatalogueStore, StoredRecord } from "../core/catalogue-store.ts";
import { recordKinds } from "../operations/index.ts";
import type { ImportReport } from "./catalogue-import.ts";
import { readParcel, type ReadParcel } from "./import-parcel.ts";

export interface FileImportOptions {
  /** Unix seconds written as the records' store time. */
  readonly storedAt: number;
  /** Threads that parse and read the lines beside this one; 0 reads them on this thread. Default: one a core, at most four. */
  readonly workers?: number;
  /** Called after each transaction, with the lines and bytes of the file done so far. */
  readonly onProgress?: (done: { readonly lines: number; readonly bytes: number }) => void;
  /** A longer line is reported and skipped unread (default 16 MiB; a demo record is about 6 kB). */
  readonly maxLineBytes?: number;
}

export const defaultMaxLineBytes = 16 << 20;

/** Records written a transaction, at least (a parcel's records are never split). */
const batchRecords = 500;

/** The file is cut into parcels of about this many bytes, at line ends (a longer line makes its parcel longer). */
const parcelBytes = 1 << 20;

export function defaultImportWorkers(): number {
  return Math.min(4, availableParallelism());
}

/**
 * Imports an NDJSON file into the catalogue, streaming: the file is read in
 * parcels of whole lines; worker threads parse and read them (JSON, checks,
 * protobuf bytes: most of an import's time) while this thread writes the
 * records, 500 or more a transaction, in the file's order, so a later line
 * for the same key wins as it always did. A bad line is reported with its
 * line number and skipped. At most two parcels a worker are in flight, and
 * a line longer than `maxLineBytes` is skipped without being held, so memory
 * stays flat whatever the file holds.
 */
export async function importFile(catalogue: CatalogueStore, path: string, options: FileImportOptions): Promise<ImportReport> {
  const readers = new ParcelReaders(options.workers ?? defaultImportWorkers());
  const endBulk = catalogue.beginBulk?.();
  const pending: { read: Promise<ReadParcel>; size: number }[] = [];
  const skipped: { line: number; message: string }[] = [];
  let imported = 0;
  let lines = 0;
  let bytes = 0;
  let batch: StoredRecord[] = [];
  const flush = async () => {
    if (batch.length > 0) await catalogue.storeBatch(batch, options.storedAt);
    imported += batch.length;
    batch = [];
    options.onProgress?.({ lines, bytes });
  };
  const writeOldest = async () => {
    const { read, size } = pending.shift()!;
    const parcel = await read;
    let at = 0;
    for (const r of parcel.records) {
      batch.push({ kind: recordKinds.get(r.kind)!, catalogue: r.catalogue, key: r.key, obtainable: r.obtainable, bytes: parcel.bytes.subarray(at, at + r.length) });
      at += r.length;
    }
    for (const s of parcel.skipped) skipped.push({ line: lines + s.line, message: s.message });
    lines += parcel.lines;
    bytes += size;
    if (batch.length >= batchRecords) await flush();
  };
  try {
    const maxLine = options.maxLineBytes ?? defaultMaxLineBytes;
    let first = true;
    for await (const piece of piecesOf(path, maxLine)) {
      if ("overlong" in piece) {
        const message = `the line is ${piece.overlong} bytes long, more than the ${maxLine} bytes a line may have; skipped unread`;
        pending.push({ read: Promise.resolve({ lines: 1, records: [], bytes: new Uint8Array(0), skipped: [{ line: 1, message }] }), size: piece.overlong });
      } else {
        const size = piece.lines.length; // read before the parcel is moved to a worker
        const read = readers.read(piece.lines, first);
        read.catch(() => {}); // awaited in turn; a failure before then is not unhandled
        pending.push({ read, size });
      }
      first = false;
      while (pending.length >= readers.capacity) await writeOldest();
    }
    while (pending.length > 0) await writeOldest();
    await flush();
  } finally {
    await Promise.all([readers.close(), endBulk?.()]);
  }
  return { imported, skipped };
}

/**
 * The file in pieces: parcels of whole lines (about `parcelBytes` each; the
 * file's last line may lack its newline), or, for a line longer than
 * `maxLine` bytes, its length alone (with its newline): such a line is
 * dropped as it is read, never held whole. The start of a line that runs
 * past a chunk is kept as a list of chunks and joined once.
 */
async function* piecesOf(path: string, maxLine: number): AsyncGenerator<{ readonly lines: Buffer<ArrayBuffer> } | { readonly overlong: number }> {
  let tail: Buffer[] = [];
  let tailBytes = 0;
  /** Bytes of an overlong line dropped so far, until its newline; 0 when none is being dropped. */
  let dropping = 0;
  for await (const chunk of createReadStream(path, { highWaterMark: parcelBytes }) as AsyncIterable<Buffer>) {
    let from = 0;
    if (dropping > 0) {
      const end = chunk.indexOf(10);
      if (end < 0) {
        dropping += chunk.length;
        continue;
      }
      yield { overlong: dropping + end + 1 };
      dropping = 0;
      from = end + 1;
    }
    const firstEnd = chunk.indexOf(10, from);
    if (firstEnd < 0) {
      tail.push(chunk.subarray(from));
      tailBytes += chunk.length - from;
      if (tailBytes > maxLine) {
        dropping = tailBytes;
        tail = [];
        tailBytes = 0;
      }
      continue;
    }
    // Only the line that began in an earlier chunk can be longer than a chunk.
    if (tailBytes + firstEnd - from > maxLine) {
      yield { overlong: tailBytes + firstEnd - from + 1 };
      tail = [];
      tailBytes = 0;
      from = firstEnd + 1;
    }
    const last = chunk.lastIndexOf(10);
    if (last >= from) {
      const lines = chunk.subarray(from, last + 1);
      yield { lines: joined([...tail, lines]) };
      tail = [];
      tailBytes = 0;
      from = last + 1;
    }
    if (from < chunk.length) {
      tail.push(chunk.subarray(from));
      tailBytes += chunk.length - from;
    }
  }
  if (dropping > 0) yield { overlong: dropping };
  else if (tailBytes > 0) yield { lines: joined(tail) };
}

/** The pieces copied once into a buffer of their own (never a view of the stream's, nor of Buffer's shared pool), so a worker can be given it. */
function joined(pieces: readonly Buffer[]): Buffer<ArrayBuffer> {
  const own = new Uint8Array(pieces.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of pieces) {
    own.set(p, at);
    at += p.length;
  }
  return Buffer.from(own.buffer);
}

/** Parcel readers: worker threads taking parcels in turn (each answers its own in order), or this thread. */
class ParcelReaders {
  private readonly workers: { readonly worker: Worker; readonly waiting: { resolve(r: ReadParcel): void; reject(e: unknown): void }[] }[] = [];
  private turn = 0;
  /** Parcels worth having in flight. */
  readonly capacity: number;

  constructor(count: number) {
    for (let i = 0; i < count; i++) {
      const worker = new Worker(new URL("./import-worker.ts", import.meta.url));
      const entry = { worker, waiting: [] as ParcelReaders["workers"][number]["waiting"] };
      worker.on("message", (read: ReadParcel) => entry.waiting.shift()?.resolve(read));
      const fail = (e: unknown) => {
        for (const w of entry.waiting.splice(0)) w.reject(e);
      };
      worker.on("error", fail);
      worker.on("exit", (code) => fail(new Error(`an import worker stopped (exit code ${code})`)));
      this.workers.push(entry);
    }
    this.capacity = 2 * Math.max(1, count);
  }

  /** Reads `parcel`, which must have a buffer of its own: it is moved to the worker, not copied. */
  read(parcel: Buffer<ArrayBuffer>, first: boolean): Promise<ReadParcel> {
    if (this.workers.length === 0) {
      try {
        return Promise.resolve(readParcel(parcel, first));
      } catch (e) {
        return Promise.reject(e);
      }
    }
    const entry = this.workers[this.turn++ % this.workers.length]!;
    return new Promise((resolve, reject) => {
      entry.waiting.push({ resolve, reject });
      entry.worker.postMessage({ parcel, first }, [parcel.buffer]);
    });
  }

  async close(): Promise<void> {
    await Promise.all(this.workers.map((w) => w.worker.terminate()));
  }
}
