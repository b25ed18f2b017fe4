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
  /** Called after each parcel is written, with the lines and bytes of the file done so far. */
  readonly onProgress?: (done: { readonly lines: number; readonly bytes: number }) => void;
}

/** Records written a transaction, at least (a parcel's records are never split). */
const batchRecords = 500;

/** The file is cut into parcels of about this many bytes, at line ends (a longer line is a parcel of its own). */
const parcelBytes = 1 << 20;

export function defaultImportWorkers(): number {
  return Math.min(4, availableParallelism());
}

/**
 * Imports an NDJSON file into the catalogue, streaming: the file is read in
 * parcels of whole lines; worker threads parse and read them (JSON, checks,
 * protobuf bytes: most of an import's time) while this thread writes the
 * records, one transaction a parcel, in the file's order, so a later line
 * for the same key wins as it always did. A bad line is reported with its
 * line number and skipped. At most two parcels a worker are in flight, so
 * memory stays flat whatever the file's size.
 */
export async function importFile(catalogue: CatalogueStore, path: string, options: FileImportOptions): Promise<ImportReport> {
  const readers = new ParcelReaders(options.workers ?? defaultImportWorkers());
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
    let rest: Buffer | undefined;
    let first = true;
    const send = (parcel: Buffer) => {
      const read = readers.read(parcel, first);
      read.catch(() => {}); // awaited in turn; a failure before then is not unhandled
      pending.push({ read, size: parcel.length });
      first = false;
    };
    for await (const chunk of createReadStream(path, { highWaterMark: parcelBytes }) as AsyncIterable<Buffer>) {
      const buf = rest === undefined ? chunk : Buffer.concat([rest, chunk]);
      const cut = buf.lastIndexOf(10) + 1;
      rest = cut < buf.length ? buf.subarray(cut) : undefined;
      if (cut > 0) send(buf.subarray(0, cut));
      while (pending.length >= readers.capacity) await writeOldest();
    }
    if (rest !== undefined) send(rest);
    while (pending.length > 0) await writeOldest();
    await flush();
  } finally {
    await readers.close();
  }
  return { imported, skipped };
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

  read(parcel: Buffer, first: boolean): Promise<ReadParcel> {
    if (this.workers.length === 0) {
      try {
        return Promise.resolve(readParcel(parcel, first));
      } catch (e) {
        return Promise.reject(e);
      }
    }
    const entry = this.workers[this.turn++ % this.workers.length]!;
    // A copy with a buffer of its own, moved (not copied again) to the worker.
    const own = new Uint8Array(parcel);
    return new Promise((resolve, reject) => {
      entry.waiting.push({ resolve, reject });
      entry.worker.postMessage({ parcel: own, first }, [own.buffer]);
    });
  }

  async close(): Promise<void> {
    await Promise.all(this.workers.map((w) => w.worker.terminate()));
  }
}
