import { execFile, execFileSync } from "node:child_process";
import { promisify } from "node:util";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import fc from "fast-check";
import { XMLParser } from "fast-xml-parser";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { demoRecords } from "../src/catalogue/demo-dataset.ts";
import { errorCodes } from "../src/contract/error-codes.ts";
import { operationById, operations } from "../src/operations/index.ts";
import type { CallInput, Outcome } from "../src/core/gateway.ts";
import { EntryMemo } from "../src/core/response-cache.ts";
import { joinedBody, legacyFormats, renderLegacy, renderOutcome, type LegacyBody, type LegacyFormatName } from "../src/render/legacy-formats.ts";
import { legacyResponse, statusValue } from "../src/render/legacy-response.ts";
import { statusKeyWriter } from "../src/render/keyed-document.ts";
import { legacyLayouts } from "../src/contract/legacy-layout.ts";
import { PhpFloat, PhpFragment, type PhpMap, type PhpValue } from "../src/render/php-value.ts";
import { demo, startGateway, type GatewayFixture } from "./support/gateway-fixture.ts";
import { random, statusBlock } from "./support/random-status.ts";
import { clone, create } from "@bufbuild/protobuf";
import { LanguageInfoSchema, StatusBlockSchema, type StatusBlock } from "../src/gen/gateway/catalogue/v1/status_pb.js";

/** A rendered body's bytes, as they go on the wire: text as UTF-8, a spliced body's parts one after the other (as the paths before Fastify write them). */
function wire(body: LegacyBody): Buffer {
  if (typeof body === "string") return Buffer.from(body, "utf8");
  if (Buffer.isBuffer(body)) return body;
  return Buffer.concat([Buffer.from(body.head, "utf8"), body.item, Buffer.from(body.tail, "utf8")]);
}

// The tagged form the PHP side builds values from (test/php/oracle.php).
type Node = { s: string } | { i: string } | { d: string } | { b: boolean } | { n: 1 } | { l: Node[] } | { m: [string, Node][] };

const b64 = (s: string) => Buffer.from(s.toWellFormed(), "utf8").toString("base64");

function tag(v: PhpValue): Node {
  if (typeof v === "string") return { s: b64(v) };
  if (typeof v === "number") return { i: String(v) };
  if (typeof v === "boolean") return { b: v };
  if (v === null) return { n: 1 };
  if (v instanceof PhpFloat) return { d: Object.is(v.value, -0) ? "-0" : String(v.value) };
  if (v instanceof PhpFragment) return tag(v.value);
  if (Array.isArray(v)) return { l: v.map(tag) };
  return { m: [...v].map(([k, x]) => [b64(k), tag(x)] as [string, Node]) };
}

const m = (entries: [string, PhpValue][]): PhpMap => new Map(entries);
const f = (n: number) => new PhpFloat(n);

const nasty = [
  "", "plain", "a/b\\c\"d'e", "颜色分类:白色", "🔥爆款👍🏽", "\u2028\u2029", "tab\there\nnew\r\nline",
  "\u0000nul\u0000", "\u0001\u001f\u007f", "<tag attr=\"x\">&amp;</tag>", "]]>", "  padded  ", "\ud800 lone surrogate",
  "x".repeat(100_000) + "尾", "é".repeat(3000), "$var {$x} \\'", "?>",
];

/** Texts of every kind of character, each escape next to plain runs (a fixed seed: the same corpus every run). */
const generated = fc.sample(
  fc.string({ unit: fc.oneof(fc.constantFrom("\u0000", "\b", "\t", "\n", "\f", "\r", "\u001f", '"', "/", "\\", "\u007f", "\u0080", "é", "中", "\u2028", "\u2029", "\uffff", "🔥", "\ud800"), fc.string({ maxLength: 4 })), maxLength: 80 }),
  { seed: 17, numRuns: 300 },
);

