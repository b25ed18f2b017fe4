import { createReadStream } from "node:fs";
import type { CatalogueStore } from "../core/catalogue-store.ts";
import { readCatalogueRecord } from "./catalogue-record.ts";

export interface ImportReport {
  readonly imported: number;
  /** Lines that were skipped, with their 1-based line numbers. */
  readonly skipped: readonly { readonly line: number; readonly message: string }[];
}

export interface ImportOptions {
  /** Unix seconds written as the records' store time. */
  readonly storedAt: number;
  /** Called after every batch with the number of lines read so far. */
  readonly onProgress?: (linesRead: number) => void;
  /** Records written per transaction. */
  readonly batchSize?: number;
}

/**
 * Writes records into the embedded catalogue. A record that fails validation
 * is reported with its line number and skipped; every other one is written.
 * Writes go in batches, one transaction each.
 */
export async function importRecords(
  catalogue: CatalogueStore,
  lines: AsyncIterable<unknown> | Iterable<unknown>,
  options: ImportOptions,
): Promise<ImportReport> {
  const batchSize = options.batchSize ?? 500;
  const skipped: { line: number; message: string }[] = [];
  let imported = 0;
  let lineNo = 0;
  let batch: ReturnType<typeof readCatalogueRecord>[] = [];
  const flush = async () => {
    await catalogue.storeBatch(batch, options.storedAt);
    imported += batch.length;
    batch = [];
    options.onProgress?.(lineNo);
  };
  for await (const entry of lines) {
    lineNo++;
    if (entry === undefined) continue; // a blank line
    try {
      if (entry instanceof SyntaxError) throw entry;
      batch.push(readCatalogueRecord(entry));
    } catch (e) {
      skipped.push({ line: lineNo, message: (e as Error).message });
    }
    if (batch.length >= batchSize) await flush();
  }
  await flush();
  return { imported, skipped };
}

/**
 * The lines of an NDJSON file, parsed: a blank line yields undefined and a
 * line that is not JSON yields its SyntaxError, so line numbers stay exact.
 * Lines end at `\n` (a `\r` before it is dropped, as is a UTF-8 byte order
 * mark at the start). `onBytes` hears how many bytes of the file have been
 * read. The file is read as bytes in large chunks and each line decoded on
 * its own: no per-chunk text decoder, no line reader in between.
 */
export async function* readNdjson(path: string, onBytes?: (bytes: number) => void): AsyncGenerator<unknown> {
  let rest: Buffer | undefined;
  let bytes = 0;
  for await (const chunk of createReadStream(path, { highWaterMark: 1 << 20 }) as AsyncIterable<Buffer>) {
    const buf = rest === undefined ? chunk : Buffer.concat([rest, chunk]);
    let start = 0;
    for (let end = buf.indexOf(10); end !== -1; end = buf.indexOf(10, start)) {
      bytes += end + 1 - start;
      onBytes?.(bytes);
      yield parseLine(buf, start, end, bytes === end + 1 - start);
      start = end + 1;
    }
    rest = start < buf.length ? buf.subarray(start) : undefined;
  }
  if (rest !== undefined) {
    onBytes?.(bytes + rest.length);
    yield parseLine(rest, 0, rest.length, bytes === 0);
  }
}

function parseLine(buf: Buffer, start: number, end: number, first: boolean): unknown {
  if (end > start && buf[end - 1] === 13) end--;
  if (first && end - start >= 3 && buf[start] === 0xef && buf[start + 1] === 0xbb && buf[start + 2] === 0xbf) start += 3;
  const line = buf.toString("utf8", start, end);
  if (line.trim() === "") return undefined;
  try {
    return JSON.parse(line);
  } catch (e) {
    return new SyntaxError(`not JSON: ${(e as Error).message}`);
  }
}
