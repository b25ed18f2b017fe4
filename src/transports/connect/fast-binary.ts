import { ScalarType, toBinary, type DescField, type DescMessage, type Message } from "@bufbuild/protobuf";

/**
 * A message written to the protobuf binary format as `toBinary` writes it,
 * byte for byte, for the message shapes a status block has: strings,
 * booleans, doubles, 32- and 64-bit integers, enums, proto3 `optional`,
 * string-to-string maps and singular messages of the same shapes. It writes
 * into one reused buffer, each string with a single native call, where
 * `toBinary` forks a writer per nested message and encodes each string on
 * its own; a status block is written once per RPC answer.
 *
 * A message of any other shape, or one carrying unknown fields, is written
 * by `toBinary` itself. test/fast-binary.test.ts compares the two over
 * random messages.
 */
export function fastToBinary(desc: DescMessage, message: Message): Uint8Array {
  const write = writerOf(desc);
  if (write === undefined || hasUnknown(message)) return toBinary(desc, message);
  at = 0;
  try {
    write(message as unknown as Record<string, unknown>);
  } catch (e) {
    if (e instanceof Unsupported) return toBinary(desc, message);
    throw e;
  }
  return Buffer.from(scratch.subarray(0, at));
}

const hasUnknown = (message: unknown) => (message as { $unknown?: unknown }).$unknown !== undefined;

/** The bytes of one length-delimited field holding `message`: its tag, its length, the message as fastToBinary writes it. */
export function fastMessageField(fieldNo: number, desc: DescMessage, message: Message): Uint8Array {
  const body = fastToBinary(desc, message);
  const out = Buffer.allocUnsafe(varintSize(fieldNo * 8 + 2) + varintSize(body.byteLength) + body.byteLength);
  let p = putVarint(out, 0, fieldNo * 8 + 2);
  p = putVarint(out, p, body.byteLength);
  out.set(body, p);
  return out;
}

type Writer = (message: Record<string, unknown>) => void;

let scratch = Buffer.allocUnsafe(16 * 1024);
let at = 0;

function reserve(n: number): void {
  if (at + n <= scratch.length) return;
  const bigger = Buffer.allocUnsafe(Math.max(2 * scratch.length, at + n));
  scratch.copy(bigger, 0, 0, at);
  scratch = bigger;
}

/** An unsigned varint of up to 2^53 written at `p`, without growing the buffer; returns where it ends. */
function putVarint(buf: Buffer, p: number, v: number): number {
  while (v > 127) {
    buf[p++] = (v % 128) | 128;
    v = Math.floor(v / 128);
  }
  buf[p++] = v;
  return p;
}

function varint(v: number): void {
  reserve(10);
  at = putVarint(scratch, at, v);
}

function varintSize(v: number): number {
  let n = 1;
  while (v > 127) {
    v = Math.floor(v / 128);
    n++;
  }
  return n;
}

/** A 64-bit varint: negative values as their two's complement, ten bytes. */
function varint64(v: bigint): void {
  let u = BigInt.asUintN(64, v);
  reserve(10);
  while (u > 127n) {
    scratch[at++] = Number(u & 127n) | 128;
    u >>= 7n;
  }
  scratch[at++] = Number(u);
}

/** An int32 or enum value: a negative one is sign-extended to 64 bits, as protobuf writes it. */
function int32(v: number): void {
  if (v >= 0) varint(v);
  else varint64(BigInt(v));
}

function tag(fieldNo: number, wireType: number): void {
  varint(fieldNo * 8 + wireType);
}

/**
 * A length-delimited part: `body` writes it after one byte kept for its
 * length (its length is not known before), and it is moved along when the
 * length needs more bytes than one.
 */
function delimited(body: () => void): void {
  reserve(1);
  const start = at + 1;
  at = start;
  body();
  const length = at - start;
  if (length < 128) {
    scratch[start - 1] = length;
    return;
  }
  const size = varintSize(length);
  reserve(size - 1);
  scratch.copyWithin(start - 1 + size, start, at);
  at = putVarint(scratch, start - 1, length) + length;
}

function string(s: string): void {
  // A UTF-16 unit is at most three bytes of UTF-8.
  reserve(3 * s.length + 10);
  const start = at + 1;
  const length = scratch.write(s, start, "utf8");
  if (length < 128) {
    scratch[at] = length;
    at = start + length;
    return;
  }
  scratch.copyWithin(at + varintSize(length), start, start + length);
  at = putVarint(scratch, at, length) + length;
}

