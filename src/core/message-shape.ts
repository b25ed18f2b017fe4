import { create, fromBinary, fromJson, mergeFromBinary, mergeFromJson, ScalarType, type DescMessage, type JsonValue, type MessageShape } from "@bufbuild/protobuf";

/**
 * Messages that V8 keeps in fast mode, for the records the cache holds.
 *
 * protobuf-es's `create` (which `fromBinary` and `fromJson` start from)
 * adds a message's fields one keyed store at a time. Past about sixteen
 * fields V8 gives up on a hidden class and keeps such an object's
 * properties in a hash table: an ItemDetail (60 fields) made that way takes
 * 3.1 KB for its table alone where its fields in place take 0.5, and every
 * creation, read and write of a field is a hash lookup. (status-block.ts
 * does the same by hand for the status block.)
 *
 * Here a message type with more fields than that gets a template of its zero
 * value, made once and kept in fast mode; a new message is a copy of it
 * (V8 copies such an object with its hidden class, in one step), with fresh
 * lists, maps, oneofs and bytes. The decoders then fill it as `fromBinary` would
 * fill `create`'s: the same message to protobuf-es, the same fields in the
 * same order (test/message-shape.test.ts).
 *
 * retained-size.ts asks `heldInPlace` to count such a message's fields as
 * slots, not as a hash table; a message changed into a hash table later
 * (a field deleted, say) would be counted short, and nothing here does that.
 */

/** Past this many properties added one by one, V8 keeps an object's properties in a hash table (retained-size.ts counts them so). */
export const maxPlacedProperties = 16;

const zeros = new WeakMap<DescMessage, (() => object) | null>();
const inPlace = new WeakSet<object>();

/** The zero-value factory of a type, or null where `create` already makes a fast object (or needs a prototype: proto2 defaults). */
function zeroFactory(desc: DescMessage): (() => object) | null {
  let factory = zeros.get(desc);
  if (factory !== undefined) return factory;
  const zero = create(desc) as Record<string, unknown>;
  factory = null;
  if (Object.getPrototypeOf(zero) === Object.prototype && desc.members.length >= maxPlacedProperties) {
    // Constants in a template made fast by JSON.parse (its objects are built with hidden classes),
    // then bigints put in place of their stand-ins: stores to existing properties keep it fast.
    const keys = Object.keys(zero);
    const fresh: { key: string; make: () => unknown }[] = [];
    const stand: Record<string, unknown> = {};
    for (const key of keys) {
      const v = zero[key];
      stand[key] = typeof v === "bigint" ? 0 : v !== null && typeof v === "object" ? null : v;
      if (v !== null && typeof v === "object") fresh.push({ key, make: freshOf(desc, key) });
    }
    const template = JSON.parse(JSON.stringify(stand)) as Record<string, unknown>;
    for (const key of keys) if (typeof zero[key] === "bigint") template[key] = zero[key];
    factory = () => {
      const m: Record<string, unknown> = { ...template };
      for (let i = 0; i < fresh.length; i++) m[fresh[i]!.key] = fresh[i]!.make();
      inPlace.add(m);
      return m;
    };
  }
  zeros.set(desc, factory);
  return factory;
}

/** A fresh value of a zero message's list, map, oneof or bytes member, by its name. */
function freshOf(desc: DescMessage, localName: string): () => unknown {
  const member = desc.members.find((m) => m.localName === localName);
  if (member?.kind === "oneof") return () => ({ case: undefined });
  if (member?.fieldKind === "list") return () => [];
  if (member?.fieldKind === "map") return () => ({});
  if (member?.fieldKind === "scalar" && member.scalar === ScalarType.BYTES) return () => new Uint8Array(0);
  throw new Error(`${desc.typeName}.${localName}: a zero message holds no other object`);
}

/** A message with every field at its zero value, as `create(desc)` makes it; in fast mode where the type has many fields. */
export function zeroMessage<D extends DescMessage>(desc: D): MessageShape<D> {
  const factory = zeroFactory(desc);
  return (factory === null ? create(desc) : factory()) as MessageShape<D>;
}

/** `fromBinary`, into a message in fast mode where the type has many fields (its nested messages are `create`'s). */
export function decodeMessage<D extends DescMessage>(desc: D, bytes: Uint8Array): MessageShape<D> {
  const factory = zeroFactory(desc);
  return factory === null ? fromBinary(desc, bytes) : mergeFromBinary(desc, factory() as MessageShape<D>, bytes);
}

/** `fromJson`, into a message in fast mode where the type has many fields. */
export function messageFromJson<D extends DescMessage>(desc: D, json: JsonValue): MessageShape<D> {
  const factory = zeroFactory(desc);
  return factory === null ? fromJson(desc, json) : mergeFromJson(desc, factory() as MessageShape<D>, json);
}

/** Whether an object was made here, its fields in place (retained-size.ts). */
export function heldInPlace(value: object): boolean {
  return inPlace.has(value);
}
