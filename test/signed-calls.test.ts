import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";
import { createHmac } from "node:crypto";
import { join } from "node:path";
import { DatabaseSync } from "node:sqlite";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { canonicalString, deriveSigningKey, newNonce, signCall } from "../src/client/browser-signature.ts";
import { formatDateTime } from "../src/core/clock.ts";
import { legacySign, legacySigningKey } from "../src/core/legacy-signature.ts";
import { RetailService } from "../src/gen/gateway/catalogue/v1/retail_pb.js";
import { StatusBlockSchema } from "../src/gen/gateway/catalogue/v1/status_pb.js";
import { demo, startGateway, type GatewayFixture } from "./support/gateway-fixture.ts";

let gw: GatewayFixture;
beforeAll(async () => {
  // These tests fail authentication on purpose many times; the lockout has its own test.
  gw = await startGateway({ config: { authSlowAfter: 1000, authLockAfter: 1000 } });
});
afterAll(() => gw.close());

const now = () => Date.now();
const nowSeconds = () => Math.floor(Date.now() / 1000);

async function legacy(params: Record<string, string>, headers: Record<string, string> = {}) {
  const res = await fetch(`${gw.base}/retail/item_get/?${new URLSearchParams(params)}`, { headers });
  return (await res.json()) as { error_code: string; reason: string };
}

/** A legacy signed call's parameters, as a legacy client builds them. */
function legacySigned(secret: string, args: Record<string, string>, at = now()) {
  const params = { ...args, key: gw.account.key, dateline: formatDateTime(at, "Asia/Shanghai") };
  return { ...params, sign: legacySign({ ...params, api_name: "item_get" }, legacySigningKey(secret)) };
}

describe("the legacy signed form (dateline, sign)", () => {
  it("authenticates without the secret in the URL", async () => {
    const params = legacySigned(gw.account.secret, { num_iid: demo.retailNumIid, result_type: "json" });
    expect(params).not.toHaveProperty("secret");
    expect((await legacy(params)).error_code).toBe("0000");
  });

  it("signs api_name, not the catalogue: one sign serves either item_get, once in all (README, legacy signed form)", async () => {
    const params = legacySigned(gw.account.secret, { num_iid: demo.wholesaleNumIid });
    const wholesale = (await (await fetch(`${gw.base}/wholesale/item_get/?${new URLSearchParams(params)}`)).json()) as { error_code: string };
    expect(wholesale.error_code).toBe("0000");
    const again = await legacy(params);
    expect([again.error_code, again.reason]).toEqual(["4005", "this sign was already used; sign each call anew"]);
  });

  it("refuses a replay, a stale or future dateline, a bad sign and a tampered argument, saying which", async () => {
    const params = legacySigned(gw.account.secret, { num_iid: demo.retailNumIid });
    expect((await legacy(params)).error_code).toBe("0000");
    const replay = await legacy(params);
    expect([replay.error_code, replay.reason]).toEqual(["4005", "this sign was already used; sign each call anew"]);
    // dateline has whole seconds: keep clear of the 300 s edge by more than a second.
    for (const offset of [-305_000, 305_000]) {
      const stale = await legacy(legacySigned(gw.account.secret, { num_iid: demo.retailNumIid }, now() + offset));
      expect(stale.error_code).toBe("4005");
      expect(stale.reason).toContain("away from the server's time");
    }
    const wrong = await legacy(legacySigned("not-the-secret", { num_iid: demo.retailNumIid }));
    expect(wrong.error_code).toBe("4005");
    expect(wrong.reason).toContain("sign does not match");
    const tampered = { ...legacySigned(gw.account.secret, { num_iid: demo.retailNumIid }), num_iid: "123" };
    expect((await legacy(tampered)).error_code).toBe("4005");
    const badDate = await legacy({ ...legacySigned(gw.account.secret, { num_iid: "1" }), dateline: "yesterday" });
    expect(badDate.reason).toContain("YYYY-MM-DD HH:MM:SS");
  });
});

