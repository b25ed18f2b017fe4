/**
 * Regenerates the README's settings table from the rows of src/config.ts
 * (`npm run docs`). test/config.test.ts fails while the two differ.
 */
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { settingsTable } from "../src/config.ts";

export const settingsBegin = "<!-- settings: generated from src/config.ts by `npm run docs`; edit the rows there -->";
export const settingsEnd = "<!-- settings:end -->";

/** The README with its settings block replaced by the generated table. */
export function withSettingsTable(readme: string): string {
  const a = readme.indexOf(settingsBegin);
  const b = readme.indexOf(settingsEnd);
  if (a < 0 || b < a) throw new Error("README.md has no settings block");
  return `${readme.slice(0, a + settingsBegin.length)}\n${settingsTable()}\n${readme.slice(b)}`;
}

if (import.meta.main) {
  const path = join(import.meta.dirname, "..", "README.md");
  writeFileSync(path, withSettingsTable(readFileSync(path, "utf8")));
  console.log("README.md: settings table regenerated");
}