function syntheticCorpus(): [string, PhpMap][] {
  return [
    ["strings", m(nasty.map((s, i) => [`s${i}`, s]))],
    ["generated strings", m(generated.map((s, i) => [`g${i}`, s]))],
    ["floats", m([[ "zero", f(0) ], ["negzero", f(-0)], ["price", f(25.8)], ["integral", f(30)], ["third", f(1 / 3)], ["big", f(1.25e25)], ["small", f(1e-5)], ["tiny", f(5e-324)], ["huge", f(1.7976931348623157e308)], ["e17", f(1e17)], ["e16", f(1e16)], ["neg", f(-108.3)]])],
    ["ints", m([["zero", 0], ["one", 1], ["neg", -5], ["max", Number.MAX_SAFE_INTEGER], ["min", Number.MIN_SAFE_INTEGER]])],
    ["scalars", m([["true", true], ["false", false], ["null", null]])],
    ["empties", m([["list", []], ["map", new Map()], ["nested", [[], new Map(), [new Map()]]]])],
    ["keys", m([["123", "int key"], ["-5", "negative int key"], ["0123", "string key"], ["-0", "string key"], ["1.5", "k"], ["9223372036854775807", "max"], ["9223372036854775808", "past max"], ["1627207:28320", "colon"], ["", "empty key"], ["key with space", 1], ["颜色", 2], ["it's", 3], ["back\\slash", 4], ["xmlish", 5], ["nul\u0000key", 6], ["tab\tkey", 7]])],
    ["deep", m([["a", m([["b", m([["c", [1, [2, [3, m([["d", "deep"]])]]]]])]])]])],
  ];
}

let gw: GatewayFixture;
let corpus: [string, PhpMap][];
/** The real calls' outcomes the corpus's first entries are made from. */
const outcomes: [string, Outcome][] = [];
let results: { json: string; jsonu: string; serialize: string; var_export: string; xml_reads_back: boolean }[];
let dir: string;

beforeAll(async () => {
  gw = await startGateway();
  const input = (args: Record<string, string>, credentials = { key: gw.account.key, secret: gw.account.secret }): CallInput => ({
    args,
    credentials,
    transport: "legacy",
    clientIp: "127.0.0.1",
  });
  const itemGet = operationById.get("retail/item_get")!;
  const peerbuy = operationById.get("wholesale/item_search_peerbuy")!;
  const retailIds = demoRecords().filter((r) => r.kind === "item_detail" && r.obtainable).slice(0, 12).map((r) => (r.item as { num_iid: string }).num_iid);
  const real: [string, PhpMap][] = [];
  const add = (name: string, outcome: Outcome) => {
    outcomes.push([name, outcome]);
    real.push([name, legacyResponse(outcome)]);
  };
  for (const id of retailIds) {
    add(`item_get ${id}`, await gw.runtime.gateway.call(itemGet, input({ num_iid: id, is_promotion: "1" })));
  }
  add("item_get without promotion", await gw.runtime.gateway.call(itemGet, input({ num_iid: demo.retailNumIid })));
  add("peer-viewed", await gw.runtime.gateway.call(peerbuy, input({ num_iid: demo.wholesaleNumIid, sid: demo.wholesaleSid })));
  add("item_get 2000", await gw.runtime.gateway.call(itemGet, input({ num_iid: "1" })));
  add("peer-viewed 2000", await gw.runtime.gateway.call(peerbuy, input({ num_iid: "1", sid: "x" })));
  // Every operation of the table: its banner example, translated too, and a 2000.
  for (const op of operations) {
    const args = op.example(demoRecords())!;
    add(`${op.id} example`, await gw.runtime.gateway.call(op, input({ ...args })));
    add(`${op.id} example in English`, await gw.runtime.gateway.call(op, { ...input({ ...args }), lang: "en" }));
    add(`${op.id} 2000`, await gw.runtime.gateway.call(op, input({ ...args, num_iid: "1" })));
  }
  add("4005", await gw.runtime.gateway.call(itemGet, input({ num_iid: "1" }, { key: gw.account.key, secret: "no" })));
  for (const code of errorCodes.keys()) {
    add(`refusal ${code}`, await gw.runtime.gateway.refuse(code, "retail", `reason for ${code} with "quotes" & 中文`, { clientIp: "::1", transport: "legacy" }));
  }
  corpus = [...real, ...syntheticCorpus()];

  dir = mkdtempSync(join(tmpdir(), "php-oracle-"));
  const file = join(dir, "corpus.json");
  writeFileSync(file, JSON.stringify(corpus.map(([, value]) => ({ value: tag(value), xml: b64(legacyFormats.xml.render(value)) }))));
  results = JSON.parse(execFileSync("php", [join(import.meta.dirname, "php", "oracle.php"), file], { maxBuffer: 1 << 28 }).toString()) as typeof results;
});

