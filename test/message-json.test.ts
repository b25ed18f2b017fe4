import { fromBinary, type DescMessage, type Message } from "@bufbuild/protobuf";
import { describe, expect, it } from "vitest";
import { demoRecords } from "../src/catalogue/demo-dataset.ts";
import { readCatalogueRecord } from "../src/catalogue/catalogue-record.ts";
import { operations } from "../src/operations/index.ts";
import { messageValue } from "../src/render/legacy-response.ts";
import { messageJson, messageListJson } from "../src/render/message-json.ts";
import { phpJsonEncode, type PhpJsonOptions } from "../src/render/php-json.ts";
import { random, randomMessage } from "./support/random-message.ts";

// The direct writer of a record's json (message → bytes) against the generic one (message → PHP
// value → phpJsonEncode, which test/php-oracle.test.ts holds to PHP itself): the same bytes for
// every demo record and for random messages of every operation's item type, in json and jsonu.

const modes: [string, PhpJsonOptions][] = [
  ["json", { unescapedUnicode: false }],
  ["jsonu", { unescapedUnicode: true }],
];

const generic = (desc: DescMessage, m: Message, options: PhpJsonOptions) => Buffer.from(phpJsonEncode(messageValue(desc, m), options), "utf8");
const genericList = (desc: DescMessage, ms: Message[], options: PhpJsonOptions) => Buffer.from(phpJsonEncode(ms.map((m) => messageValue(desc, m)), options), "utf8");

/** Where two byte strings first differ, to name in a failure. */
function firstDifference(a: Buffer, b: Buffer): string {
  let i = 0;
  while (i < a.length && i < b.length && a[i] === b[i]) i++;
  return `at byte ${i}: ${JSON.stringify(a.subarray(Math.max(0, i - 20), i + 20).toString())} vs ${JSON.stringify(b.subarray(Math.max(0, i - 20), i + 20).toString())}`;
}

function expectSame(direct: Buffer, slow: Buffer, label: string): void {
  if (!direct.equals(slow)) expect.fail(`${label}: ${firstDifference(direct, slow)}`);
}

describe("a record's json written directly from its message", () => {
  it("is the generic writer's bytes for every demo record the operations serve", () => {
    let checked = 0;
    for (const line of demoRecords()) {
      for (const op of operations) {
        if (line.kind !== op.record.name) continue;
        const stored = readCatalogueRecord(line);
        const record = fromBinary(op.record.schema, stored.bytes);
        const answer = op.answer(record as never, { num_iid: stored.key, is_promotion: "", sid: "" });
        if ("notFound" in answer) continue;
        const { message, list } = op.item;
        for (const [mode, options] of modes) {
          const label = `${op.id} ${stored.key} ${mode}`;
          if (list) expectSame(messageListJson(message, answer.value as Message[], options), genericList(message, answer.value as Message[], options), label);
          else expectSame(messageJson(message, answer.value as Message, options), generic(message, answer.value as Message, options), label);
          checked++;
        }
      }
    }
    expect(checked).toBeGreaterThan(50);
  });

  it("is the generic writer's bytes for random messages of every operation's item type", () => {
    const types = [...new Map(operations.map((op) => [op.item.message.typeName, op.item.message])).values()];
    expect(types.length).toBeGreaterThan(1);
    for (const desc of types) {
      for (let seed = 1; seed <= 400; seed++) {
        const r = random(seed);
        const m = randomMessage(desc, r);
        const list = Array.from({ length: Math.floor(r() * 4) }, () => randomMessage(desc, r));
        for (const [mode, options] of modes) {
          expectSame(messageJson(desc, m, options), generic(desc, m, options), `${desc.typeName} seed ${seed} ${mode}`);
          expectSame(messageListJson(desc, list, options), genericList(desc, list, options), `${desc.typeName} list seed ${seed} ${mode}`);
        }
      }
    }
  });

  it("throws where the generic writer throws (a price PHP cannot write)", () => {
    const desc = operations[0]!.item.message;
    const m = randomMessage(desc, random(1));
    const field = desc.fields.find((f) => f.fieldKind === "scalar" && f.scalar === 1 /* DOUBLE */)!;
    (m as unknown as Record<string, unknown>)[field.localName] = Number.POSITIVE_INFINITY;
    expect(() => generic(desc, m, modes[0]![1])).toThrow(RangeError);
    expect(() => messageJson(desc, m, modes[0]![1])).toThrow(RangeError);
    // And the writer is whole again for the next record.
    const next = randomMessage(desc, random(2));
    expectSame(messageJson(desc, next, modes[0]![1]), generic(desc, next, modes[0]![1]), "after a throw");
  });

  it("each answer is a block of its own size, not a view of the shared buffer (a cache entry keeps it)", () => {
    const desc = operations[0]!.item.message;
    const a = messageJson(desc, randomMessage(desc, random(3)), modes[0]![1]);
    const b = messageJson(desc, randomMessage(desc, random(4)), modes[0]![1]);
    expect(a.buffer.byteLength).toBe(a.byteLength);
    expect(b.buffer).not.toBe(a.buffer);
  });
});
