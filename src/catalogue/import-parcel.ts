import { readCatalogueRecord } from "./catalogue-record.ts";

/**
 * A parcel: whole lines of an NDJSON import file (each ended by `\n`, but
 * perhaps the file's last), read into records. Parcels are what the import
 * hands its worker threads; reading one is the same whichever thread does it.
 */
export interface ReadParcel {
  /** Lines in the parcel, blank ones included. */
  readonly lines: number;
  /** The records read, in line order; their bytes one after another in `bytes`. */
  readonly records: readonly { readonly catalogue: string; readonly kind: string; readonly key: string; readonly obtainable: boolean; readonly length: number }[];
  readonly bytes: Uint8Array<ArrayBuffer>;
  /** Lines that cannot be imported, numbered from 1 within the parcel. */
  readonly skipped: readonly { readonly line: number; readonly message: string }[];
}

/**
 * Reads a parcel: each line is parsed and read as an import line (see
 * catalogue-record.ts); a blank line is skipped silently, a bad one is
 * reported with its line number. `first` says the parcel starts the file
 * (whose byte order mark, if any, is dropped).
 */
export function readParcel(buf: Buffer, first: boolean): ReadParcel {
  const records: ReadParcel["records"][number][] = [];
  const chunks: Uint8Array[] = [];
  const skipped: { line: number; message: string }[] = [];
  let total = 0;
  let lines = 0;
  for (let start = 0; start < buf.length; ) {
    let end = buf.indexOf(10, start);
    if (end === -1) end = buf.length;
    lines++;
    const entry = parseLine(buf, start, end, first && start === 0);
    start = end + 1;
    if (entry === undefined) continue; // a blank line
    try {
      if (entry instanceof SyntaxError) throw entry;
      const r = readCatalogueRecord(entry);
      records.push({ catalogue: r.catalogue, kind: r.kind.name, key: r.key, obtainable: r.obtainable, length: r.bytes.length });
      chunks.push(r.bytes);
      total += r.bytes.length;
    } catch (e) {
      skipped.push({ line: lines, message: (e as Error).message });
    }
  }
  // An array of its own (never a slice of Buffer's shared pool), so it can be moved to another thread.
  const bytes = new Uint8Array(total);
  let at = 0;
  for (const c of chunks) {
    bytes.set(c, at);
    at += c.length;
  }
  return { lines, records, bytes, skipped };
}

/**
 * One line, parsed: undefined when blank, its SyntaxError when not JSON.
 * A `\r` before the line's end is dropped, and so is a UTF-8 byte order
 * mark at the start of the file.
 */
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