afterAll(async () => {
  await gw?.close();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

describe("byte parity with PHP", () => {
  it("covers every response shape and the edge values", () => {
    expect(corpus.length).toBeGreaterThan(40);
    expect(results).toHaveLength(corpus.length);
  });

  for (const format of ["json", "jsonu", "serialize", "var_export"] as const) {
    it(`${format} is what PHP prints, for the whole corpus`, () => {
      const mismatches: string[] = [];
      corpus.forEach(([name, value], i) => {
        const ours = Buffer.from(legacyFormats[format].render(value), "utf8");
        const php = Buffer.from(results[i]![format], "base64");
        if (!ours.equals(php)) {
          let at = 0;
          while (at < ours.length && ours[at] === php[at]) at++;
          mismatches.push(`${name}: differs at byte ${at}: ours …${ours.subarray(Math.max(0, at - 30), at + 30).toString()}… php …${php.subarray(Math.max(0, at - 30), at + 30).toString()}…`);
        }
      });
      expect(mismatches).toEqual([]);
    });
  }

  it("xml reads back to the same PHP array through SimpleXML", () => {
    const failing = corpus.filter((_, i) => !results[i]!.xml_reads_back).map(([name]) => name);
    expect(failing).toEqual([]);
  });
});

type XmlNode = Record<string, unknown> & { ":@"?: Record<string, string> };

function fromXml(node: XmlNode, tagName: string): PhpValue {
  const attrs = node[":@"] ?? {};
  const children = (node[tagName] as XmlNode[]) ?? [];
  const text = children.filter((c) => "#text" in c).map((c) => String(c["#text"])).join("");
  switch (attrs["@_type"]) {
    case "int":
      return Number(text);
    case "float":
      return new PhpFloat(Number(text));
    case "bool":
      return text === "true";
    case "null":
      return null;
    case "list":
      return children.filter((c) => !("#text" in c)).map((c) => fromXml(c, "value"));
    case "map":
      return mapFromXml(children);
    default:
      return attrs["@_encoding"] === "base64" ? Buffer.from(text, "base64").toString("utf8") : text;
  }
}

function mapFromXml(children: XmlNode[]): PhpMap {
  const out: PhpMap = new Map();
  for (const child of children) {
    const name = Object.keys(child).find((k) => k !== ":@" && k !== "#text");
    if (name === undefined) continue;
    const attrs = child[":@"] ?? {};
    const key = attrs["@_key-base64"] !== undefined ? Buffer.from(attrs["@_key-base64"], "base64").toString("utf8") : (attrs["@_key"] ?? name);
    out.set(key, fromXml(child, name));
  }
  return out;
}

describe("cached items (fragments)", () => {
  it("keep every rendering as its UTF-8 bytes, splice them between the status text, and send the same bytes either way", () => {
    const texts = ["plain ascii", "café ñ ß ÿ \u0080\u00a0", "商品 描述", "mixed é 商品", "lone \ud800 surrogate", ""];
    for (const itemText of texts) {
      for (const statusText of ["", "原因 é"]) {
        const value: PhpMap = new Map<string, PhpValue>([
          ["item", new Map<string, PhpValue>([["title", itemText], ["price", new PhpFloat(1.5)], ["list", [1, itemText]]])],
          ["error", statusText],
          ["reason", statusText],
        ]);
        for (const [format, { render }] of Object.entries(legacyFormats)) {
          const plain = Buffer.from(render(value), "utf8");
          const fragment = new PhpFragment(value.get("item")!);
          const response: PhpMap = new Map([...value].map(([k, v]) => [k, k === "item" ? fragment : v]));
          for (let i = 0; i < 2; i++) {
            const body = renderLegacy(format as LegacyFormatName, response);
            const label = `${format} ${JSON.stringify(itemText)} ${JSON.stringify(statusText)} ${i}`;
            expect(wire(body).equals(plain), label).toBe(true);
            // The item's kept bytes themselves, not a copy, between the call's text.
            expect(typeof body === "object" && "item" in body, `${label} spliced`).toBe(true);
            // Joined for compression: the same bytes.
            expect(Buffer.from(joinedBody(body) as Buffer).equals(plain), `${label} joined`).toBe(true);
          }
          // Renderings whose key is the format's name (xml and var_export key theirs by tag and depth).
          if (format === "json" || format === "jsonu" || format === "serialize") {
            const kept = fragment.rendering(format);
            expect(Buffer.isBuffer(kept), `${format} ${JSON.stringify(itemText)} kept as bytes`).toBe(true);
          }
        }
      }
    }
  });

  it("render to the same bytes as the plain value, in every format, first time and from the memo", () => {
    const withItem = corpus.filter(([, v]) => v.has("item"));
    expect(withItem.length).toBeGreaterThan(5);
    for (const [name, value] of withItem) {
      const wrapped: PhpMap = new Map([...value].map(([k, v]) => [k, k === "item" ? new PhpFragment(v) : v]));
      for (const [format, { render }] of Object.entries(legacyFormats)) {
        const plain = render(value);
        expect(render(wrapped), `${name} ${format}`).toBe(plain);
        expect(render(wrapped), `${name} ${format} from the memo`).toBe(plain);
        // As sent: the item's rendering spliced around a placeholder (text, or bytes beyond Latin-1), as UTF-8 on the wire.
        const fresh: PhpMap = new Map([...value].map(([k, v]) => [k, k === "item" ? new PhpFragment(v) : v]));
        for (let i = 0; i < 2; i++) expect(wire(renderLegacy(format as LegacyFormatName, fresh)).equals(Buffer.from(plain, "utf8")), `${name} ${format} spliced, pass ${i}`).toBe(true);
      }
    }
  });
});

describe("outcomes rendered (renderOutcome: written key by key)", () => {
  it("write every real outcome as its PHP value renders, in every format, first time and from the memo", () => {
    expect(outcomes.length).toBeGreaterThan(20);
    for (const [name, outcome] of outcomes) {
      for (const [format, { render }] of Object.entries(legacyFormats)) {
        const plain = Buffer.from(render(legacyResponse(outcome)), "utf8");
        for (let i = 0; i < 2; i++) expect(wire(renderOutcome(format as LegacyFormatName, outcome)).equals(plain), `${name} ${format} pass ${i}`).toBe(true);
      }
    }
  });

  it("write a cached item's json first (renderOutcome), and every format after it from the same memo, as the PHP value renders them", () => {
    const successes = outcomes.filter(([, o]) => o.kind === "success" && o.memo !== undefined);
    expect(successes.length).toBeGreaterThan(3);
    for (const [name, base] of successes) {
      for (const first of ["json", "jsonu"] as const) {
        // A fresh entry memo: its item's first rendering is renderOutcome's.
        const outcome = { ...base, memo: new EntryMemo() } as Outcome;
        const plain = (format: LegacyFormatName) => Buffer.from(legacyFormats[format].render(legacyResponse({ ...base, memo: undefined } as Outcome)), "utf8");
        expect(wire(renderOutcome(first, outcome)).equals(plain(first)), `${name} ${first} first`).toBe(true);
        for (const format of Object.keys(legacyFormats) as LegacyFormatName[]) {
          expect(wire(renderOutcome(format, outcome)).equals(plain(format)), `${name} ${format} after ${first}`).toBe(true);
          expect(Buffer.from(legacyFormats[format].render(legacyResponse(outcome)), "utf8").equals(plain(format)), `${name} ${format} generic after ${first}`).toBe(true);
        }
      }
    }
  });

  it("write random status blocks around a cached item as the PHP value renders them", () => {
    const [, success] = outcomes.find(([, o]) => o.kind === "success" && o.memo !== undefined)!;
    const [, error] = outcomes.find(([, o]) => o.kind === "error")!;
    for (let seed = 1; seed <= 300; seed++) {
      for (const base of [success, error]) {
        const outcome = { ...base, status: statusBlock(random(seed)) } as Outcome;
        for (const format of Object.keys(legacyFormats) as LegacyFormatName[]) {
          const plain = Buffer.from(legacyFormats[format].render(legacyResponse(outcome)), "utf8");
          expect(wire(renderOutcome(format, outcome)).equals(plain), `seed ${seed} ${base.kind} ${format}`).toBe(true);
        }
      }
    }
  });
});

describe("the status keys' remembered texts (keyed-document.ts)", () => {
  it("write each key's first value, with nothing remembered yet, as each format writes its PHP value under the key", () => {
    const [, success] = outcomes.find(([, o]) => o.kind === "success" && o.memo !== undefined)!;
    const empty = clone(StatusBlockSchema, success.status);
    empty.callArgs = {};
    empty.language = undefined;
    const blocks = [success.status, empty, ...Array.from({ length: 20 }, (_, i) => statusBlock(random(1000 + i)))];
    const keys = [...new Set(Object.values(legacyLayouts).flat())].filter((k) => k !== "item");
    for (const [format, { render, document }] of Object.entries(legacyFormats)) {
      for (const key of keys) {
        for (const [i, block] of blocks.entries()) {
          // The key's entry is the whole one-key map's text between its open and close.
          const whole = render(new Map([[key, statusValue(key, block)]]));
          expect(document.open(1) + statusKeyWriter(key, document)(block) + document.close(1), `${format} ${key} block ${i}`).toBe(whole);
        }
      }
    }
  });

  it("write each key's new value when only it changes, and the old one again when it comes back", () => {
    const [, success] = outcomes.find(([, o]) => o.kind === "success" && o.memo !== undefined)!;
    const base = success.status;
    // One field at a time, to a value beside the one before (same length, same keys), then back.
    const changes: Record<string, (s: StatusBlock) => void> = {
      requestId: (s) => (s.requestId = s.requestId.replace(/.$/, (c) => (c === "0" ? "1" : "0"))),
      apiInfo: (s) => (s.apiInfo = "today:2 max:9 all[2=2+0+0];expires:2030-01-01"),
      executionTime: (s) => (s.executionTime = 0.0125),
      cache: (s) => (s.cache = !s.cache),
      secacheTime: (s) => (s.secacheTime = s.secacheTime + 1n),
      callArgsValue: (s) => (s.callArgs = Object.fromEntries(Object.entries(s.callArgs).map(([k, v]) => [k, `${v}9`]))),
      callArgsFewer: (s) => (s.callArgs = Object.fromEntries(Object.entries(s.callArgs).slice(1))),
      callArgsNone: (s) => (s.callArgs = {}),
      callArgsEscaped: (s) => (s.callArgs = { ...s.callArgs, "k/\u00e9": "v\u4e2d/\"" }),
      language: (s) => (s.language = create(LanguageInfoSchema, { currentLang: "en", sourceLang: "cn" })),
      noLanguage: (s) => (s.language = undefined),
      reason: (s) => (s.reason = "\u4e2d\u6587 / \"quoted\""),
    };
    for (const format of Object.keys(legacyFormats) as LegacyFormatName[]) {
      const check = (status: StatusBlock, what: string) => {
        const outcome = { ...success, status } as Outcome;
        const plain = Buffer.from(legacyFormats[format].render(legacyResponse(outcome)), "utf8");
        expect(wire(renderOutcome(format, outcome)).equals(plain), `${format} ${what}`).toBe(true);
      };
      for (const [name, change] of Object.entries(changes)) {
        check(base, `${name}: before`);
        const changed = clone(StatusBlockSchema, base);
        change(changed);
        check(changed, `${name}: changed`);
        check(base, `${name}: back`);
      }
    }
  });
});

describe("xml read by a JS parser", () => {
  it("reads back to the same value for the whole corpus", () => {
    const parser = new XMLParser({ preserveOrder: true, ignoreAttributes: false, trimValues: false, parseTagValue: false, parseAttributeValue: false, processEntities: true, htmlEntities: true });
    for (const [name, value] of corpus) {
      const doc = parser.parse(legacyFormats.xml.render(value)) as XmlNode[];
      const root = doc.find((n) => "response" in n)!;
      const expected = JSON.parse(JSON.stringify([...value].map(([k, v]) => [k, normalise(v)])));
      const actual = JSON.parse(JSON.stringify([...mapFromXml(root.response as XmlNode[])].map(([k, v]) => [k, normalise(v)])));
      expect(actual, name).toEqual(expected);
    }
  });
});

/** A comparable form: Maps as entry lists, floats tagged, strings as PHP would hold them. */
function normalise(v: PhpValue): unknown {
  if (v instanceof PhpFragment) return normalise(v.value);
  if (v instanceof PhpFloat) return { float: Object.is(v.value, -0) ? 0 : v.value };
  if (typeof v === "string") return v.toWellFormed();
  if (Array.isArray(v)) return v.map(normalise);
  if (v instanceof Map) return [...v].map(([k, x]) => [k, normalise(x)]);
  return v;
}

describe("a PHP client against the running gateway", () => {
  it("decodes json, jsonu, serialize, var_export and xml of the same calls to the same data", async () => {
    // Asynchronous: the gateway answering PHP runs in this process.
    const { stdout: out } = await promisify(execFile)(
      "php",
      [join(import.meta.dirname, "php", "client.php"), gw.base, gw.account.key, gw.account.secret, demo.retailNumIid, demo.wholesaleNumIid],
      { encoding: "utf8" },
    );
    expect(out).toContain(`wholesale sid: ${demo.wholesaleSid}\n`);
    expect(out).toContain("wholesale item_get: error_code 0000");
    expect(out).toContain("\nitem_get: error_code 0000");
    expect(out).toContain("peerbuy: error_code 0000");
    expect(out).toContain("not found: error_code 2000");
    expect(out).toContain("bad secret: error_code 4005");
    expect(out).toContain("all formats agree");
  });
});
