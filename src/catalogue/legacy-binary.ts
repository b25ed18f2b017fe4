import { ScalarType, type DescField, type DescMessage } from "@bufbuild/protobuf";
import { WireType } from "@bufbuild/protobuf/wire";
import { ByteSink } from "./byte-sink.ts";
import { isObject } from "./legacy-message.ts";

/**
 * The short way from a legacy record (an import line's parsed object) to
 * the protobuf bytes the catalogue stores, for the common case: a complete
 * record whose every value has the plain JSON type of its field. It walks
 * the object once and writes the bytes, where the general reader (drop
 * PHP's empty arrays, protobuf's JSON reader, the completeness check,
 * protobuf's binary writer) makes two copies and walks the record four
 * times.
 *
 * Anything off that path answers undefined, and the caller takes the
 * general reader, which accepts what it accepts and says what is wrong with
 * the rest: a missing field, an unknown key, a field named twice, a number
 * given as text where an integer is due, a null (but for a field declared
 * `optional`), a type the records do not use. When it answers, its bytes
 * are the general reader's, byte for byte (test/legacy-binary.test.ts holds
 * the two together).
 */
export function legacyBinary(desc: DescMessage, value: unknown): Uint8Array | undefined {
  if (!isObject(value)) return undefined;
  return written((w) => writeMessage(planOf(desc), w, value));
}

const sink = new ByteSink();

/** What `write` writes into the (reset) sink, or undefined when it answers false or throws. */
function written(write: (w: ByteSink) => boolean): Uint8Array | undefined {
  try {
    return write(sink.reset()) ? sink.finish() : undefined;
  } catch {
    return undefined; // a text protobuf cannot write (a lone surrogate): the general reader says so
  }
}

/**
 * The bytes of a message that holds only `list`, a repeated message field,
 * its elements the legacy records `values`, each taken the short way; or
 * undefined when any of them is off the short path.
 */
export function legacyBinaryList(list: DescField, values: readonly unknown[]): Uint8Array | undefined {
  if (list.fieldKind !== "list" || list.listKind !== "message") return undefined;
  let write = listWriters.get(list);
  if (write === undefined) listWriters.set(list, (write = writerOf(list)));
  return written((w) => write(w, values));
}

const listWriters = new WeakMap<DescField, WriteValue>();

/** Writes one value of a field, tag included; false when the value is off the short path. */
type WriteValue = (w: ByteSink, v: unknown) => boolean;

interface FieldPlan {
  readonly name: string;
  /** The JSON name, when it differs from the field name: legacy records use either (`brandId`, `num_iid`). */
  readonly otherName: string | undefined;
  /** Declared `optional`: may be left out or null. */
  readonly optional: boolean;
  readonly write: WriteValue;
}

type Plan = FieldPlan[];

const plans = new WeakMap<DescMessage, Plan>();

function planOf(desc: DescMessage): Plan {
  let plan = plans.get(desc);
  if (plan === undefined) {
    plan = [];
    // Registered before its fields, so a message that holds itself resolves to this plan.
    plans.set(desc, plan);
    // In field-number order, as protobuf's binary writer writes them.
    for (const field of [...desc.fields].sort((a, b) => a.number - b.number)) {
      plan.push({
        name: field.name,
        otherName: field.jsonName === field.name ? undefined : field.jsonName,
        optional: field.proto.proto3Optional === true,
        write: writerOf(field),
      });
    }
  }
  return plan;
}

function writeMessage(plan: Plan, w: ByteSink, value: Record<string, unknown>): boolean {
  let seen = 0;
  for (const field of plan) {
    let v = value[field.name];
    if (v === undefined && field.otherName !== undefined) v = value[field.otherName];
    if (v === undefined) {
      if (!field.optional) return false;
      continue;
    }
    seen++;
    if (v === null) {
      if (!field.optional) return false;
      continue;
    }
    if (!field.write(w, v)) return false;
  }
  // A key the plan did not read: unknown, or a field named twice.
  let keys = 0;
  for (const _ in value) keys++;
  return keys === seen;
}

