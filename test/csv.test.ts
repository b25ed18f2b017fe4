// Usage as CSV (src/render/csv.ts): RFC 4180 quoting, and a text field a spreadsheet would run as a formula
// written after an apostrophe, read back with a strict reader (test/support/csv.ts). The CLI's `usage --csv` is
// tested in usage-addresses.test.ts, the console's downloads in console.test.ts.
import { describe, expect, it } from "vitest";
import { csvText } from "../src/render/csv.ts";
import { readCsv } from "./support/csv.ts";

describe("csvText", () => {
  it("quotes what must be quoted, writes numbers, booleans and big integers as they are, and ends every line with CRLF", () => {
    const text = csvText(["a", "b", "c"], [["plain", 'say "hi", twice', "two\nlines"], [12, 9007199254740993n, false], ["", "中文", "::ffff:10.1.2.3"]]);
    expect(text).toBe('a,b,c\r\nplain,"say ""hi"", twice","two\nlines"\r\n12,9007199254740993,false\r\n,中文,::ffff:10.1.2.3\r\n');
    expect(readCsv(text)).toEqual([["a", "b", "c"], ["plain", 'say "hi", twice', "two\nlines"], ["12", "9007199254740993", "false"], ["", "中文", "::ffff:10.1.2.3"]]);
  });

  it("writes a text that a spreadsheet would run as a formula after an apostrophe, and a negative number as a number", () => {
    const text = csvText(["x"], [["=HYPERLINK(\"http://evil\")"], ["+1"], ["-2"], ["@SUM(A1)"], ["\tx"], [-2], ["a=b"]]);
    expect(readCsv(text).slice(1).map((r) => r[0])).toEqual(["'=HYPERLINK(\"http://evil\")", "'+1", "'-2", "'@SUM(A1)", "'\tx", "-2", "a=b"]);
  });
});

