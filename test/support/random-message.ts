// Random protobuf messages of any type, for tests that hold a writer of records to the generic one:
// every field kind the records use (strings of every sort of character, floats from -0 to 1e300,
// integers of both signs, enums, proto3 `optional`, maps, lists, nested messages set and unset).
import { create, ScalarType, type DescField, type DescMessage, type Message } from "@bufbuild/protobuf";
import { random } from "./random-status.ts";

export { random };

const alphabet = ["a", "Z", "0", " ", "/", "\\", '"', "\u0000", "\n", "\u001f", "\u007f", "\u00e9", "\u4e2d", "\u6587", "\u2028", "\u2029", "\ud83d\ude00", "\ud800", "\udc00", "\uffff"];

function text(r: () => number): string {
  const pick = r();
  if (pick < 0.2) return "";
  const length = pick < 0.7 ? Math.floor(r() * 20) : pick < 0.95 ? 30 + Math.floor(r() * 300) : 2000 + Math.floor(r() * 5000);
  // Mostly plain ASCII (a long plain text takes the writers' native path), sometimes anything.
  const plain = r() < 0.4;
  let out = "";
  for (let i = 0; i < length; i++) out += alphabet[Math.floor(r() * (plain ? 5 : alphabet.length))];
  return out;
}

function double(r: () => number): number {
  const pick = r();
  if (pick < 0.2) return 0;
  if (pick < 0.25) return -0;
  if (pick < 0.4) return Math.round(r() * 1e4) / 100;
  if (pick < 0.5) return r() * 1e-5;
  if (pick < 0.6) return -r() * 1e300;
  if (pick < 0.7) return Math.floor(r() * 1e6);
  return (r() - 0.5) * 1e20;
}

function scalar(type: ScalarType, r: () => number): unknown {
  switch (type) {
    case ScalarType.STRING:
      return text(r);
    case ScalarType.DOUBLE:
      return double(r);
    case ScalarType.FLOAT:
      return Math.fround(double(r) % 3e38);
    case ScalarType.BOOL:
      return r() < 0.5;
    case ScalarType.BYTES:
      return Uint8Array.from({ length: Math.floor(r() * 12) }, () => Math.floor(r() * 256));
    case ScalarType.INT64:
    case ScalarType.SINT64:
    case ScalarType.SFIXED64:
      return BigInt(Math.floor((r() - 0.5) * 2 ** 53)) * (r() < 0.2 ? 1000n : 1n);
    case ScalarType.UINT64:
    case ScalarType.FIXED64:
      return BigInt(Math.floor(r() * 2 ** 53));
    case ScalarType.UINT32:
    case ScalarType.FIXED32:
      return Math.floor(r() * 2 ** 32);
    default:
      return r() < 0.3 ? 0 : Math.floor((r() - 0.5) * 2 ** 32);
  }
}

function value(field: DescField, r: () => number, depth: number): unknown {
  switch (field.fieldKind) {
    case "scalar":
      return scalar(field.scalar, r);
    case "enum":
      return field.enum.values[Math.floor(r() * field.enum.values.length)]!.number;
    case "message":
      return randomMessage(field.message, r, depth + 1);
    case "list": {
      const n = r() < 0.3 ? 0 : Math.floor(r() * 6);
      return Array.from({ length: n }, () =>
        field.listKind === "message" ? randomMessage(field.message, r, depth + 1) : field.listKind === "enum" ? field.enum.values[Math.floor(r() * field.enum.values.length)]!.number : scalar(field.scalar, r),
      );
    }
    case "map": {
      const out: Record<string, unknown> = {};
      for (let n = r() < 0.3 ? 0 : Math.floor(r() * 5); n > 0; n--) {
        const key = r() < 0.3 ? String(Math.floor(r() * 1e6)) : text(r) || `k${n}`;
        out[key] = field.mapKind === "message" ? randomMessage(field.message, r, depth + 1) : field.mapKind === "enum" ? field.enum.values[0]!.number : scalar(field.scalar, r);
      }
      return out;
    }
  }
}

/** A message of `desc` with each field set (or, for a message field or proto3 `optional`, left unset) at random. */
export function randomMessage(desc: DescMessage, r: () => number, depth = 0): Message {
  const init: Record<string, unknown> = {};
  for (const field of desc.fields) {
    const optional = field.fieldKind === "message" || field.presence === 1;
    if (optional && (depth > 3 || r() < 0.3)) continue;
    if (field.fieldKind !== "message" && r() < 0.15) continue; // its zero value
    init[field.localName] = value(field, r, depth);
  }
  return create(desc, init as never);
}