const writers = new WeakMap<DescMessage, Writer | null>();

function writerOf(desc: DescMessage): Writer | undefined {
  let w = writers.get(desc);
  if (w === undefined) {
    writers.set(desc, null); // a message that holds itself is not a status block's shape
    w = compile(desc);
    writers.set(desc, w);
  }
  return w ?? undefined;
}

/** The writer of a message of a supported shape (fields in number order, as toBinary writes them), else null. */
function compile(desc: DescMessage): Writer | null {
  const fields: Writer[] = [];
  for (const field of [...desc.fields].sort((a, b) => a.number - b.number)) {
    if (field.oneof !== undefined) return null;
    const w = fieldWriter(field);
    if (w === null) return null;
    fields.push(w);
  }
  return (message) => {
    for (let i = 0; i < fields.length; i++) fields[i]!(message);
  };
}

function fieldWriter(field: DescField): Writer | null {
  const name = field.localName;
  const no = field.number;
  switch (field.fieldKind) {
    case "enum":
      if (field.presence !== 2 /* IMPLICIT */) return null;
      return (m) => {
        const v = m[name] as number;
        if (v !== 0) {
          tag(no, 0);
          int32(v);
        }
      };
    case "message": {
      const child = writerOf(field.message);
      if (child === undefined) return null;
      return (m) => {
        const v = m[name] as Record<string, unknown> | undefined;
        if (v === undefined) return;
        if (hasUnknown(v)) throw new Unsupported();
        tag(no, 2);
        delimited(() => child(v));
      };
    }
    case "map":
      if (field.mapKey !== ScalarType.STRING || field.mapKind !== "scalar" || field.scalar !== ScalarType.STRING) return null;
      return (m) => {
        const record = m[name] as Record<string, string>;
        for (const key of Object.keys(record)) {
          tag(no, 2);
          const value = record[key]!;
          delimited(() => {
            tag(1, 2);
            string(key);
            tag(2, 2);
            string(value);
          });
        }
      };
    case "scalar": {
      const write = scalarWriter(field.scalar, no);
      if (write === null) return null;
      // proto3 `optional`: written when set, whatever its value; otherwise when not its zero value.
      if (field.presence === 1 /* EXPLICIT */) {
        return (m) => {
          const v = m[name];
          if (v !== undefined && Object.hasOwn(m, name)) write(v);
        };
      }
      if (field.presence !== 2 /* IMPLICIT */) return null;
      switch (field.scalar) {
        case ScalarType.STRING:
          return (m) => {
            const v = m[name];
            if (v !== "") write(v);
          };
        case ScalarType.BOOL:
          return (m) => {
            const v = m[name];
            if (v !== false) write(v);
          };
        case ScalarType.DOUBLE:
          return (m) => {
            const v = m[name];
            if (!Object.is(v, 0)) write(v);
          };
        default:
          return (m) => {
            const v = m[name];
            // Loose, as toBinary's check: 0, 0n and "0" are all zero.
            if (v != 0) write(v);
          };
      }
    }
    default:
      return null;
  }
}

function scalarWriter(type: ScalarType, no: number): ((v: unknown) => void) | null {
  switch (type) {
    case ScalarType.STRING:
      return (v) => {
        tag(no, 2);
        string(v as string);
      };
    case ScalarType.BOOL:
      return (v) => {
        tag(no, 0);
        reserve(1);
        scratch[at++] = v ? 1 : 0;
      };
    case ScalarType.DOUBLE:
      return (v) => {
        tag(no, 1);
        reserve(8);
        scratch.writeDoubleLE(v as number, at);
        at += 8;
      };
    case ScalarType.INT32:
      return (v) => {
        tag(no, 0);
        int32(v as number);
      };
    case ScalarType.UINT32:
      return (v) => {
        tag(no, 0);
        varint((v as number) >>> 0);
      };
    case ScalarType.INT64:
      return (v) => {
        tag(no, 0);
        varint64(BigInt(v as bigint | string | number));
      };
    default:
      return null;
  }
}

/** A nested message with unknown fields: the whole message goes to toBinary. */
class Unsupported extends Error {}
