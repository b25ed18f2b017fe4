import { ScalarType, type DescField, type DescMessage, type Message } from "@bufbuild/protobuf";
import { legacyKeyOfField } from "../contract/legacy-layout.ts";
import { jsonKey, phpFloatText, type PhpJsonOptions } from "./php-json.ts";

/**
 * A record (a protobuf message, or a list of them) as legacy json or jsonu,
 * written straight to UTF-8 bytes: exactly the bytes of
 * `phpJsonEncode(messageValue(desc, message), options)`, without the PHP
 * value in between (a Map per message, a PhpFloat per price), without a text
 * per string and per member, and without encoding the joined text again
 * when it is written out. It is how a record's json is made the first time:
 * on every cache miss, and the first hit of each cached item.
 * test/message-json.test.ts holds it to the generic writer over the demo
 * records and random messages of every catalogue's record types.
 */
export function messageJson(desc: DescMessage, message: Message, options: PhpJsonOptions): Buffer {
  pos = 0;
  writerOf(desc, options.unescapedUnicode)(message as unknown as Fields);
  return taken();
}

/** A list of records (item_search_peerbuy's item) the same way: phpJsonEncode of the list of their PHP values. */
export function messageListJson(desc: DescMessage, messages: readonly Message[], options: PhpJsonOptions): Buffer {
  pos = 0;
  const write = writerOf(desc, options.unescapedUnicode);
  byte(91);
  for (let i = 0; i < messages.length; i++) {
    if (i > 0) byte(44);
    write(messages[i] as unknown as Fields);
  }
  byte(93);
  return taken();
}

type Fields = Record<string, unknown>;
type WriteValue = (v: unknown) => void;

/** One buffer kept between records; a record's bytes are copied out into a block of their own size. */
let buf = Buffer.allocUnsafe(64 * 1024);
let pos = 0;

function room(n: number): void {
  if (pos + n <= buf.length) return;
  const grown = Buffer.allocUnsafe(Math.max(2 * buf.length, pos + n));
  buf.copy(grown, 0, 0, pos);
  buf = grown;
}

function taken(): Buffer {
  const out = Buffer.allocUnsafeSlow(pos);
  buf.copy(out, 0, 0, pos);
  return out;
}

function byte(b: number): void {
  room(1);
  buf[pos++] = b;
}

/** Text known to be ASCII (numbers, keys, `null`). */
function ascii(s: string): void {
  room(s.length);
  pos += buf.write(s, pos, s.length, "latin1");
}

const hexBytes = Buffer.from("0123456789abcdef", "latin1");
/** The letter of each short escape (`\n` → `n`), by the ASCII character it escapes; 0 for none. */
const shortEscape = new Uint8Array(128);
for (const [c, letter] of [[8, "b"], [9, "t"], [10, "n"], [12, "f"], [13, "r"], [34, '"'], [47, "/"], [92, "\\"]] as const) shortEscape[c] = letter.charCodeAt(0);
// Characters that need no escape in either mode: printable ASCII but `"`, `/`, `\`.
const plainAscii = /^[\x20-\x21\x23-\x2e\x30-\x5b\x5d-\x7f]*$/;

/** `\uXXXX` at `p`; returns where it ends. */
function u4(b: Buffer, p: number, c: number): number {
  b[p] = 92;
  b[p + 1] = 117;
  b[p + 2] = hexBytes[(c >> 12) & 15]!;
  b[p + 3] = hexBytes[(c >> 8) & 15]!;
  b[p + 4] = hexBytes[(c >> 4) & 15]!;
  b[p + 5] = hexBytes[c & 15]!;
  return p + 6;
}

/**
 * A string as phpJsonString writes it (see there), as bytes: a long plain
 * ASCII one in one native write, anything else a UTF-16 unit at a time. A
 * lone surrogate is U+FFFD, as `toWellFormed` makes it.
 */
function string(s: string, unescaped: boolean): void {
  const n = s.length;
  room(6 * n + 2);
  const b = buf;
  let p = pos;
  b[p++] = 34;
  if (n > 32 && plainAscii.test(s)) {
    p += b.write(s, p, n, "latin1");
    b[p++] = 34;
    pos = p;
    return;
  }
  for (let i = 0; i < n; i++) {
    let c = s.charCodeAt(i);
    if (c < 0x80) {
      const letter = shortEscape[c]!;
      if (letter !== 0) {
        b[p++] = 92;
        b[p++] = letter;
      } else if (c < 0x20) {
        p = u4(b, p, c);
      } else {
        b[p++] = c;
      }
      continue;
    }
    if (c >= 0xd800 && c < 0xe000) {
      const d = i + 1 < n ? s.charCodeAt(i + 1) : 0;
      if (c < 0xdc00 && d >= 0xdc00 && d < 0xe000) {
        i++;
        if (!unescaped) {
          p = u4(b, u4(b, p, c), d);
        } else {
          const cp = 0x10000 + ((c - 0xd800) << 10) + (d - 0xdc00);
          b[p++] = 0xf0 | (cp >> 18);
          b[p++] = 0x80 | ((cp >> 12) & 0x3f);
          b[p++] = 0x80 | ((cp >> 6) & 0x3f);
          b[p++] = 0x80 | (cp & 0x3f);
        }
        continue;
      }
      c = 0xfffd;
    }
    if (!unescaped || c === 0x2028 || c === 0x2029) {
      p = u4(b, p, c);
    } else if (c < 0x800) {
      b[p++] = 0xc0 | (c >> 6);
      b[p++] = 0x80 | (c & 0x3f);
    } else {
      b[p++] = 0xe0 | (c >> 12);
      b[p++] = 0x80 | ((c >> 6) & 0x3f);
      b[p++] = 0x80 | (c & 0x3f);
    }
  }
  b[p++] = 34;
  pos = p;
}

