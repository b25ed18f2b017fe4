import { describe, expect, it } from "vitest";
import { phpFloatText, phpJsonEncode, phpJsonString } from "../src/render/php-json.ts";
import { PhpFloat, type PhpValue } from "../src/render/php-value.ts";

const json = { unescapedUnicode: false };
const jsonu = { unescapedUnicode: true };

describe("PHP json_encode strings", () => {
  it.each([
    ["plain", "abc", '"abc"'],
    ["slash", "a/b", '"a\\/b"'],
    ["quote and backslash", 'a"b\\c', '"a\\"b\\\\c"'],
    ["short escapes", "\b\f\n\r\t", '"\\b\\f\\n\\r\\t"'],
    ["other controls", "\u0000\u0001\u001f", '"\\u0000\\u0001\\u001f"'],
    ["DEL is not escaped", "\u007f", '"\u007f"'],
    ["BMP non-ASCII, lowercase hex", "颜色é", '"\\u989c\\u8272\\u00e9"'],
    ["non-BMP as a surrogate pair", "🔥", '"\\ud83d\\udd25"'],
    ["line separators", "\u2028\u2029", '"\\u2028\\u2029"'],
  ])("json: %s", (_name, input, expected) => {
    expect(phpJsonString(input, json)).toBe(expected);
  });

  it.each([
    ["BMP non-ASCII stays literal", "颜色é", '"颜色é"'],
    ["non-BMP stays literal", "🔥", '"🔥"'],
    ["slash is still escaped", "//img", '"\\/\\/img"'],
    ["U+2028 and U+2029 are still escaped", "a\u2028b\u2029", '"a\\u2028b\\u2029"'],
    ["controls are still escaped", "\n\u0001", '"\\n\\u0001"'],
  ])("jsonu: %s", (_name, input, expected) => {
    expect(phpJsonString(input, jsonu)).toBe(expected);
  });

  it("replaces a lone surrogate, which PHP could not have read, with U+FFFD", () => {
    expect(phpJsonString("a\ud800b", json)).toBe('"a\\ufffdb"');
  });

  it("writes the same text whatever V8 holds the string as (one renderer call site sees them all, as in the server)", () => {
    // The renderers call string methods through String.prototype (string-calls.ts) once a call site
    // has met many representations; the text must not depend on which one a string is.
    const texts = ["颜色é/\n", "a\ud800b\udc00c", "🔥 x \u2028"];
    const long = "商品描述".repeat(40);
    for (const text of texts) {
      const forms = [
        text, // as written
        `${long}${text}`.slice(long.length), // sliced
        [...text].join(""), // joined
        text.slice(0, 1) + text.slice(1), // cons
        JSON.parse(JSON.stringify(text)) as string, // parsed
        String.fromCharCode(...Array.from({ length: text.length }, (_, i) => text.charCodeAt(i))), // built
      ];
      for (const options of [json, jsonu]) {
        const expected = phpJsonString(text, options);
        for (const form of forms) expect(phpJsonString(form, options)).toBe(expected);
      }
    }
    expect(phpJsonString("a\ud800b\udc00c", json)).toBe('"a\\ufffdb\\ufffdc"');
    expect(phpJsonString("a\ud800b\udc00c", jsonu)).toBe('"a\ufffdb\ufffdc"');
  });
});

// Expected texts checked against PHP 8.2's json_encode.
describe("PHP floats (serialize_precision = -1)", () => {
  it.each([
    [25.8, "25.8"],
    [30, "30"],
    [0, "0"],
    [-0, "-0"],
    [0.1, "0.1"],
    [1 / 3, "0.3333333333333333"],
    [0.0001, "0.0001"],
    [0.00001, "1.0e-5"],
    [1.5e-7, "1.5e-7"],
    [1e15, "1000000000000000"],
    [1e16, "10000000000000000"],
    [1e17, "1.0e+17"],
    [1e18, "1.0e+18"],
    [1.25e25, "1.25e+25"],
    [-108.3, "-108.3"],
  ])("%d -> %s", (n, text) => {
    expect(phpFloatText(n)).toBe(text);
  });

  it("refuses INF and NAN as PHP does", () => {
    expect(() => phpFloatText(Infinity)).toThrow();
    expect(() => phpFloatText(NaN)).toThrow();
  });
});

describe("PHP arrays", () => {
  it("writes lists, keyed arrays in order, ints, floats, null and booleans", () => {
    const value: PhpValue = new Map<string, PhpValue>([
      ["b", 1],
      ["a", new PhpFloat(2.5)],
      ["list", [1, "x", null, true, false]],
      ["empty_map", new Map()],
      ["empty_list", []],
      ["123", "numeric-looking key keeps its place"],
    ]);
    expect(phpJsonEncode(value, json)).toBe('{"b":1,"a":2.5,"list":[1,"x",null,true,false],"empty_map":[],"empty_list":[],"123":"numeric-looking key keeps its place"}');
  });
});