it("the legacy signed form matches the worked example in the README", () => {
  const secret = "Rr3vQ8xKpL2mN7tY5wZ1bC4dF6gH9jS0aE8uI2oP";
  expect(legacySigningKey(secret)).toBe("eaabcb2bae49eb8a950655a8b00a8872");
  const params = { num_iid: "600000006151", is_promotion: "1", key: "k3y0example0001", dateline: "2026-11-22 10:00:00", api_name: "item_get" };
  expect(legacySign(params, legacySigningKey(secret))).toBe("e3c7dea41a5b149953b0dccf6784ae32");
});

describe("the browser-safe form (timestamp, nonceStr, signature)", () => {
  async function browserParams(args: Record<string, string>, opts: { method?: string; timestamp?: number; nonce?: string; secret?: string } = {}) {
    const signingKey = await deriveSigningKey(opts.secret ?? gw.account.secret); // on the caller's back end
    const timestamp = opts.timestamp ?? nowSeconds();
    const nonce = opts.nonce ?? newNonce();
    const signature = await signCall(signingKey, { method: opts.method ?? "GET", path: "/retail/item_get/", params: args, timestamp, nonce });
    return { ...args, key: gw.account.key, timestamp: String(timestamp), nonceStr: nonce, signature };
  }

  it("authenticates a call signed by the caller's back end, over GET and POST", async () => {
    expect((await legacy(await browserParams({ num_iid: demo.retailNumIid, is_promotion: "1" }))).error_code).toBe("0000");
    const body = await browserParams({ num_iid: demo.retailNumIid }, { method: "POST" });
    const res = await fetch(`${gw.base}/retail/item_get/`, { method: "POST", headers: { "content-type": "application/x-www-form-urlencoded" }, body: new URLSearchParams(body).toString() });
    expect(((await res.json()) as { error_code: string }).error_code).toBe("0000");
  });

  it("refuses a reused nonce, a stale timestamp, another method and a tampered argument", async () => {
    const params = await browserParams({ num_iid: demo.retailNumIid });
    expect((await legacy(params)).error_code).toBe("0000");
    const replay = await legacy(params);
    expect([replay.error_code, replay.reason]).toEqual(["4005", "this nonce was already used; use a fresh nonceStr for every call"]);
    expect((await legacy(await browserParams({ num_iid: demo.retailNumIid }, { timestamp: nowSeconds() - 600 }))).reason).toContain("timestamp is more than 300 s");
    expect((await legacy(await browserParams({ num_iid: demo.retailNumIid }, { method: "POST" }))).error_code).toBe("4005");
    expect((await legacy({ ...(await browserParams({ num_iid: demo.retailNumIid })), num_iid: "123" })).error_code).toBe("4005");
    expect((await legacy(await browserParams({ num_iid: "1" }, { nonce: "short" }))).reason).toContain("nonceStr");
  });

  it("matches the worked example in the README", async () => {
    const signingKey = await deriveSigningKey("Rr3vQ8xKpL2mN7tY5wZ1bC4dF6gH9jS0aE8uI2oP");
    // Every parameter of the URL goes in; key, timestamp, nonceStr (and signature) are left out of the parameters line.
    const url = "key=k3y0example0001&num_iid=600000006151&is_promotion=1&lang=en&result_type=json&timestamp=1795315200&nonceStr=q3Jx9vLmT2pW8sKd";
    const call = { method: "GET", path: "/retail/item_get/", params: Object.fromEntries(new URLSearchParams(url)), timestamp: 1795315200, nonce: "q3Jx9vLmT2pW8sKd" };
    expect(signingKey).toBe("a02097088580a187ee3c235c73c5c824aa5a0dc085d72bae93c24143ec4e801b");
    expect(canonicalString(call)).toBe("GATEWAY-HMAC-SHA256\nGET\n/retail/item_get/\nis_promotion=1&lang=en&num_iid=600000006151&result_type=json\n1795315200\nq3Jx9vLmT2pW8sKd");
    const signature = await signCall(signingKey, call);
    expect(signature).toBe("f74e2931ad103ffdc362546137f1cbe9752f76cc58904d0bce46e3cda580b658");
    // The same with node:crypto, independent of the WebCrypto helper.
    const nodeKey = createHmac("sha256", "Rr3vQ8xKpL2mN7tY5wZ1bC4dF6gH9jS0aE8uI2oP").update("gateway-browser-signing-v1").digest();
    expect(createHmac("sha256", nodeKey).update(canonicalString(call)).digest("hex")).toBe(signature);
  });
});

