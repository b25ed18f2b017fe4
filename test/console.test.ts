// The console in a real browser: Debian's Chromium, headless, driving the
// page the gateway serves, which talks to it only through Connect-Web.
// Screenshots of each screen go to test-results/console/ (not committed).
import { createHmac } from "node:crypto";
import { existsSync, readFileSync } from "node:fs";
import net from "node:net";
import { join } from "node:path";
import type { Browser, Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { adminToken, demo, legacyGet, startGateway, type GatewayFixture } from "./support/gateway-fixture.ts";
import { chromiumPath, launchChromium, recordRequests, screenshotDir } from "./support/browser.ts";
import { AlertDeliveries } from "../src/exporters/alert-webhooks.ts";
import { receiver } from "./support/receiver.ts";

const shots = screenshotDir("console");
let gw: GatewayFixture;
let browser: Browser;

beforeAll(async () => {
  // As `gateway serve` would start it with GATEWAY_MAX_CONNECTIONS=50000 under an open-files limit of 10,256: lowered to 10,000.
  gw = await startGateway({ app: { console: true, openFiles: { limit: 10_256, maxConnectionsSet: 50_000 } } });
  browser = await launchChromium();
}, 60_000);
afterAll(async () => {
  await browser?.close();
  await gw?.close();
});

async function signedIn(viewport = { width: 1280, height: 900 }, token = adminToken): Promise<{ page: Page; requests: string[] }> {
  const page = await browser.newPage({ viewport });
  const requests = recordRequests(page);
  await page.goto(`${gw.base}/console/`);
  await page.getByLabel("Admin token").fill(token);
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.getByRole("heading", { name: "Accounts" }).waitFor();
  return { page, requests };
}

describe("the console", () => {
  it("is where Chromium is", () => expect(existsSync(chromiumPath), `${chromiumPath} (apt-get install chromium)`).toBe(true));

  it("refuses a wrong admin token in words, and keeps the token out of the URL", async () => {
    const page = await browser.newPage();
    await page.goto(`${gw.base}/console`); // redirected to /console/
    expect(new URL(page.url()).pathname).toBe("/console/");
    await page.getByLabel("Admin token").fill("not-the-token");
    await page.getByRole("button", { name: "Sign in" }).click();
    await expect.poll(() => page.getByRole("alert").textContent()).toContain("admin token is not valid");
    expect(page.url()).not.toContain("not-the-token");
    expect(await page.evaluate<number>("sessionStorage.length")).toBe(0);
    await page.screenshot({ path: join(shots, "1-sign-in-refused.png"), fullPage: true });
    await page.close();
  });

  it("says so when the admin API is off, and is not served at all unless asked for", async () => {
    const { buildApp } = await import("../src/transports/server/app.ts");
    const off = await buildApp({ gateway: gw.runtime.gateway, logLevel: false, console: true, admin: { ports: gw.runtime, token: "" } });
    await off.listen({ host: "127.0.0.1", port: 0 });
    const plain = await startGateway(); // as `gateway serve` builds it: GATEWAY_CONSOLE=auto outside the demo
    try {
      const page = await browser.newPage();
      await page.goto(`http://127.0.0.1:${(off.server.address() as { port: number }).port}/console/`);
      await page.getByLabel("Admin token").fill("anything-at-all");
      await page.getByRole("button", { name: "Sign in" }).click();
      await expect.poll(() => page.getByRole("alert").textContent()).toContain("admin API is off");
      await page.close();
      const res = await fetch(`${plain.base}/console/`);
      expect(res.headers.get("content-type")).not.toContain("text/html");
      expect(await fetch(`${plain.base}/console/app.js`).then((r) => r.headers.get("content-type"))).not.toContain("javascript");
    } finally {
      await off.close();
      await plain.close();
    }
  });

  it("signs in, creates an account showing its secret once, and the secret works", async () => {
    const { page, requests } = await signedIn();
    await expect.poll(() => page.getByTestId("signed-in-as").textContent()).toBe("Signed in with the gateway's token");
    await page.getByLabel("Name").fill("browser-team");
    await page.getByLabel("Calls a day").first().fill("500");
    await page.getByLabel("Prepaid balance").fill("10");
    await page.getByLabel("Price of retail/item_get").fill("0.5");
    await page.getByRole("button", { name: "Create account" }).click();
    const key = (await page.getByTestId("new-key").textContent())!;
    const secret = (await page.getByTestId("new-secret").textContent())!;
    expect(key).toMatch(/^\w{16}$/);
    expect(secret).toHaveLength(40);
    await page.screenshot({ path: join(shots, "2-account-created.png"), fullPage: true });
    const account = await gw.runtime.admin.get(key);
    expect(account).toMatchObject({ name: "browser-team", dailyMax: 500, balance: 10_000_000n });
    expect(account.prices.get("retail/item_get" as never)).toBe(500_000n);
    expect((await legacyGet(gw.base, "/retail/item_get/", { key, secret, num_iid: demo.retailNumIid })).json.error_code).toBe("0000");
    // The secret is gone once the operator says it is stored.
    await page.getByRole("button", { name: "I have stored it" }).click();
    expect(await page.content()).not.toContain(secret);
    expect(requests.every((u) => u.startsWith(gw.base)), requests.filter((u) => !u.startsWith(gw.base)).join(" ")).toBe(true);
    await page.close();
  });

  it("creates an account under an external id once: the same form sent again finds it, with no secret", async () => {
    const { page } = await signedIn();
    const fill = async () => {
      await page.getByLabel("Name").fill("billing-made");
      await page.getByLabel("External id").fill("cus_browser_1");
      await page.getByLabel("Prepaid balance").fill("3");
      await page.getByRole("button", { name: "Create account" }).click();
    };
    await fill();
    const key = (await page.getByTestId("new-key").textContent())!;
    await page.getByRole("button", { name: "I have stored it" }).click();
    await fill();
    await expect.poll(() => page.getByText(/was made before with this external id/).textContent()).toContain(key);
    expect(await page.getByTestId("new-secret").count()).toBe(0);
    expect((await gw.runtime.admin.get(key)).balance).toBe(3_000_000n);
    await page.getByLabel("Search accounts").fill("CUS_BROWSER");
    // The accounts' own rows (the account made is open, and its detail has tables of its own).
    await expect.poll(() => page.locator("table.accounts > tbody > tr[data-key]").count()).toBe(1);
    expect(await page.locator(`tr[data-key="${key}"]`).textContent()).toContain("external id cus_browser_1");
    await page.close();
  });

  it("searches, stops and resumes an account, disables an operation, sets the plan, tops up and rotates the secret", async () => {
    const { key, secret } = await gw.newAccount({ name: "ops-target", balance: 1_000_000n });
    // Signed in as a named admin: its changes are recorded under its name.
    const { page } = await signedIn(undefined, (await gw.runtime.admins.add("ops")).token);
    // Who is signed in, as the history records its changes (WhoAmI).
    await expect.poll(() => page.getByTestId("signed-in-as").textContent()).toBe("Signed in as ops");
    expect(await page.getByTestId("signed-in-as").getAttribute("title")).toBe("Changes are recorded as made by admin-api ops@127.0.0.1");
    await page.getByLabel("Search accounts").fill("ops-target");
    await expect.poll(() => page.locator("table.accounts tbody tr").count()).toBe(1);
    await page.getByRole("button", { name: "ops-target" }).click();
    const detail = page.getByRole("region", { name: `Account ${key}` });

    await detail.getByRole("button", { name: "Stop account" }).click();
    await page.getByText("Stop: done.").waitFor();
    expect((await gw.runtime.admin.get(key)).status).toBe("stopped");
    expect((await legacyGet(gw.base, "/retail/item_get/", { key, secret, num_iid: demo.retailNumIid })).json.error_code).toBe("4007");
    await page.getByLabel("Status").selectOption("stopped");
    await expect.poll(() => page.locator("table.accounts tbody tr[data-key]").count()).toBe(1);
    await page.screenshot({ path: join(shots, "3-account-stopped.png"), fullPage: true });
    await detail.getByRole("button", { name: "Resume account" }).click();
    await page.getByText("Resume: done.").waitFor();
    expect((await gw.runtime.admin.get(key)).status).toBe("active");
    await page.getByLabel("Status").selectOption("all");

    await detail.getByRole("button", { name: "Disable retail/item_get" }).click();
    await page.getByText("Stop retail/item_get: done.").waitFor();
    expect((await legacyGet(gw.base, "/retail/item_get/", { key, secret, num_iid: demo.retailNumIid })).json.error_code).toBe("4006");
    await detail.getByRole("button", { name: "Enable retail/item_get" }).click();
    await page.getByText("Enable retail/item_get: done.").waitFor();

    const plan = page.getByRole("form", { name: `Plan of ${key}` });
    await plan.getByLabel("Calls a day").fill("77");
    await plan.getByLabel("Calls at once").fill("3");
    await plan.getByLabel("Rate limit").fill("2/min");
    await plan.getByRole("button", { name: "Set plan" }).click();
    await page.getByText("Set plan: done.").waitFor();
    expect(await gw.runtime.admin.get(key)).toMatchObject({ dailyMax: 77, concurrency: 3, rate: { calls: 2, seconds: 60, burst: 2 } });
    await expect.poll(() => page.locator(`tr[data-key="${key}"] td`).nth(5).textContent()).toBe("2/min");
    // A rate the form cannot read is refused before it is sent; then the burst alone, then none.
    await plan.getByLabel("Rate limit").fill("2/day");
    await plan.getByRole("button", { name: "Set plan" }).click();
    await expect.poll(() => detail.getByRole("alert").textContent()).toContain("Not accepted: a rate is calls per s, min or h");
    await plan.getByLabel("Rate limit").fill("2/min");
    await plan.getByLabel("Burst").fill("5");
    await plan.getByRole("button", { name: "Set plan" }).click();
    await page.getByText("Set plan: done.").waitFor();
    await expect.poll(() => page.locator(`tr[data-key="${key}"] td`).nth(5).textContent()).toBe("2/min, burst 5");
    await plan.getByLabel("Rate limit").fill("none");
    await plan.getByLabel("Burst").fill("");
    await plan.getByRole("button", { name: "Set plan" }).click();
    await page.getByText("Set plan: done.").waitFor();
    expect((await gw.runtime.admin.get(key)).rate).toBeUndefined();
    // The addresses the key works from (this browser's among them), a list the gateway refuses, then anywhere again.
    await plan.getByLabel("Calls from").fill("127.0.0.1, 10.0.0.0/8");
    await plan.getByRole("button", { name: "Set plan" }).click();
    await page.getByText("Set plan: done.").waitFor();
    expect((await gw.runtime.admin.get(key)).allowedFrom).toEqual(["127.0.0.1", "10.0.0.0/8"]);
    await plan.getByLabel("Calls from").fill("10.0.0.0/40");
    await plan.getByRole("button", { name: "Set plan" }).click();
    await expect.poll(() => detail.getByRole("alert").textContent()).toContain("a network's prefix is 0 to 32");
    await plan.getByLabel("Calls from").fill("any");
    await plan.getByRole("button", { name: "Set plan" }).click();
    await page.getByText("Set plan: done.").waitFor();
    expect((await gw.runtime.admin.get(key)).allowedFrom).toBeUndefined();

    const topUp = page.getByRole("form", { name: `Top up ${key}` });
    await topUp.getByLabel("Amount").fill("2.5");
    await topUp.getByRole("button", { name: "Top up" }).click();
    await page.getByText("Top up 2.5: done.").waitFor();
    expect((await gw.runtime.admin.get(key)).balance).toBe(3_500_000n);
    // With the payment's reference: made once; the same again adds nothing, and says so.
    await topUp.getByLabel("Amount").fill("1");
    await topUp.getByLabel("Reference").fill("inv-2026-118");
    await topUp.getByRole("button", { name: "Top up" }).click();
    await page.getByText("Top up 1: done.").waitFor();
    await topUp.getByLabel("Amount").fill("1");
    await topUp.getByLabel("Reference").fill("inv-2026-118");
    await topUp.getByRole("button", { name: "Top up" }).click();
    await page.getByText("Top up 1: already made with reference inv-2026-118; nothing added.").waitFor();
    expect((await gw.runtime.admin.get(key)).balance).toBe(4_500_000n);
    await topUp.getByLabel("Reference").fill("");
    await topUp.getByLabel("Amount").fill("lots");
    await topUp.getByRole("button", { name: "Top up" }).click();
    await expect.poll(() => detail.getByRole("alert").textContent()).toContain("Not accepted");

    page.once("dialog", (d) => void d.accept());
    await detail.getByRole("button", { name: "Rotate secret" }).click();
    const rotated = (await page.getByTestId("new-secret").textContent())!;
    expect(rotated).toHaveLength(40);
    expect((await legacyGet(gw.base, "/retail/item_get/", { key, secret, num_iid: demo.retailNumIid })).json.error_code).toBe("4005");
    expect((await legacyGet(gw.base, "/retail/item_get/", { key, secret: rotated, num_iid: demo.retailNumIid })).json.error_code).toBe("0000");
    // Again, keeping the old secret a day: both work, and the account says until when.
    await detail.getByLabel("Keep the old secret").selectOption({ label: "1 day" });
    let asked = "";
    page.once("dialog", (d) => void ((asked = d.message()), d.accept()));
    await detail.getByRole("button", { name: "Rotate secret" }).click();
    await expect.poll(() => page.getByTestId("new-secret").textContent()).not.toBe(rotated);
    const kept = (await page.getByTestId("new-secret").textContent())!;
    expect(asked).toContain("keeps working for 1 day");
    expect((await legacyGet(gw.base, "/retail/item_get/", { key, secret: rotated, num_iid: demo.retailNumIid })).json.error_code).toBe("0000");
    expect((await legacyGet(gw.base, "/retail/item_get/", { key, secret: kept, num_iid: demo.retailNumIid })).json.error_code).toBe("0000");
    await page.getByTestId("old-secret-until").waitFor();
    expect(Math.abs((await gw.runtime.admin.get(key)).previousSecrets![0]!.until - (Date.now() + 86_400_000))).toBeLessThan(60_000);
    await page.screenshot({ path: join(shots, "4-account-detail.png"), fullPage: true });

    // Everything above, in the account's history, newest first; it stays open while the detail is drawn again.
    const history = detail.locator("details.history");
    await history.locator("summary").click();
    await expect.poll(() => history.locator("tbody tr").count()).toBe(15);
    const whats = await history.locator("tbody tr td:nth-child(2)").allTextContents();
    // Two top-ups: the one with a reference was made once.
    expect(whats).toEqual(["secret", "secret", "top-up", "top-up", "plan", "plan", "plan", "plan", "plan", "operation", "operation", "status", "status", "opening", "created"]);
    const bys = await history.locator("tbody tr td:nth-child(3)").allTextContents();
    expect(bys).toEqual([...Array(13).fill("admin-api ops@127.0.0.1"), "gateway", "gateway"]);
    const text = (await history.textContent())!;
    expect(text).toContain("inv-2026-118");
    for (const moved of ["dailyMax: 10000 → 77", "concurrency: 20 → 3", "rate: (none) → 2/min", "rate: 2/min → 2/min, burst 5", "rate: 2/min, burst 5 → (none)", "allowedFrom: (any) → 127.0.0.1, 10.0.0.0/8", "allowedFrom: 127.0.0.1, 10.0.0.0/8 → (any)", "balance: 1 → 3.5", "operations[retail/item_get]: enabled → stopped", "status: active → stopped", "secret: rotated"]) {
      expect(text).toContain(moved);
    }
    expect(text).not.toContain(secret);
    await page.screenshot({ path: join(shots, "4b-account-history.png"), fullPage: true });
    await detail.getByRole("button", { name: "Stop account" }).click();
    await page.getByText("Stop: done.").waitFor();
    await expect.poll(() => detail.locator("details.history tbody tr").count()).toBe(16);
    await page.close();
  });

  it("sets an account's alerts, shows their secret once, lists what they told, and turns them off", async () => {
    const hooks = await receiver();
    const deliveries = new AlertDeliveries(gw.runtime.alerts);
    try {
      const hookUrl = `${hooks.url}/alerts?token=in-the-url`;
      const { key, secret } = await gw.newAccount({ name: "alerts-target", dailyMax: 2 });
      const { page } = await signedIn();
      await page.getByLabel("Search accounts").fill("alerts-target");
      await expect.poll(() => page.locator("table.accounts tbody tr").count()).toBe(1);
      await page.getByRole("button", { name: "alerts-target" }).click();
      const form = page.getByRole("form", { name: `Alerts of ${key}` });
      await form.getByLabel("Alert URL").fill(hookUrl);
      // A share the form cannot read is refused before it is sent.
      await form.getByLabel("At % of the day").fill("50, lots");
      await form.getByRole("button", { name: "Set alerts" }).click();
      const detail = page.getByRole("region", { name: `Account ${key}` });
      await expect.poll(() => detail.getByRole("alert").textContent()).toContain('not "lots"');
      await form.getByLabel("At % of the day").fill("50, 100");
      await form.getByRole("button", { name: "Set alerts" }).click();
      await page.getByText("Set alerts: done.").waitFor();
      const alertSecret = (await page.getByRole("region", { name: `Alert secret of ${key}` }).getByTestId("new-secret").textContent())!;
      expect(alertSecret).toMatch(/^whsec_/);
      expect((await gw.runtime.admin.get(key)).alerts).toEqual({ url: hookUrl, usagePercents: [50, 100] });
      // Two calls cross both lines; the alerts are delivered, signed with the secret shown, and listed with their delivery.
      for (let i = 0; i < 2; i++) expect((await legacyGet(gw.base, "/retail/item_get/", { key, secret, num_iid: demo.retailNumIid })).json.error_code).toBe("0000");
      expect(await deliveries.poll()).toBe(2);
      expect(hooks.got).toHaveLength(2);
      for (const g of hooks.got) {
        const [, t, v1] = /^t=(\d+),v1=([0-9a-f]+)$/.exec(String(g.headers["gateway-signature"]))!;
        expect(createHmac("sha256", alertSecret).update(`${t}.${g.body}`).digest("hex")).toBe(v1);
      }
      const told = detail.locator("details.alerts");
      await told.locator("summary").click();
      await expect.poll(() => told.locator("tbody tr").count()).toBe(2);
      const rows = await told.locator("tbody tr td:nth-child(3)").allTextContents();
      expect(rows[0]).toMatch(/^100% of 2 reached on \d{4}-\d\d-\d\d \(2 calls\)$/);
      expect(rows[1]).toMatch(/^50% of 2 reached on .* \(1 calls\)$/);
      for (const d of await told.locator("tbody tr td:nth-child(4)").allTextContents()) expect(d).toMatch(/^delivered /);
      await page.screenshot({ path: join(shots, "4c-account-alerts.png"), fullPage: true });
      // The history names the URL's origin only.
      const history = detail.locator("details.history");
      await history.locator("summary").click();
      await expect.poll(() => history.textContent()).toContain("alertSecret: (none) → made");
      expect(await history.textContent()).not.toContain("in-the-url");
      await form.getByRole("button", { name: "Send a test alert" }).click();
      await expect.poll(() => page.locator("body").textContent()).toMatch(/Send a test alert: alert-test-[0-9a-f]{12} delivered \(HTTP 204, \d+ ms\)\./);
      expect(JSON.parse(hooks.got.at(-1)!.body)).toMatchObject({ type: "alert.test", account: key });
      // A new alert secret keeping the old one a day: the new one shown once, the old one said to sign until then.
      await form.getByLabel("Keep the old alert secret").selectOption({ label: "1 day" });
      page.once("dialog", (d) => void d.accept());
      await form.getByRole("button", { name: "New alert secret" }).click();
      await page.getByText("New alert secret: done.").waitFor();
      const newAlertSecret = (await page.getByRole("region", { name: `Alert secret of ${key}` }).getByTestId("new-secret").textContent())!;
      expect(newAlertSecret).toMatch(/^whsec_/);
      expect(newAlertSecret).not.toBe(alertSecret);
      await expect.poll(() => detail.getByTestId("old-alert-secret-until").textContent()).toMatch(/signed with the replaced alert secret too until/);
      const rolled = await gw.runtime.admin.get(key);
      expect([rolled.alertSecret, rolled.previousAlertSecrets?.map((k) => k.secret)]).toEqual([newAlertSecret, [alertSecret]]);
      expect(rolled.previousAlertSecrets![0]!.until - Date.now()).toBeGreaterThan(86_000_000);
      await form.getByRole("button", { name: "Turn alerts off" }).click();
      await page.getByText("Turn alerts off: done.").waitFor();
      expect((await gw.runtime.admin.get(key)).alerts).toBeUndefined();
      await page.close();
    } finally {
      await hooks.close();
    }
  });

  it("puts an operation under maintenance and ends it, showing who switched it and when", async () => {
    const { page } = await signedIn(undefined, (await gw.runtime.admins.add("maint")).token);
    await page.getByRole("link", { name: "Maintenance" }).click();
    await page.getByRole("heading", { name: "Maintenance" }).waitFor();
    const row = page.locator('tr[data-operation="wholesale/item_get"]');
    expect(await row.locator(".badge").textContent()).toBe("serving");
    let asked = "";
    page.once("dialog", (d) => void ((asked = d.message()), d.accept()));
    await page.getByRole("button", { name: "Put wholesale/item_get under maintenance" }).click();
    await page.getByText("wholesale/item_get: under maintenance.").waitFor();
    expect(asked).toContain("calls of it answer 4009");
    expect(await row.locator(".badge").textContent()).toBe("under maintenance");
    const called = () => legacyGet(gw.base, "/wholesale/item_get/", { key: gw.account.key, secret: gw.account.secret, num_iid: demo.wholesaleNumIid }).then((r) => r.json.error_code);
    expect(await called()).toBe("4009");
    await page.screenshot({ path: join(shots, "5b-maintenance.png"), fullPage: true });
    await page.getByRole("button", { name: "End maintenance of wholesale/item_get" }).click();
    await page.getByText("wholesale/item_get: serving again.").waitFor();
    expect(await called()).toBe("0000");
    const history = page.locator("table.maintenance-history tbody tr");
    await expect.poll(() => history.count()).toBeGreaterThanOrEqual(2);
    expect((await history.nth(0).locator("td").allTextContents()).slice(1)).toEqual(["wholesale/item_get", "off", "admin-api maint@127.0.0.1"]);
    expect((await history.nth(1).locator("td").allTextContents()).slice(1)).toEqual(["wholesale/item_get", "on", "admin-api maint@127.0.0.1"]);
    await page.close();
  });

  it("purges an item's cached answers, then the whole cache, from the maintenance page, asking first", async () => {
    const call = () => legacyGet(gw.base, "/retail/item_get/", { key: gw.account.key, secret: gw.account.secret, num_iid: demo.retailNumIid }).then((r) => r.json.cache);
    // The gateway's own catalogue: kept from the second request on, so the third is a hit.
    await call();
    await call();
    expect(await call()).toBe(1);
    const { page } = await signedIn();
    await page.getByRole("link", { name: "Maintenance" }).click();
    await page.getByRole("heading", { name: "Purge the response cache" }).waitFor();
    await page.getByLabel("Operation").selectOption("retail/item_get");
    await page.getByLabel("Item (num_iid)").fill(demo.retailNumIid);
    let asked = "";
    page.once("dialog", (d) => void ((asked = d.message()), d.accept()));
    await page.getByRole("button", { name: "Purge" }).click();
    await page.getByText(new RegExp(`^Dropped [1-9][0-9]* cached answers? \\(item ${demo.retailNumIid} of retail/item_get\\)\\.$`)).waitFor();
    expect(asked).toContain(`item ${demo.retailNumIid} of retail/item_get`);
    expect(await call()).toBe(0);
    // Neither an operation nor an item: the whole cache, said so before and after.
    await page.getByLabel("Operation").selectOption("");
    await page.getByLabel("Item (num_iid)").fill("");
    page.once("dialog", (d) => void ((asked = d.message()), d.accept()));
    await page.getByRole("button", { name: "Purge" }).click();
    await page.getByText(/^Dropped \d+ cached answers? \(the whole cache\)\.$/).waitFor();
    expect(asked).toContain("whole response cache");
    expect(gw.runtime.cache!.bytes).toBe(0);
    await page.screenshot({ path: join(shots, "5c-cache-purge.png"), fullPage: true });
    await page.close();
  });

  it("shows the connections the gateway holds and who holds the most, and refreshes them", async () => {
    const sockets: net.Socket[] = [];
    /** A connection from 127.0.0.7 that made a request and stays open. */
    const hold = () =>
      new Promise<void>((resolve, reject) => {
        const socket = net.connect({ port: gw.port, host: "127.0.0.1", localAddress: "127.0.0.7" }, () => socket.write("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"));
        sockets.push(socket);
        socket.once("error", reject);
        socket.once("data", () => resolve());
      });
    try {
      await Promise.all([hold(), hold(), hold()]);
      const { page } = await signedIn();
      await page.getByRole("link", { name: "Connections" }).click();
      await page.getByRole("heading", { name: "Connections" }).waitFor();
      expect(await page.getByTestId("node").textContent()).toBe(gw.runtime.gateway.nodeLabel);
      const row = page.locator('table.connections tr[data-address="127.0.0.7"] td');
      expect(await row.allTextContents()).toEqual(["127.0.0.7", "3", "under 0.1% of the cap", ""]);
      // The browser's own connections come from 127.0.0.1.
      expect(await page.locator('table.connections tr[data-address="127.0.0.1"]').count()).toBe(1);
      expect(await page.getByTestId("per-address").locator("strong").textContent()).toBe("none");
      expect(await page.getByTestId("refused").locator("strong").textContent()).toBe("none");
      expect(await page.getByTestId("open").locator("strong").textContent()).toMatch(/^\d+ of 10,000$/);
      expect(await page.getByTestId("open").locator("small").textContent()).toMatch(/; the cap is lowered from 50,000 to fit the open-files limit \(10,256\): raise it to keep 50,000$/);
      // Seventeen more from 127.0.0.7: Refresh shows twenty, and 127.0.0.7 first.
      await Promise.all(Array.from({ length: 17 }, hold));
      await page.getByRole("button", { name: "Refresh" }).click();
      await expect.poll(() => row.nth(1).textContent()).toBe("20");
      expect(await row.nth(2).textContent()).toBe("0.2% of the cap");
      expect(await page.locator("table.connections tbody tr").first().getAttribute("data-address")).toBe("127.0.0.7");
      await page.screenshot({ path: join(shots, "5d-connections.png"), fullPage: true });
      await page.close();
    } finally {
      for (const s of sockets) s.destroy();
    }
  });

  it("follows calls live from now, filters them, pauses and resumes with none lost, rides out a cut, and ends its stream when left", async () => {
    const call = async (numIid: string = demo.retailNumIid) =>
      (await legacyGet(gw.base, "/retail/item_get/", { key: gw.account.key, secret: gw.account.secret, num_iid: numIid })).json.request_id as string;
    const before = await call();
    const { page } = await signedIn();
    await page.getByRole("link", { name: "Live calls" }).click();
    await page.getByRole("heading", { name: "Live calls" }).waitFor();
    await page.getByText("Following: each call appears as the ledger commits it.").waitFor();
    // Caught up, the page's stream waits on the ledger's commits.
    await expect.poll(() => gw.runtime.ledgerCommits.waiting).toBeGreaterThanOrEqual(1);
    const rows = page.locator("table.live tbody tr");
    const shown = () => rows.evaluateAll((trs) => trs.map((tr) => tr.getAttribute("data-request-id")));
    expect(await shown()).toEqual([]);

    // As they commit, newest first; a refusal marked. Nothing from before the page began.
    const ok = await call();
    const refused = await call("not-a-number");
    await expect.poll(shown).toEqual([refused, ok]);
    expect(await shown()).not.toContain(before);
    expect(await rows.first().getAttribute("class")).toBe("refused");
    expect(await rows.first().locator("td").nth(4).textContent()).toBe("4003");
    expect(await rows.nth(1).locator("td").allTextContents()).toEqual([
      expect.stringMatching(/^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d$/),
      ok,
      gw.account.key,
      "retail/item_get",
      "0000",
      "legacy",
      "127.0.0.1",
      expect.stringMatching(/^(hit|)$/),
      expect.stringMatching(/^\d+\.\d$/),
      expect.stringMatching(/^\d+(\.\d+)?$/),
    ]);
    expect(await page.getByTestId("live-calls").locator("strong").textContent()).toBe("2");
    expect(await page.getByTestId("live-refused").locator("strong").textContent()).toBe("1");
    // "Refusals only" looks through the calls kept.
    await page.getByLabel("Refusals only").check();
    await expect.poll(shown).toEqual([refused]);
    expect(await page.locator("table.live caption").textContent()).toBe("The 1 latest call of this filter, newest first");
    await page.getByLabel("Refusals only").uncheck();
    await expect.poll(shown).toEqual([refused, ok]);

    // Paused, the stream ends and its place is kept; resumed, the calls made meanwhile come, none lost.
    await page.getByRole("button", { name: "Pause" }).click();
    await expect.poll(() => gw.runtime.ledgerCommits.waiting).toBe(0);
    const whilePaused = [await call(), await call()];
    await new Promise((r) => setTimeout(r, 500));
    expect(await shown()).toEqual([refused, ok]);
    await page.getByRole("button", { name: "Resume" }).click();
    await expect.poll(shown).toEqual([...whilePaused].reverse().concat([refused, ok]));

    // Every connection cut by the gateway: the page says so, tries again from its cursor, and the call made in
    // between is shown (a page that began again from now would have lost it).
    await page.getByText("Following: each call appears as the ledger commits it.").waitFor();
    gw.app.server.closeAllConnections();
    const inTheGap = await call();
    await expect.poll(shown, { timeout: 20_000 }).toEqual([inTheGap, ...[...whilePaused].reverse(), refused, ok]);
    expect(await page.getByTestId("live-calls").locator("strong").textContent()).toBe("5");
    await page.screenshot({ path: join(shots, "5e-live-calls.png"), fullPage: true });

    // An account chosen: the page starts again, and the gateway sends only that account's calls (the figures count
    // every call the page was sent, so the other team's would show there).
    const other = await gw.newAccount({ name: "live-other-team" });
    const otherCall = () => legacyGet(gw.base, "/retail/item_get/", { key: other.key, secret: other.secret, num_iid: demo.retailNumIid }).then((r) => r.json.request_id as string);
    await page.getByLabel("Find by name or key").fill("live-other");
    await expect.poll(() => page.getByLabel("Account", { exact: true }).locator("option").count()).toBe(2);
    await page.getByLabel("Account", { exact: true }).selectOption(other.key);
    await expect.poll(shown).toEqual([]);
    expect(await page.getByTestId("live-calls").locator("strong").textContent()).toBe("0");
    const mine = [await otherCall(), await call(), await call(), await otherCall()];
    await expect.poll(shown).toEqual([mine[3], mine[0]]);
    await new Promise((r) => setTimeout(r, 300));
    expect(await page.getByTestId("live-calls").locator("strong").textContent()).toBe("2");
    // Every account again: from where it stood, everyone's.
    await page.getByLabel("Account", { exact: true }).selectOption("");
    await expect.poll(shown).toEqual([]);
    const everyone = [await call(), await otherCall()];
    await expect.poll(shown).toEqual([everyone[1], everyone[0]]);

    // Left for another screen, the stream ends: nothing waits on the commits for it.
    await page.getByRole("link", { name: "Accounts" }).click();
    await page.getByRole("heading", { name: "Accounts" }).waitFor();
    await expect.poll(() => gw.runtime.ledgerCommits.waiting).toBe(0);
    await page.close();
  });

  it("calls each transport from the explorer, shows the calls in usage, and answers a stopped account's next call with 4007", async () => {
    const { page, requests } = await signedIn();
    await page.getByLabel("Name").fill("explorer-team");
    await page.getByRole("button", { name: "Create account" }).click();
    const key = (await page.getByTestId("new-key").textContent())!;
    await page.getByRole("link", { name: "Explorer" }).click();
    await page.getByRole("heading", { name: "Explorer" }).waitFor();
    const call = async (operation: string, transport: string, args: Record<string, string>) => {
      await page.getByLabel("Operation").selectOption(operation);
      await page.getByLabel("Account").selectOption(key);
      await page.getByLabel("Transport").selectOption(transport);
      for (const [name, value] of Object.entries(args)) await page.getByLabel(new RegExp(`^${name}`)).fill(value);
      await page.getByRole("button", { name: "Send" }).click();
      await page.getByTestId("result-code").waitFor();
      return (await page.getByTestId("result-code").textContent())!;
    };
    const item = { num_iid: demo.retailNumIid };
    expect(await call("retail/item_get", "connect-json", item)).toBe("0000");
    expect(await page.getByTestId("result-status").textContent()).toContain("requestId");
    expect(await page.locator("pre.command").first().textContent()).toMatch(/^curl -H 'content-type: application\/json' -H 'x-api-key: /);
    await page.screenshot({ path: join(shots, "6-explorer-connect-json.png"), fullPage: true });
    expect(await call("retail/item_get", "connect-binary", item)).toBe("0000");
    expect(await call("wholesale/item_search_peerbuy", "grpc-web", { num_iid: demo.wholesaleNumIid, sid: demo.wholesaleSid })).toBe("0000");
    expect(await call("retail/item_get", "legacy:json", item)).toBe("0000");
    expect(await call("retail/item_get", "legacy:xml", item)).toBe("0000");
    expect(await call("retail/item_get", "connect-json", { num_iid: "abc" })).toBe("4003");
    expect(await page.getByTestId("result-status").textContent()).toContain("num_iid");

    // Usage: the six calls, by transport, in the chart and the table.
    await page.getByRole("link", { name: "Usage" }).click();
    await page.getByRole("heading", { name: "Usage" }).waitFor();
    await page.getByLabel("Account").selectOption(key);
    await page.getByRole("button", { name: "Show usage" }).click();
    await expect.poll(() => page.getByTestId("figure-calls").textContent()).toBe("6");
    expect(await page.getByTestId("figure-charged-calls").textContent()).toBe("5");
    expect(await page.getByRole("figure", { name: "Calls per day by operation" }).locator("canvas").count()).toBe(1);
    const latest = page.getByRole("table", { name: "Latest calls" });
    for (const transport of ["connect", "grpc-web", "legacy"]) await expect.poll(() => latest.getByRole("cell", { name: transport, exact: true }).count()).toBeGreaterThan(0);
    expect(await latest.getByRole("cell", { name: "4003", exact: true }).count()).toBe(1);
    const hits = Number(await page.getByTestId("figure-cache-hit-share").textContent().then((t) => t!.replace("%", "")));
    expect(hits).toBeGreaterThan(0);
    // Where they came from: this browser, on loopback; narrowed to a network, to that address, and a filter that is not one.
    const byAddress = page.getByRole("table", { name: "Calls by address" });
    expect(await byAddress.locator("tbody tr").first().locator("td").allTextContents()).toEqual(["127.0.0.1", "6", "5", key]);
    expect(await latest.getByRole("cell", { name: "127.0.0.1", exact: true }).count()).toBe(6);
    await page.screenshot({ path: join(shots, "7-usage.png"), fullPage: true });
    // The tables as CSV files, made in the page from the figures shown.
    const saved = async (label: string) => {
      const [file] = await Promise.all([page.waitForEvent("download"), page.getByRole("link", { name: label }).click()]);
      return { name: file.suggestedFilename(), text: readFileSync((await file.path())!, "utf8") };
    };
    const calls = await saved("Download these calls (CSV)");
    const lines = calls.text.split("\r\n");
    expect(calls.name).toMatch(/^usage-calls-\d{4}-\d{2}-\d{2}-\d{4}-\d{2}-\d{2}\.csv$/);
    expect(lines[0]).toBe("request_id,time,day,account,operation,code,charge,price,cache_hit,latency_us,transport,client_ip,upstream_requests");
    expect(lines.filter((l) => l.includes(`,${key},`))).toHaveLength(6);
    expect(lines.filter((l) => l.includes(",4003,ignored,0,false,"))).toHaveLength(1);
    const totals = await saved("Download the totals (CSV)");
    expect(totals.text.split("\r\n")[0]).toBe("day,account,operation,code,charge,client_ip,calls,cache_hits,amount,upstream_requests");
    const refusedId = (await latest.locator("tbody tr").filter({ hasText: "4003" }).locator("code").textContent())!;
    await page.getByLabel("From address").fill("10.0.0.0/8");
    await page.getByRole("button", { name: "Show usage" }).click();
    await expect.poll(() => page.getByTestId("figure-calls").textContent()).toBe("0");
    await page.getByLabel("From address").fill("127.0.0.0/8");
    await page.getByRole("button", { name: "Show usage" }).click();
    await expect.poll(() => page.getByTestId("figure-calls").textContent()).toBe("6");
    await page.getByLabel("From address").fill("127.0.0.0/40");
    await page.getByRole("button", { name: "Show usage" }).click();
    await page.getByText(`the calls' address: "127.0.0.0/40": a network's prefix is 0 to 32`).waitFor();
    // One call by the request id its caller quotes (the 4003's, from the table), found whatever the days asked.
    await page.getByLabel("From address").fill("");
    await page.getByLabel("Request id").fill(refusedId);
    await page.getByLabel("From", { exact: true }).fill("2020-01-01");
    await page.getByLabel("To", { exact: true }).fill("2020-01-02");
    await page.getByRole("button", { name: "Show usage" }).click();
    await expect.poll(() => page.getByTestId("figure-calls").textContent()).toBe("1");
    expect(await page.getByRole("table", { name: "Latest calls" }).locator("tbody tr code").allTextContents()).toEqual([refusedId]);
    const rows = (await gw.runtime.meter.query({ account: key, rows: 10 })).rows;
    expect(rows.map((r) => r.transport).sort()).toEqual(["connect", "connect", "connect", "grpc-web", "legacy", "legacy"]);

    // Stop it in the console; its next explorer call is refused with 4007, on an RPC transport and on the legacy one.
    await page.getByRole("link", { name: "Accounts" }).click();
    await page.getByRole("button", { name: "explorer-team" }).click();
    await page.getByRole("region", { name: `Account ${key}` }).getByRole("button", { name: "Stop account" }).click();
    await page.getByText("Stop: done.").waitFor();
    await page.getByRole("link", { name: "Explorer" }).click();
    await page.getByRole("heading", { name: "Explorer" }).waitFor();
    expect(await call("retail/item_get", "connect-json", item)).toBe("4007");
    expect(await page.getByRole("region", { name: "Call result" }).textContent()).toContain("PermissionDenied");
    await page.screenshot({ path: join(shots, "8-explorer-4007.png"), fullPage: true });
    expect(await call("retail/item_get", "legacy:json", item)).toBe("4007");
    expect(requests.every((u) => u.startsWith(gw.base)), requests.filter((u) => !u.startsWith(gw.base)).join(" ")).toBe(true);
    await page.close();
  });

  it("shows the usage asked for last, when an earlier reading answers after it", async () => {
    const { page } = await signedIn();
    await page.getByLabel("Name").fill("usage-race-team");
    await page.getByRole("button", { name: "Create account" }).click();
    const key = (await page.getByTestId("new-key").textContent())!;
    const secret = (await page.getByTestId("new-secret").textContent())!;
    for (let i = 0; i < 3; i++) expect((await legacyGet(gw.base, "/retail/item_get/", { key, secret, num_iid: demo.retailNumIid })).json.error_code).toBe("0000");
    const all = (await gw.runtime.meter.query({})).totals.reduce((n, t) => n + Number(t.calls), 0);
    expect(all).toBeGreaterThan(3);
    // The view's first reading (all accounts) is held back until the reading of one account has answered.
    let first = true;
    let releaseFirst!: () => void;
    const firstHeld = new Promise<void>((resolve) => (releaseFirst = resolve));
    await page.route("**/gateway.admin.v1.AdminService/QueryUsage", async (route) => {
      if (!first) return route.continue();
      first = false;
      await firstHeld;
      await route.continue();
    });
    await page.getByRole("link", { name: "Usage" }).click();
    await page.getByRole("heading", { name: "Usage" }).waitFor();
    await page.getByLabel("Account").selectOption(key);
    await page.getByRole("button", { name: "Show usage" }).click();
    await expect.poll(() => page.getByTestId("figure-calls").textContent()).toBe("3");
    const heldAnswered = page.waitForResponse("**/gateway.admin.v1.AdminService/QueryUsage");
    releaseFirst();
    await (await heldAnswered).finished();
    // Time for the page to read the held answer (a few milliseconds), which must not replace the account's figures.
    await page.evaluate(() => new Promise((r) => setTimeout(r, 300)));
    expect(await page.getByTestId("figure-calls").textContent()).toBe("3");
    await page.close();
  });

  it("shows a filter's calls fifty at a time, older ones on asking, and downloads every call shown", async () => {
    const { key } = await gw.newAccount({ name: "calls-pages-team" });
    // 120 calls of the account today, a second apart, written beside the gateway as the CLI's connection would.
    const { DatabaseSync } = await import("node:sqlite");
    const db = new DatabaseSync(join(gw.config.dataDir, "gateway.db"));
    db.exec("PRAGMA busy_timeout = 5000");
    const today = new Date().toISOString().slice(0, 10);
    const insert = db.prepare(
      "INSERT INTO ledger (request_id, at, day, account, operation, error_code, charge, price, cache_hit, latency_us, transport, client_ip) VALUES (?, ?, ?, ?, 'retail/item_get', 0, 'charged', 0, 0, 300, 'legacy', '192.0.2.9')",
    );
    const t0 = Date.now() - 200_000;
    const ids = Array.from({ length: 120 }, (_, i) => `gw-9.${(0x6b100000 + i).toString(16)}`);
    ids.forEach((id, i) => insert.run(id, t0 + i * 1000, today, key));
    db.close();
    const { page } = await signedIn();
    await page.getByRole("link", { name: "Usage" }).click();
    await page.getByRole("heading", { name: "Usage" }).waitFor();
    await page.getByLabel("Account").selectOption(key);
    await page.getByRole("button", { name: "Show usage" }).click();
    await expect.poll(() => page.getByTestId("figure-calls").textContent()).toBe("120");
    const latest = page.getByRole("table", { name: "Latest calls" });
    expect(await page.getByTestId("calls-shown").textContent()).toBe("50 calls shown.");
    await page.getByRole("button", { name: "Older calls" }).click();
    await expect.poll(() => page.getByTestId("calls-shown").textContent()).toBe("100 calls shown.");
    await page.getByRole("button", { name: "Older calls" }).click();
    await expect.poll(() => page.getByTestId("calls-shown").textContent()).toBe("120 calls shown, every one of this filter.");
    expect(await page.getByRole("button", { name: "Older calls" }).isVisible()).toBe(false);
    // Newest first, each once, and the file holds every call shown.
    expect(await latest.locator("tbody tr code").allTextContents()).toEqual([...ids].reverse());
    const [file] = await Promise.all([page.waitForEvent("download"), page.getByRole("link", { name: "Download these calls (CSV)" }).click()]);
    const lines = readFileSync((await file.path())!, "utf8").split("\r\n").filter((l) => l !== "");
    expect(lines.slice(1).map((l) => l.split(",")[0])).toEqual([...ids].reverse());
    await page.screenshot({ path: join(shots, "7b-usage-older-calls.png"), fullPage: true });
    await page.close();
  });

  it("lists accounts a page at a time, searched and filtered by the gateway, with more on asking", async () => {
    for (let i = 0; i < 105; i++) await gw.newAccount({ name: `bulk-${String(i).padStart(3, "0")}` });
    // Made after all of them (a moment later: accounts made in the same millisecond are in key order).
    await new Promise((r) => setTimeout(r, 5));
    await gw.newAccount({ name: "late-one" });
    const { page } = await signedIn();
    const caption = page.locator("table.accounts > caption");
    await page.getByLabel("Search accounts").fill("BULK-");
    await expect.poll(() => caption.textContent()).toBe("100 of 105 matching accounts");
    expect(await page.locator("table.accounts > tbody > tr").count()).toBe(100);
    await page.getByRole("button", { name: "Show 5 more" }).click();
    await expect.poll(() => caption.textContent()).toBe("105 of 105 matching accounts");
    // Each once (in the order they were made; those made in the same millisecond by key).
    expect((await page.locator("table.accounts > tbody > tr[data-key] > td:first-child").allTextContents()).sort()).toEqual(Array.from({ length: 105 }, (_, i) => `bulk-${String(i).padStart(3, "0")}`));
    expect(await page.getByRole("button", { name: /^Show \d+ more$/ }).count()).toBe(0);
    // An action on an account of the second page leaves the table as long as it was.
    await page.getByRole("button", { name: "bulk-104" }).click();
    await page.getByRole("region", { name: /^Account / }).getByRole("button", { name: "Stop account" }).click();
    await page.getByText("Stop: done.").waitFor();
    expect(await caption.textContent()).toBe("105 of 105 matching accounts");
    await page.getByLabel("Status").selectOption("stopped");
    await expect.poll(() => caption.textContent()).toBe("1 of 1 matching accounts");
    // The explorer's and the usage page's account choosers offer a page of accounts too, and find the rest.
    for (const screen of ["Explorer", "Usage"]) {
      await page.getByRole("link", { name: screen }).click();
      const chooser = page.getByLabel("Account", { exact: true });
      await expect.poll(() => page.getByText(/^100 of \d+ accounts offered: search to find others\.$/).count()).toBe(1);
      expect(await chooser.locator("option", { hasText: "late-one" }).count()).toBe(0);
      await page.getByLabel("Find by name or key").fill("LATE-ONE");
      await expect.poll(() => chooser.locator("option").allTextContents()).toEqual([...(screen === "Usage" ? ["All accounts"] : []), expect.stringMatching(/^late-one · \w+$/)]);
    }
    await page.close();
  });

  it("fits a phone-sized screen", async () => {
    // An account chooser offers it, with a name longer than the screen is wide (the Live calls screen overflowed 210 px).
    await gw.newAccount({ name: "a-team-with-a-rather-long-descriptive-name-for-billing" });
    const { page } = await signedIn({ width: 390, height: 844 });
    const overflow = await page.evaluate<number>("document.documentElement.scrollWidth - document.documentElement.clientWidth");
    expect(overflow).toBeLessThanOrEqual(0);
    await page.screenshot({ path: join(shots, "5-phone-accounts.png"), fullPage: true });
    await page.getByRole("link", { name: "Usage" }).click();
    await page.getByTestId("figure-calls").waitFor();
    expect(await page.evaluate<number>("document.documentElement.scrollWidth - document.documentElement.clientWidth")).toBeLessThanOrEqual(0);
    await page.screenshot({ path: join(shots, "9-phone-usage.png"), fullPage: true });
    await page.getByRole("link", { name: "Connections" }).click();
    await page.getByTestId("open").waitFor();
    expect(await page.evaluate<number>("document.documentElement.scrollWidth - document.documentElement.clientWidth")).toBeLessThanOrEqual(0);
    await page.screenshot({ path: join(shots, "9b-phone-connections.png"), fullPage: true });
    await page.getByRole("link", { name: "Live calls" }).click();
    await page.getByText("Following: each call appears as the ledger commits it.").waitFor();
    expect(await page.evaluate<number>("document.documentElement.scrollWidth - document.documentElement.clientWidth")).toBeLessThanOrEqual(0);
    await page.screenshot({ path: join(shots, "9c-phone-live.png"), fullPage: true });
    await page.close();
  });

  it("shows a range with too many totals by address to give at once: its figures, charts and totals whole, and says how to see who called", async () => {
    const { key } = await gw.newAccount({ name: "many-addresses-team" });
    // 50,001 calls of the account today, each from an address of its own: one total by address more than a report
    // asked whole may hold, so the gateway refuses that report, and the console asks again without addresses.
    const { DatabaseSync } = await import("node:sqlite");
    const db = new DatabaseSync(join(gw.config.dataDir, "gateway.db"));
    db.exec("PRAGMA busy_timeout = 5000");
    const today = new Date().toISOString().slice(0, 10);
    const insert = db.prepare(
      "INSERT INTO ledger (request_id, at, day, account, operation, error_code, charge, price, cache_hit, latency_us, transport, client_ip) VALUES (?, ?, ?, ?, 'retail/item_get', 0, 'charged', 0, 0, 300, 'legacy', ?)",
    );
    const t0 = Date.now() - 3_600_000;
    db.exec("BEGIN IMMEDIATE");
    for (let i = 0; i < 50_001; i++) insert.run(`gw-8.${(0x6c000000 + i).toString(16)}`, t0 + i, today, key, `10.3.${i >> 8}.${i & 255}`);
    db.exec("COMMIT");
    db.close();
    const { page } = await signedIn();
    await page.getByRole("link", { name: "Usage" }).click();
    await page.getByRole("heading", { name: "Usage" }).waitFor();
    // The chooser offers a page of accounts (this file has made more): the account is found by name.
    await page.getByLabel("Find by name or key").fill("many-addresses-team");
    await expect.poll(() => page.getByLabel("Account", { exact: true }).locator("option").count()).toBe(2);
    await page.getByLabel("Account", { exact: true }).selectOption(key);
    await page.getByRole("button", { name: "Show usage" }).click();
    await expect.poll(() => page.getByTestId("figure-calls").textContent(), { timeout: 20_000 }).toBe("50001");
    expect(await page.getByTestId("too-many-addresses").textContent()).toContain("Choose an account, fewer days or an address");
    expect(await page.getByRole("table", { name: "Calls by address" }).count()).toBe(0);
    const totals = page.getByRole("table", { name: "Totals by day, account, operation and code" });
    expect(await totals.locator("tbody tr").count()).toBe(1);
    expect(await totals.locator("tbody tr td").allTextContents()).toEqual([today, key, "retail/item_get", "0000", "charged", "(any)", "50001", "0", "0", "0"]);
    expect(await page.getByRole("alert").count()).toBe(0);
    await page.screenshot({ path: join(shots, "7c-usage-too-many-addresses.png"), fullPage: true });
    // One address of them: listed by address again.
    await page.getByLabel("From address").fill("10.3.0.7");
    await page.getByRole("button", { name: "Show usage" }).click();
    await expect.poll(() => page.getByTestId("figure-calls").textContent()).toBe("1");
    expect(await page.getByRole("table", { name: "Calls by address" }).locator("tbody tr td").first().textContent()).toBe("10.3.0.7");
    await page.close();
  });
});
