// The README's "Calling from a browser" runs as printed: its shell lines, its
// signing endpoint (Node, no dependencies, sign.js fetched from the gateway),
// its page and its Connect-Web code bundled with esbuild, in Chromium, from
// another origin than the gateway's. Only addresses change: the README's
// gateway (127.0.0.1:8080) and page (port 3000) become this test's free
// ports, and its placeholders your-key / your-secret a real account.
import { execFile, spawn, type ChildProcess } from "node:child_process";
import { cpSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { join } from "node:path";
import { promisify } from "node:util";
import type { Browser } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { launchChromium, recordRequests, screenshotDir } from "./support/browser.ts";
import { demo, startGateway, type GatewayFixture } from "./support/gateway-fixture.ts";

const root = join(import.meta.dirname, "..");
const dir = screenshotDir("browser-example"); // inside the repository, so esbuild finds node_modules

/** The README's code blocks marked `<!-- browser-example: NAME -->`, by name. */
function readmeBlocks(): Map<string, string> {
  const readme = readFileSync(join(root, "README.md"), "utf8");
  const blocks = new Map<string, string>();
  for (const m of readme.matchAll(/<!-- browser-example: ([^>]+?) -->\n```\w*\n([\s\S]*?)\n```/g)) blocks.set(m[1]!, `${m[2]}\n`);
  return blocks;
}

function freePort(): Promise<number> {
  return new Promise((resolve) => {
    const s = createServer().listen(0, "127.0.0.1", () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => resolve(port));
    });
  });
}

let gw: GatewayFixture;
let browser: Browser;
let signer: ChildProcess | undefined;
let pagePort: number;

beforeAll(async () => {
  pagePort = await freePort();
  // The gateway lets exactly the page's origin call it.
  gw = await startGateway({ app: { console: true, corsOrigins: [`http://127.0.0.1:${pagePort}`] } });
  browser = await launchChromium();
}, 60_000);
afterAll(async () => {
  try {
    if (signer?.pid !== undefined) process.kill(-signer.pid); // bash and the node it started
  } catch {
    // already gone
  }
  await browser?.close();
  await gw?.close();
});