describe("the Authorization header", () => {
  async function hmacHeader(method: string, path: string, args: Record<string, string>, nonce = newNonce()) {
    const timestamp = nowSeconds();
    const signature = await signCall(await deriveSigningKey(gw.account.secret), { method, path, params: args, timestamp, nonce });
    return `GATEWAY-HMAC-SHA256 key=${gw.account.key}, timestamp=${timestamp}, nonce=${nonce}, signature=${signature}`;
  }

  it("carries a signed call on the legacy path, with nothing secret in the URL", async () => {
    const authorization = await hmacHeader("GET", "/retail/item_get/", { num_iid: demo.retailNumIid });
    expect((await legacy({ num_iid: demo.retailNumIid }, { authorization })).error_code).toBe("0000");
    expect((await legacy({ num_iid: demo.retailNumIid }, { authorization })).error_code).toBe("4005");
  });

  it("carries the key alone (Gateway-Key), with the secret elsewhere", async () => {
    expect((await legacy({ num_iid: demo.retailNumIid, secret: gw.account.secret }, { authorization: `Gateway-Key ${gw.account.key}` })).error_code).toBe("0000");
  });

  it.each([
    ["Connect", () => createConnectTransport({ baseUrl: gw.base, httpVersion: "1.1" })],
    ["gRPC", () => createGrpcTransport({ baseUrl: gw.base })],
  ])("carries a signed call on the RPC path (%s), and a replay is refused with 4005", async (_name, transport) => {
    const client = createClient(RetailService, transport());
    const authorization = await hmacHeader("RPC", "/gateway.catalogue.v1.RetailService/ItemGet", { num_iid: demo.retailNumIid, is_promotion: "1" });
    const res = await client.itemGet({ numIid: demo.retailNumIid, isPromotion: "1" }, { headers: { authorization } });
    expect(res.item?.numIid).toBe(demo.retailNumIid);
    const err = await client.itemGet({ numIid: demo.retailNumIid, isPromotion: "1" }, { headers: { authorization } }).then(() => undefined, ConnectError.from);
    expect(err?.code).toBe(Code.Unauthenticated);
    expect(err?.findDetails(StatusBlockSchema)[0]?.errorCode).toBe(4005);
  });
});

describe("every form on the RPC path, in headers", () => {
  const client = () => createClient(RetailService, createConnectTransport({ baseUrl: gw.base, httpVersion: "1.1" }));
  const failCode = (p: Promise<unknown>) => p.then(() => undefined, (e: unknown) => ConnectError.from(e).findDetails(StatusBlockSchema)[0]?.errorCode);

  it("the legacy signed form: x-api-dateline and x-api-sign over the request's arguments", async () => {
    const dateline = formatDateTime(now(), "Asia/Shanghai");
    const sign = legacySign({ num_iid: demo.retailNumIid, is_promotion: "1", key: gw.account.key, dateline, api_name: "item_get" }, legacySigningKey(gw.account.secret));
    const headers = { "x-api-key": gw.account.key, "x-api-dateline": dateline, "x-api-sign": sign };
    const res = await client().itemGet({ numIid: demo.retailNumIid, isPromotion: "1" }, { headers });
    expect(res.item?.numIid).toBe(demo.retailNumIid);
    expect(await failCode(client().itemGet({ numIid: demo.retailNumIid, isPromotion: "1" }, { headers }))).toBe(4005);
    expect(await failCode(client().itemGet({ numIid: "123", isPromotion: "1" }, { headers: { ...headers, "x-api-sign": sign.replace(/^./, "0") } }))).toBe(4005);
  });

  it("the browser form: x-api-timestamp, x-api-nonce and x-api-signature", async () => {
    const timestamp = nowSeconds();
    const nonce = newNonce();
    const signature = await signCall(await deriveSigningKey(gw.account.secret), { method: "RPC", path: "/gateway.catalogue.v1.RetailService/ItemGet", params: { num_iid: demo.retailNumIid }, timestamp, nonce });
    const headers = { "x-api-key": gw.account.key, "x-api-timestamp": String(timestamp), "x-api-nonce": nonce, "x-api-signature": signature };
    expect((await client().itemGet({ numIid: demo.retailNumIid }, { headers })).item?.numIid).toBe(demo.retailNumIid);
    expect(await failCode(client().itemGet({ numIid: demo.retailNumIid }, { headers }))).toBe(4005);
  });
});

