/**
 * Money as exact integers of micro-units (1 = 0.000001): balances and prices
 * never pass through binary floating point. Text form is a plain decimal.
 */
export type Micros = bigint;

const scale = 1_000_000n;
const decimal = /^(\d{1,12})(?:\.(\d{1,6}))?$/;

export class MoneyError extends Error {
  override name = "MoneyError";
}

/** Reads "12", "12.5" or "0.000001" (at most 6 decimals, not negative). */
export function parseMoney(text: string): Micros {
  const m = decimal.exec(text.trim());
  if (m === null) throw new MoneyError(`${JSON.stringify(text)} is not an amount such as 12.50 (at most 6 decimals)`);
  return BigInt(m[1]!) * scale + BigInt((m[2] ?? "").padEnd(6, "0"));
}

/** "12.5", "0.000001", "-3" — the shortest exact decimal text. */
export function formatMoney(micros: Micros): string {
  const negative = micros < 0n;
  const abs = negative ? -micros : micros;
  const fraction = (abs % scale).toString().padStart(6, "0").replace(/0+$/, "");
  return `${negative ? "-" : ""}${abs / scale}${fraction === "" ? "" : `.${fraction}`}`;
}
