// Debian's Chromium, driven by playwright-core, headless, with a fresh
// profile each launch, and with the flags that keep it quiet on a closed
// network (no background requests, no component updates, no QUIC).
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { chromium, type Browser, type Page } from "playwright-core";

export const chromiumPath = process.env.CHROMIUM_PATH ?? "/usr/bin/chromium";

export function launchChromium(): Promise<Browser> {
  return chromium.launch({
    executablePath: chromiumPath,
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
}

/** Where screenshots go: test-results/ (not committed), one folder per test file. */
export function screenshotDir(name: string): string {
  const dir = join(import.meta.dirname, "..", "..", "test-results", name);
  mkdirSync(dir, { recursive: true });
  return dir;
}

/** Records every request the page makes, to prove none leaves the gateway's origin. */
export function recordRequests(page: Page): string[] {
  const urls: string[] = [];
  page.on("request", (r) => urls.push(r.url()));
  return urls;
}
