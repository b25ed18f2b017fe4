import { demoRecords } from "../../src/catalogue/demo-dataset.ts";

/**
 * A retail catalogue of `n` distinct items, as import lines: the demo's
 * detail records under new ids from `firstId` on, each title numbered, so
 * every item decodes and renders to its own strings.
 */
export function distinctItems(n: number, firstId: number): Record<string, unknown>[] {
  const details = demoRecords().filter((r) => r.kind === "item_detail" && r.obtainable && (r.catalogue ?? "retail") === "retail");
  return Array.from({ length: n }, (_, i) => {
    const r = structuredClone(details[i % details.length]!) as { item: { num_iid: string; title: string } };
    r.item.num_iid = String(firstId + i);
    r.item.title = `${r.item.title} ${i}`;
    return r as unknown as Record<string, unknown>;
  });
}