const offPath: WriteValue = () => false;

function writerOf(field: DescField): WriteValue {
  const no = field.number;
  const optional = field.proto.proto3Optional === true;
  if (field.oneof !== undefined) return offPath;
  switch (field.fieldKind) {
    case "scalar":
      return scalarWriter(field.scalar, no, optional);
    case "message": {
      if (field.delimitedEncoding || field.message.typeName.startsWith("google.protobuf.")) return offPath;
      const desc = field.message;
      return (w, v) => {
        if (Array.isArray(v)) return v.length === 0; // PHP's empty array: the message is unset
        if (!isObject(v)) return false;
        w.tag(no, WireType.LengthDelimited).fork();
        if (!writeMessage(planOf(desc), w, v)) return false;
        w.join();
        return true;
      };
    }
    case "list": {
      if (field.listKind === "message") {
        if (field.delimitedEncoding || field.message.typeName.startsWith("google.protobuf.")) return offPath;
        const desc = field.message;
        return (w, v) => {
          if (!Array.isArray(v)) return false;
          for (const e of v) {
            if (!isObject(e)) return false;
            w.tag(no, WireType.LengthDelimited).fork();
            if (!writeMessage(planOf(desc), w, e)) return false;
            w.join();
          }
          return true;
        };
      }
      if (field.listKind === "scalar" && field.scalar === ScalarType.STRING) {
        return (w, v) => {
          if (!Array.isArray(v)) return false;
          for (const e of v) {
            if (typeof e !== "string") return false;
            w.tag(no, WireType.LengthDelimited).string(e);
          }
          return true;
        };
      }
      return offPath;
    }
    case "map": {
      if (field.mapKey !== ScalarType.STRING || field.mapKind !== "scalar" || field.scalar !== ScalarType.STRING) return offPath;
      return (w, v) => {
        if (Array.isArray(v)) return v.length === 0; // PHP's empty array: the map is empty
        if (!isObject(v)) return false;
        for (const key of Object.keys(v)) {
          const e = v[key];
          if (typeof e !== "string") return false;
          w.tag(no, WireType.LengthDelimited).fork().tag(1, WireType.LengthDelimited).string(key).tag(2, WireType.LengthDelimited).string(e).join();
        }
        return true;
      };
    }
    default:
      return offPath;
  }
}

/**
 * A scalar as protobuf's JSON reader takes it, on the short path: a string;
 * a double as a number or decimal text without spaces (never NaN or
 * infinity); an int32 as an integral number in range; a boolean. Proto3's
 * implicit presence: a zero value is not written unless the field is
 * declared `optional`.
 */
function scalarWriter(type: ScalarType, no: number, optional: boolean): WriteValue {
  switch (type) {
    case ScalarType.STRING:
      return (w, v) => {
        if (typeof v !== "string") return false;
        if (optional || v !== "") w.tag(no, WireType.LengthDelimited).string(v);
        return true;
      };
    case ScalarType.DOUBLE:
      return (w, v) => {
        const x = doubleOf(v);
        if (x === undefined) return false;
        if (optional || !Object.is(x, 0)) w.tag(no, WireType.Bit64).double(x);
        return true;
      };
    case ScalarType.INT32:
      return (w, v) => {
        if (typeof v !== "number" || !Number.isInteger(v) || v < -0x80000000 || v > 0x7fffffff) return false;
        if (optional || v !== 0) w.tag(no, WireType.Varint).int32(v);
        return true;
      };
    case ScalarType.BOOL:
      return (w, v) => {
        if (typeof v !== "boolean") return false;
        if (optional || v) w.tag(no, WireType.Varint).bool(v);
        return true;
      };
    default:
      return offPath;
  }
}

function doubleOf(v: unknown): number | undefined {
  if (typeof v === "number") return v;
  if (typeof v !== "string" || v === "" || v.trim().length !== v.length) return undefined;
  const x = Number(v);
  return Number.isFinite(x) ? x : undefined;
}