describe("secrets at rest", () => {
  it("keeps no plain secret: nothing in a dump of the store makes a plain-secret call", async () => {
    const { key, secret } = await gw.newAccount();
    const db = new DatabaseSync(join(gw.config.dataDir, "gateway.db"), { readOnly: true });
    const row = db.prepare("SELECT * FROM accounts WHERE key = ?").get(key) as Record<string, unknown>;
    db.close();
    const dump = JSON.stringify(row);
    expect(dump).not.toContain(secret);
    for (const value of Object.values(row)) {
      if (typeof value !== "string" || value === key) continue;
      expect((await legacy({ key, secret: value, num_iid: demo.retailNumIid })).error_code).toBe("4005");
    }
    expect((await legacy({ key, secret, num_iid: demo.retailNumIid })).error_code).toBe("0000");
  });
});

describe("a rotation that keeps the old secret for a while", () => {
  /** One call of the account in each form (a plain secret, the legacy signed form, the browser-safe signed form), each answered with its code. */
  async function everyForm(key: string, secret: string): Promise<string[]> {
    const plain = { key, secret, num_iid: demo.retailNumIid };
    const dated = { key, num_iid: demo.retailNumIid, dateline: formatDateTime(now(), "Asia/Shanghai") };
    const signed = { ...dated, sign: legacySign({ ...dated, api_name: "item_get" }, legacySigningKey(secret)) };
    const timestamp = nowSeconds();
    const nonce = newNonce();
    const signature = await signCall(await deriveSigningKey(secret), { method: "GET", path: "/retail/item_get/", params: { num_iid: demo.retailNumIid }, timestamp, nonce });
    const browser = { key, num_iid: demo.retailNumIid, timestamp: String(timestamp), nonceStr: nonce, signature };
    return Promise.all([plain, signed, browser].map(async (p) => (await legacy(p)).error_code));
  }
  const ok = ["0000", "0000", "0000"];
  const refused = ["4005", "4005", "4005"];
  /** Into the next second: the legacy signed form signs the second (its dateline), and a sign sent twice is a replay. */
  const nextSecond = () => new Promise((r) => setTimeout(r, 1020 - (Date.now() % 1000)));

  it("accepts both secrets in every form until the grace ends, then the new one alone", async () => {
    const a = await gw.newAccount({});
    const secret = await gw.runtime.admin.rotateSecret(a.key, 1500);
    const until = (await gw.runtime.admin.get(a.key)).previousSecrets![0]!.until;
    expect(until - Date.now()).toBeGreaterThan(500);
    expect({ old: await everyForm(a.key, a.secret), new: await everyForm(a.key, secret) }).toEqual({ old: ok, new: ok });
    await new Promise((r) => setTimeout(r, Math.max(0, until - Date.now()) + 50));
    expect({ old: await everyForm(a.key, a.secret), new: await everyForm(a.key, secret) }).toEqual({ old: refused, new: ok });
  });

  it("keeps the secret every caller uses when a rotation is sent again, up to three old secrets, and a rotation without a grace ends every grace at once", async () => {
    const a = await gw.newAccount({});
    // A rotation whose answer was lost, sent again: the secret in use (the first) still works, as does the one the lost answer held.
    const lost = await gw.runtime.admin.rotateSecret(a.key, 60_000);
    const second = await gw.runtime.admin.rotateSecret(a.key, 60_000);
    expect({ first: await everyForm(a.key, a.secret), lost: await everyForm(a.key, lost), second: await everyForm(a.key, second) }).toEqual({ first: ok, lost: ok, second: ok });
    // Each keeps its own time: a shorter grace given later ends first.
    const third = await gw.runtime.admin.rotateSecret(a.key, 1500);
    const kept = (await gw.runtime.admin.get(a.key)).previousSecrets!;
    expect(kept.map((k) => k.until - Date.now() > 30_000)).toEqual([false, true, true]);
    await new Promise((r) => setTimeout(r, Math.max(0, kept[0]!.until - Date.now()) + 50));
    expect({ first: await everyForm(a.key, a.secret), lost: await everyForm(a.key, lost), second: await everyForm(a.key, second), third: await everyForm(a.key, third) }).toEqual({
      first: ok,
      lost: ok,
      second: refused,
      third: ok,
    });
    // Three old secrets at most: a fourth kept ends the oldest's grace.
    const fourth = await gw.runtime.admin.rotateSecret(a.key, 60_000);
    const fifth = await gw.runtime.admin.rotateSecret(a.key, 60_000);
    await nextSecond();
    expect({ first: await everyForm(a.key, a.secret), lost: await everyForm(a.key, lost), third: await everyForm(a.key, third), fourth: await everyForm(a.key, fourth), fifth: await everyForm(a.key, fifth) }).toEqual({
      first: refused,
      lost: ok,
      third: ok,
      fourth: ok,
      fifth: ok,
    });
    // The API says until when the last of them works; the history says the same.
    const shown = (await gw.runtime.admin.get(a.key)).previousSecrets!;
    expect(shown).toHaveLength(3);
    const sixth = await gw.runtime.admin.rotateSecret(a.key);
    await nextSecond();
    expect({ fifth: await everyForm(a.key, fifth), lost: await everyForm(a.key, lost), sixth: await everyForm(a.key, sixth) }).toEqual({ fifth: refused, lost: refused, sixth: ok });
    expect((await gw.runtime.admin.get(a.key)).previousSecrets).toBeUndefined();
  });

  it("reads a grace kept as one secret, as stores kept it before a rotation could keep several", async () => {
    const a = await gw.newAccount({});
    const second = await gw.runtime.admin.rotateSecret(a.key, 60_000);
    const db = new DatabaseSync(join(gw.config.dataDir, "gateway.db"));
    db.prepare("UPDATE accounts SET previous_secret = json_extract(previous_secret, '$[0]') WHERE key = ?").run(a.key);
    expect(JSON.parse((db.prepare("SELECT previous_secret FROM accounts WHERE key = ?").get(a.key) as { previous_secret: string }).previous_secret)).toMatchObject({ secretHash: expect.any(String) });
    db.close();
    // Another process's commit: the gateway reads the account again within the change watch's interval.
    await expect.poll(async () => (await everyForm(a.key, a.secret)).join(), { timeout: 3000 }).toBe(ok.join());
    expect(await everyForm(a.key, second)).toEqual(ok);
    expect((await gw.runtime.admin.get(a.key)).previousSecrets).toHaveLength(1);
    // Bounds: from no grace to 30 days.
    await expect(gw.runtime.admin.rotateSecret(a.key, 31 * 86_400_000)).rejects.toThrow("the old secret can be kept for at most 30 days (2592000 s), not 2678400 s");
    await expect(gw.runtime.admin.rotateSecret(a.key, -1000)).rejects.toThrow("not -1 s");
  });
});
