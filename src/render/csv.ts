/**
 * Values as CSV (RFC 4180): a header line, then a line per row, fields
 * separated by commas and lines ended by CRLF; a field is quoted (its
 * quotes doubled) when it holds a comma, a quote or a line break. A text
 * field a spreadsheet would take for a formula (`=`, `+`, `-`, `@`, a tab
 * or a carriage return first) is written after an apostrophe, as OWASP
 * advises against CSV injection; numbers are written as they are.
 * Plain TypeScript: the CLI and the console (in the browser) both use it.
 */
export type CsvValue = string | number | bigint | boolean;

export function csvText(header: readonly string[], rows: readonly (readonly CsvValue[])[]): string {
  return csvLines([header, ...rows]);
}

/** Lines of CSV, each ended by CRLF, with no header: what follows `csvText`'s, for a table written a part at a time. */
export function csvLines(rows: readonly (readonly CsvValue[])[]): string {
  return rows.map((row) => `${row.map(field).join(",")}\r\n`).join("");
}

function field(value: CsvValue): string {
  let text = String(value);
  if (typeof value === "string" && /^[=+\-@\t\r]/.test(text)) text = `'${text}`;
  return /[",\r\n]/.test(text) ? `"${text.replaceAll('"', '""')}"` : text;
}
