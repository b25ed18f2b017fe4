import { demoDetailCopies } from "../../src/catalogue/demo-dataset.ts";

/** A retail catalogue of `n` distinct items from `firstId` on, as import lines (demoDetailCopies). */
export function distinctItems(n: number, firstId: number): Record<string, unknown>[] {
  return [...demoDetailCopies(n, firstId)];
}
