import { hash } from "node:crypto";
import type { CatalogueSource, Found, NotFound } from "./catalogue-source.ts";
import { decodeMessage } from "./message-shape.ts";
import type { Args, Operation, RecordKind } from "./operation.ts";

/** A record ready to store: its kind, catalogue and key, as the import reads them. */
export interface StoredRecord {
  readonly kind: RecordKind;
  readonly catalogue: string;
  readonly key: string;
  /** The record in its stored form: the kind's protobuf message, serialized. */
  readonly bytes: Uint8Array;
  readonly obtainable: boolean;
}

/**
 * A catalogue the gateway holds itself (as opposed to an upstream provider):
 * a source of answers and the place imports write to.
 */
export interface CatalogueStore extends CatalogueSource {
  /** Writes the records stamped with `storedAt` (Unix seconds), in one transaction: all land or none. */
  storeBatch(records: readonly StoredRecord[], storedAt: number): Promise<void>;
  /**
   * Readies the store for a long run of `storeBatch` calls (an import), if it
   * has a faster way to take them; the answer ends that run and must be
   * called, whatever happens. Batches are as atomic and durable either way.
   */
  beginBulk?(): () => Promise<void>;
  /** Whether it holds no record at all. */
  empty(): Promise<boolean>;
  /** Records held, per `<catalogue>/<kind>`. */
  size(): Promise<Map<string, number>>;
}

/**
 * A stored record's row as the answer to one call, the same way in every
 * store: no row or an unobtainable one is a 2000 with the operation's
 * reason; otherwise the operation makes its answer from the decoded record.
 * The token names the entry by operation, arguments and store time, so it is
 * the same whichever store holds the record.
 */
export function storedAnswer(
  operation: Operation,
  args: Args,
  row: { readonly record: Uint8Array; readonly obtainable: boolean; readonly storedAt: number } | undefined,
): Found | NotFound {
  if (row === undefined) return { found: false, reason: operation.notFound(args) };
  if (!row.obtainable) return { found: false, reason: operation.unobtainable(args) };
  const answer = operation.answer(decodeMessage(operation.record.schema, row.record), args);
  if ("notFound" in answer) return { found: false, reason: answer.notFound };
  const token = hash("md5", [operation.id, ...operation.args.map((a) => args[a.name] ?? ""), row.storedAt].join("\u0000"));
  return { found: true, value: answer.value, storedAt: row.storedAt, token };
}
