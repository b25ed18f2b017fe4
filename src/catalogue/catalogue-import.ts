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