/** How messageValue reads a scalar (scalar() in legacy-response.ts), written as phpJsonEncode writes that. */
function scalarWriter(type: ScalarType, unescaped: boolean): WriteValue {
  switch (type) {
    case ScalarType.DOUBLE:
    case ScalarType.FLOAT:
      return (v) => ascii(phpFloatText(v as number));
    case ScalarType.BOOL:
      return (v) => ascii(v ? "true" : "false");
    case ScalarType.STRING:
      return (v) => string(v as string, unescaped);
    case ScalarType.BYTES:
      return (v) => {
        const bytes = v as Uint8Array;
        string(Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString("latin1"), unescaped);
      };
    default:
      return (v) => ascii(String(Number(v)));
  }
}

const number: WriteValue = (v) => ascii(String(v));

/** A list as json_encode writes a PHP list: `[]` when empty. */
function listWriter(element: WriteValue): WriteValue {
  return (v) => {
    const list = v as readonly unknown[];
    byte(91);
    for (let i = 0; i < list.length; i++) {
      if (i > 0) byte(44);
      element(list[i]);
    }
    byte(93);
  };
}

/** One field's value, as messageValue's reader of it (fieldReader in legacy-response.ts) makes it, written. */
function fieldWriter(field: DescField, unescaped: boolean): WriteValue {
  switch (field.fieldKind) {
    case "scalar": {
      const write = scalarWriter(field.scalar, unescaped);
      if (field.presence === 1 /* EXPLICIT: proto3 `optional` */) return (v) => (v === undefined ? ascii("null") : write(v));
      return write;
    }
    case "enum":
      return number;
    case "message": {
      const desc = field.message;
      return (v) => (v === undefined ? ascii("[]") : writerOf(desc, unescaped)(v as Fields));
    }
    case "list": {
      if (field.listKind === "message") {
        const desc = field.message;
        return listWriter((v) => writerOf(desc, unescaped)(v as Fields));
      }
      return listWriter(field.listKind === "enum" ? number : scalarWriter(field.scalar, unescaped));
    }
    case "map": {
      const value = field.mapKind === "message" ? (v: unknown) => writerOf(field.message, unescaped)(v as Fields) : field.mapKind === "enum" ? number : scalarWriter(field.scalar, unescaped);
      return (v) => {
        const entries = Object.entries(v as Fields);
        if (entries.length === 0) return ascii("[]");
        byte(123);
        for (let i = 0; i < entries.length; i++) {
          if (i > 0) byte(44);
          string(entries[i]![0], unescaped);
          byte(58);
          value(entries[i]![1]);
        }
        byte(125);
      };
    }
  }
}

const writers = [new Map<DescMessage, (m: Fields) => void>(), new Map<DescMessage, (m: Fields) => void>()] as const;

/** A message as messageValue's PHP array, written: its fields in declaration order under their legacy keys; `[]` with none. */
function writerOf(desc: DescMessage, unescaped: boolean): (m: Fields) => void {
  const known = writers[unescaped ? 1 : 0];
  let write = known.get(desc);
  if (write !== undefined) return write;
  if (desc.fields.length === 0) {
    write = () => ascii("[]");
  } else {
    const options: PhpJsonOptions = { unescapedUnicode: unescaped };
    // Each member's key as written after `{` or `,` (field names are ASCII), then its value.
    const members: { readonly key: string; readonly name: string; value: WriteValue | undefined; readonly field: DescField }[] = desc.fields.map((f, i) => ({
      key: (i === 0 ? "{" : ",") + jsonKey(legacyKeyOfField[f.name] ?? f.name, options),
      name: f.localName,
      value: undefined,
      field: f,
    }));
    write = (m) => {
      for (const member of members) {
        ascii(member.key);
        (member.value ??= fieldWriter(member.field, unescaped))(m[member.name]);
      }
      byte(125);
    };
  }
  known.set(desc, write);
  return write;
}