describe("the README's browser example", () => {
  it("signs at its own back end, calls over Connect-Web from another origin, and reads 0000, then 4007, from the status block, and the team's standing", async () => {
    const blocks = readmeBlocks();
    expect([...blocks.keys()].sort()).toEqual(["app.ts", "index.html", "shell 1", "shell 2", "signer.mjs"]);
    const account = await gw.newAccount({ name: "browser-example" });
    const local = (text: string) =>
      text
        .replaceAll("http://127.0.0.1:8080", gw.base)
        .replaceAll("3000", String(pagePort))
        .replaceAll("your-key", account.key)
        .replaceAll("your-secret", account.secret);
    rmSync(dir, { recursive: true, force: true });
    cpSync(join(root, "src/gen"), join(dir, "gen"), { recursive: true }); // what `buf generate` makes from proto/
    for (const name of ["signer.mjs", "index.html", "app.ts"]) writeFileSync(join(dir, name), local(blocks.get(name)!));

    // Asynchronously: the gateway answering the curl runs in this very process.
    const sh = (script: string) => promisify(execFile)("bash", ["-euc", script], { cwd: dir });
    await sh(local(blocks.get("shell 1")!));
    expect(readFileSync(join(dir, "sign.js"), "utf8")).toContain("GATEWAY-HMAC-SHA256");
    const [bundle, start] = local(blocks.get("shell 2")!).trim().split("\n");
    await sh(bundle!);
    // The back end runs on whichever `node` the shell finds, as a caller's would: sign.js needs only WebCrypto.
    signer = spawn("bash", ["-c", start!], { cwd: dir, stdio: ["ignore", "pipe", "pipe"], detached: true });
    let signerOutput = "";
    signer.stderr!.on("data", (d: Buffer) => (signerOutput += d.toString()));
    const pageUrl = `http://127.0.0.1:${pagePort}/`;
    for (let i = 0; i < 100; i++) {
      if (await fetch(pageUrl).then((r) => r.ok, () => false)) break;
      await new Promise((r) => setTimeout(r, 100));
    }

    const page = await browser.newPage();
    const requests = recordRequests(page);
    await page.goto(pageUrl);
    await page.getByRole("button", { name: "Show" }).click();
    await expect.poll(() => page.locator("#out").textContent(), { timeout: 10_000 }).toMatch(/^0000 \S/);
    await expect.poll(() => page.locator("#quota").textContent(), { timeout: 10_000 }).toBe("1 of 10000 calls today");
    const rows = (await gw.runtime.meter.query({ account: account.key, rows: 1 })).rows;
    expect(rows[0]).toMatchObject({ code: 0, transport: "connect" });

    await gw.runtime.admin.setStatus(account.key, "stopped");
    await page.getByRole("button", { name: "Show" }).click();
    await expect.poll(() => page.locator("#out").textContent(), { timeout: 10_000 }).toBe("4007 this account is stopped");
    await expect.poll(() => page.locator("#quota").textContent(), { timeout: 10_000 }).toBe("1 of 10000 calls today (stopped)");
    await page.screenshot({ path: join(dir, "stopped.png") });

    // The page talked to its own origin (page, bundle, /sign) and to the gateway; it never saw the secret.
    expect(requests.some((u) => u.startsWith(gw.base))).toBe(true);
    expect(requests.every((u) => u.startsWith(pageUrl) || u.startsWith(gw.base))).toBe(true);
    expect(requests.join(" ")).not.toContain(account.secret);
    expect(await page.content()).not.toContain(account.secret);
    expect(signerOutput).toBe("");
    await page.close();
    expect(demo.retailNumIid).toBe("600000006151"); // the number the printed page starts with
  });

  it("lets a page from another origin read what its limits still admit and when a refused call may come back: RateLimit and Retry-After are exposed, RetryInfo is in the error", async () => {
    // The example's page is still served (the test above started its back end); a page's fetch is what Connect-Web sends.
    const account = await gw.newAccount({ name: "browser-rate", rate: { calls: 1, seconds: 3600, burst: 1 } });
    const page = await browser.newPage();
    await page.goto(`http://127.0.0.1:${pagePort}/`);
    const answers = await page.evaluate(
      async ({ base, key, secret }) => {
        const call = async () => {
          const res = await fetch(`${base}/gateway.catalogue.v1.RetailService/ItemGet`, {
            method: "POST",
            headers: { "content-type": "application/json", "x-api-key": key, "x-api-secret": secret },
            body: JSON.stringify({ numIid: "600000006151" }),
          });
          const body = (await res.json()) as { code?: string; details?: { type: string; debug?: unknown }[] };
          return {
            status: res.status,
            retryAfter: res.headers.get("retry-after"),
            rateLimit: res.headers.get("ratelimit"),
            policy: res.headers.get("ratelimit-policy"),
            code: body.code ?? "",
            retryInfo: body.details?.find((d) => d.type === "google.rpc.RetryInfo")?.debug ?? null,
          };
        };
        return [await call(), await call()];
      },
      { base: gw.base, key: account.key, secret: account.secret },
    );
    // The headers a page reads are those the answer exposes (CORS): without them, the browser hands it null.
    const policy = `"daily";q=10000;w=86400, "rate";q=1;w=3600`;
    expect(answers[0]).toEqual({ status: 200, retryAfter: null, rateLimit: expect.stringMatching(/^"daily";r=9999;t=\d+, "rate";r=0;t=3600$/), policy, code: "", retryInfo: null });
    expect(answers[1]).toMatchObject({
      status: 429,
      retryAfter: "3600",
      rateLimit: expect.stringMatching(/^"daily";r=9999;t=\d+, "rate";r=0;t=(3599|3600)$/),
      policy,
      code: "resource_exhausted",
      retryInfo: { retryDelay: expect.stringMatching(/^359\d\.\d+s$/) },
    });
    await page.close();
  });
});
