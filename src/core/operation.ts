import type { DescMessage } from "@bufbuild/protobuf";
import type { OperationContract } from "../contract/operations.ts";
import type { LegacyStatusKey } from "../contract/legacy-layout.ts";

/** An operation's own arguments, checked: every declared name, "" when not sent. */
export type Args = Readonly<Record<string, string>>;

/**
 * A form of record the embedded catalogue stores, named as the import format
 * names it (`"kind": "item_detail"`). Several operations may read one kind
 * (item detail records serve `item_get` in every catalogue).
 */
export interface RecordKind<S = unknown> {
  /** The import line's `kind`. */
  readonly name: string;
  /** The stored bytes are this message. */
  readonly schema: DescMessage;
  /** The catalogue of an import line that names none. */
  readonly defaultCatalogue: string;
  /**
   * One import line (a JSON object) as the record to store, under its key.
   * Throws an Error whose message says what is wrong with the line.
   */
  read(line: Readonly<Record<string, unknown>>): { readonly key: string; readonly bytes: Uint8Array; readonly obtainable: boolean };
  /** Example arguments for the first usable record of a list of import lines, or undefined. */
  example?(lines: readonly Readonly<Record<string, unknown>>[], catalogue: string): Readonly<Record<string, string>> | undefined;
}

/**
 * One operation, whole: its contract (RPC method, legacy path, arguments,
 * answer shape) and everything the gateway does differently for it. The
 * core, the cache, the renderers, the transports, the stores and the import
 * read these fields; none of them names an operation. `T` is the answer's
 * `item` (a record or a list), `S` the stored record it is made from.
 */
export interface Operation<T = unknown, S = unknown> extends OperationContract {
  /** Top-level keys of a successful legacy response, in wire order (legacy-layout.ts). */
  readonly legacyLayout: readonly ("item" | LegacyStatusKey)[];
  /** How long a found answer is fresh by default, in seconds (GATEWAY_CACHE_TTL_SECONDS overrides it). */
  readonly ttlSeconds: number;
  /** What the embedded catalogue stores for it, and under which key. */
  readonly record: RecordKind<S>;
  recordKey(args: Args): string;
  /** The answer from a stored record, or why there is none (a real 2000). `record` is the caller's own fresh copy: it may be changed and kept. */
  answer(record: S, args: Args): { readonly value: T } | { readonly notFound: string };
  /** Reasons of a 2000: no such record (or the source has none), and a record that cannot be obtained. */
  notFound(args: Args): string;
  unobtainable(args: Args): string;
  /** The arguments an upstream provider is sent. */
  upstreamArgs(args: Args): Record<string, string>;
  /** A copy of the answer with each translatable text passed through `t`; numbers, ids and URLs untouched. */
  translate(value: T, t: (text: string) => string): T;
  /** The status block's `last_id`. */
  lastId(value: T): string;
  /** Example arguments from the demo catalogue's import lines (for the start-up banner). */
  example(lines: readonly Readonly<Record<string, unknown>>[]): Readonly<Record<string, string>> | undefined;
}
