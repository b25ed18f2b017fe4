// Issue 11, items 5, 6, 8, 9, 10, 13 and 14: what a hostile or careless caller
// sends, and what the gateway must answer (and never echo or log).
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";
import http from "node:http";
import net from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { deriveSigningKey, newNonce, signCall } from "../src/client/browser-signature.ts";
import { printableName } from "../src/core/account-admin.ts";
import { GatewayError } from "../src/core/gateway-error.ts";
import { AdminService } from "../src/gen/gateway/admin/v1/admin_pb.js";
import { RetailService } from "../src/gen/gateway/catalogue/v1/retail_pb.js";
import { CacheMode, StatusBlockSchema } from "../src/gen/gateway/catalogue/v1/status_pb.js";
import { retailItemGet } from "../src/operations/retail-item-get.ts";
import { UpstreamSource } from "../src/sources/upstream/upstream-source.ts";
import { FakeUpstream } from "./support/fake-upstream.ts";
import { adminToken, demo, legacyGet, startGateway, type GatewayFixture } from "./support/gateway-fixture.ts";

const lines: string[] = [];
let gw: GatewayFixture;
beforeAll(async () => {
  gw = await startGateway({ logLines: lines, app: { logLevel: "trace" }, config: { authSlowAfter: 1000, authLockAfter: 1000 } });
});
afterAll(() => gw.close());

const rpc = () => createClient(RetailService, createConnectTransport({ baseUrl: gw.base, httpVersion: "1.1" }));
const rpcError = (p: Promise<unknown>) =>
  p.then(
    () => undefined,
    (e: unknown) => ConnectError.from(e),
  );

describe("11.5 upstream bodies have a size cap", () => {
  it("reads the provider's body as a stream: over the cap is 4002, uncharged, and the connection is dropped", async () => {
    const upstream = await new FakeUpstream().start();
    const source = new UpstreamSource({ url: upstream.url, catalogue: "taobao", key: "k", secret: "s", maxBodyBytes: 1048576, maxAttempts: 1 });
    try {
      upstream.script = () => ({ kind: "normal", padBytes: 24 * 1048576 });
      const error = await source.fetch(retailItemGet, { num_iid: demo.retailNumIid, is_promotion: "" }).then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(error).toBeInstanceOf(GatewayError);
      expect((error as GatewayError).code).toBe(4002);
      expect((error as GatewayError).message).toMatch(/larger than 1048576 bytes/);
      // The provider sees the connection closed long before it sent 24 MiB.
      await expect.poll(() => upstream.closedConnections, { timeout: 5000 }).toBeGreaterThanOrEqual(1);
      expect(upstream.bytesWritten).toBeLessThan(12 * 1048576);
      // Under the cap, the same item is served.
      upstream.script = () => ({ kind: "normal", padBytes: 100_000 });
      expect((await source.fetch(retailItemGet, { num_iid: demo.retailNumIid, is_promotion: "" })).found).toBe(true);
    } finally {
      await source.close();
      await upstream.stop();
    }
  });
});

describe("11.6 credentials never leak into reasons or logs", () => {
  it("does not echo a malformed URL or body, and redacts credential names whatever their case or encoding", async () => {
    const key = "LEAKKEY0123456789";
    const secret = "LEAKSECRET0123456789abcdef";
    const raw = await new Promise<string>((resolve) => {
      const s = net.connect(gw.port, "127.0.0.1", () => s.write(`GET /retail%ZZ/item_get/?key=${key}&secret=${secret} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n`));
      let out = "";
      s.on("data", (d: Buffer) => (out += d.toString()));
      s.on("close", () => resolve(out));
    });
    expect(raw).toContain('"error_code":"4003"');
    expect(raw).not.toContain(secret);
    expect(raw).not.toContain(key);

    const body = await fetch(`${gw.base}/retail/item_get/?key=${key}`, { method: "POST", headers: { "content-type": "application/json" }, body: `{"secret":"${secret}", oops` });
    const text = await body.text();
    expect(text).toContain('"error_code":"4003"');
    expect(text).not.toContain(secret);

    const odd = ["KEY=V1LEAK0001", "SECRET=V2LEAK0002", "Secret=V3LEAK0003", "secret%20=V4LEAK0004", "se%63ret=V5LEAK0005", "SIGNATURE=V6LEAK0006"];
    await fetch(`${gw.base}/retail/item_get/?${odd.join("&")}&num_iid=1`);
    await fetch(`${gw.base}/retail%ZZ/item_get/?${odd.join("&")}`);
    await new Promise((r) => setTimeout(r, 100));
    const leaks = lines.filter((l) => [key, secret, "V1LEAK", "V2LEAK", "V3LEAK", "V4LEAK", "V5LEAK", "V6LEAK"].some((s) => l.includes(s)));
    expect(leaks).toEqual([]);
  });
});

describe("11.8 the admin token has a brute-force limit", () => {
  it("slows, then refuses an address that keeps guessing, even with the right token, while other addresses work", async () => {
    const limited = await startGateway({ config: { authSlowAfter: 3, authLockAfter: 6, authLockSeconds: 60 } });
    try {
      const admin = (from: string, token: string) => {
        const started = performance.now();
        return new Promise<{ status: number; body: string; ms: number; retryAfter: string | undefined }>((resolve, reject) => {
          const req = http.request(
            `${limited.base}/gateway.admin.v1.AdminService/ListAccounts`,
            { method: "POST", localAddress: from, agent: false, headers: { "content-type": "application/json", authorization: `Bearer ${token}` } },
            (res) => {
              let body = "";
              res.on("data", (d: Buffer) => (body += d.toString()));
              res.on("end", () => resolve({ status: res.statusCode ?? 0, body, ms: performance.now() - started, retryAfter: res.headers["retry-after"] }));
            },
          );
          req.on("error", reject);
          req.end("{}");
        });
      };
      const guesses = [];
      for (let i = 0; i < 6; i++) guesses.push(await admin("127.0.0.1", `wrong-token-guess-${i}`));
      expect(guesses.every((g) => g.body.includes('"code":"unauthenticated"'))).toBe(true);
      expect(guesses[3]!.ms).toBeGreaterThanOrEqual(90);
      const locked = await admin("127.0.0.1", adminToken);
      expect(locked.body).toContain('"code":"resource_exhausted"');
      expect(locked.body).toMatch(/too many failed authentications from this address/);
      // When the lock ends (60 s, less the moments since), as a catalogue call is told.
      expect([locked.status, locked.retryAfter]).toEqual([429, "60"]);
      expect(locked.body).toMatch(/"type":"google.rpc.RetryInfo".*"retryDelay":"(59\.\d+|60)s"/);
      expect((await admin("127.0.0.2", adminToken)).status).toBe(200);
    } finally {
      await limited.close();
    }
  });
});

describe("11.9 the HMAC signature covers every parameter", () => {
  it("refuses a signature redeemed with other cache, lang or result_type, on the legacy and the RPC path", async () => {
    const signingKey = await deriveSigningKey(gw.account.secret);
    const ts = Math.floor(Date.now() / 1000);
    const legacyCall = async (params: Record<string, string>, sent: Record<string, string>) => {
      const nonce = newNonce();
      const signature = await signCall(signingKey, { method: "GET", path: "/retail/item_get/", params, timestamp: ts, nonce });
      return legacyGet(gw.base, "/retail/item_get/", { ...sent, key: gw.account.key, timestamp: String(ts), nonceStr: nonce, signature });
    };
    const signed = { num_iid: demo.retailNumIid, cache: "yes", lang: "cn", result_type: "json" };
    expect((await legacyCall(signed, signed)).json.error_code).toBe("0000");
    for (const changed of [{ cache: "no" }, { lang: "en" }, { result_type: "jsonu" }]) {
      const r = await legacyCall(signed, { ...signed, ...changed });
      expect(r.json.error_code, JSON.stringify(changed)).toBe("4005");
    }
    // A parameter added after signing is refused too.
    expect((await legacyCall({ num_iid: demo.retailNumIid }, { num_iid: demo.retailNumIid, lang: "en" })).json.error_code).toBe("4005");

    const path = "/gateway.catalogue.v1.RetailService/ItemGet";
    const rpcCall = async (params: Record<string, string>, cache: CacheMode) => {
      const nonce = newNonce();
      const signature = await signCall(signingKey, { method: "RPC", path, params, timestamp: ts, nonce });
      return rpcError(
        rpc().itemGet(
          { numIid: demo.retailNumIid, cache },
          { headers: { authorization: `GATEWAY-HMAC-SHA256 key=${gw.account.key}, timestamp=${ts}, nonce=${nonce}, signature=${signature}` } },
        ),
      );
    };
    expect(await rpcCall({ num_iid: demo.retailNumIid, cache: "no" }, CacheMode.NO)).toBeUndefined();
    expect((await rpcCall({ num_iid: demo.retailNumIid }, CacheMode.NO))?.code).toBe(Code.Unauthenticated);
  });
});

describe("11.10 a repeated parameter", () => {
  it("answers 4003 before authentication, and does not count toward the lockout", async () => {
    const strict = await startGateway({ config: { authSlowAfter: 2, authLockAfter: 3 } });
    try {
      for (let i = 0; i < 5; i++) {
        const res = await fetch(`${strict.base}/retail/item_get/?key=${strict.account.key}&num_iid=1&num_iid=2&secret=${strict.account.secret}`);
        const json = (await res.json()) as { error_code: string; reason: string };
        expect([json.error_code, json.reason]).toEqual(["4003", "parameter num_iid is given more than once"]);
      }
      expect((await legacyGet(strict.base, "/retail/item_get/", { key: strict.account.key, secret: strict.account.secret, num_iid: demo.retailNumIid })).json.error_code).toBe("0000");
    } finally {
      await strict.close();
    }
  });

  it("in a JSON body too (a JSON parser keeps the last), its name compared as read, and a form body's", async () => {
    const post = async (type: string, body: string) => {
      const res = await fetch(`${gw.base}/retail/item_get/`, { method: "POST", headers: { "content-type": type }, body });
      return (await res.json()) as { error_code: string; reason: string };
    };
    const { key, secret } = gw.account;
    for (const body of [
      `{"key":"${key}","secret":"${secret}","num_iid":"${demo.retailNumIid}","num_iid":"600000000001"}`,
      `{"key":"${key}","secret":"${secret}","num_iid":"${demo.retailNumIid}", "num\u005fiid" : 600000000001}`,
    ]) {
      expect(await post("application/json", body)).toMatchObject({ error_code: "4003", reason: "parameter num_iid is given more than once" });
    }
    expect(await post("application/x-www-form-urlencoded", `key=${key}&secret=${secret}&num_iid=${demo.retailNumIid}&num_iid=1`)).toMatchObject({ error_code: "4003", reason: "parameter num_iid is given more than once" });
    // A name repeated inside a nested value is not the body's (the value itself is refused), and JSON Fastify refuses stays refused.
    expect(await post("application/json", `{"key":"${key}","secret":"${secret}","num_iid":{"a":1,"a":2}}`)).toMatchObject({ error_code: "4003", reason: "parameter num_iid in the JSON body must be a string" });
    expect(await post("application/json", `{"__proto__":{"x":1},"key":"${key}"}`)).toMatchObject({ error_code: "4003", reason: "the request body is not valid JSON" });
    expect(await post("application/json", `{"key":"${key}",`)).toMatchObject({ error_code: "4003", reason: "the request body is not valid JSON" });
    expect(await post("application/json", `{"key":"${key}","secret":"${secret}","num_iid":"${demo.retailNumIid}"}`)).toMatchObject({ error_code: "0000" });
  });
});

describe("11.13 Authorization: KEY and Authorization: Bearer KEY", () => {
  it("carry the key on both paths; an unknown scheme answers 4005 naming it", async () => {
    const { key, secret } = gw.account;
    const q = `${gw.base}/retail/item_get/?secret=${secret}&num_iid=${demo.retailNumIid}`;
    for (const authorization of [key, `Bearer ${key}`, `bearer ${key}`, `Gateway-Key ${key}`]) {
      const json = (await (await fetch(q, { headers: { authorization } })).json()) as { error_code: string };
      expect(json.error_code, authorization.replace(key, "KEY")).toBe("0000");
    }
    const basic = (await (await fetch(q, { headers: { authorization: "Basic dXNlcjpwYXNz" } })).json()) as { error_code: string; reason: string };
    expect(basic.error_code).toBe("4005");
    expect(basic.reason).toMatch(/Basic/);
    expect(basic.reason).not.toContain("dXNlcjpwYXNz");
    for (const authorization of [key, `Bearer ${key}`]) {
      expect(await rpcError(rpc().itemGet({ numIid: demo.retailNumIid }, { headers: { authorization, "x-api-secret": secret } }))).toBeUndefined();
    }
  });
});

describe("11.14 RPC calls without credentials", () => {
  it("answer unauthenticated on Connect and gRPC, the detail keeping 4014", async () => {
    for (const transport of [createConnectTransport({ baseUrl: gw.base, httpVersion: "1.1" }), createGrpcTransport({ baseUrl: gw.base })]) {
      const error = await rpcError(createClient(RetailService, transport).itemGet({ numIid: demo.retailNumIid }));
      expect(error?.code).toBe(Code.Unauthenticated);
      expect(error?.findDetails(StatusBlockSchema)[0]?.errorCode).toBe(4014);
    }
    // A missing argument is still invalid_argument.
    const missingArg = await rpcError(rpc().itemGet({}, { headers: { "x-api-key": gw.account.key, "x-api-secret": gw.account.secret } }));
    expect(missingArg?.code).toBe(Code.InvalidArgument);
  });
});

describe("AdminService input", () => {
  it("11.12 answers invalid_argument for an impossible expiry and a top-up that would overflow", async () => {
    const admin = createClient(AdminService, createConnectTransport({ baseUrl: gw.base, httpVersion: "1.1" }));
    const headers = { authorization: `Bearer ${adminToken}` };
    const bad = await rpcError(admin.createAccount({ name: "x", expires: "2027-13-45" }, { headers }));
    expect(bad?.code).toBe(Code.InvalidArgument);
    expect(bad?.rawMessage).toMatch(/2027-13-45/);
    const { account } = await admin.createAccount({ name: "rich" }, { headers });
    let overflow: ConnectError | undefined;
    for (let i = 0; i < 12 && overflow === undefined; i++) overflow = await rpcError(admin.topUp({ key: account!.key, amount: "999999999999" }, { headers }));
    expect(overflow?.code).toBe(Code.InvalidArgument);
    expect(overflow?.rawMessage).toMatch(/largest it can hold/);
    const plan = await rpcError(admin.setPlan({ key: account!.key, expires: "2026-02-30" }, { headers }));
    expect(plan?.code).toBe(Code.InvalidArgument);
  });

  it("refuses an account name with control characters or direction overrides, or past 200 characters, quoting none of them", async () => {
    const admin = createClient(AdminService, createConnectTransport({ baseUrl: gw.base, httpVersion: "1.1" }));
    const headers = { authorization: `Bearer ${adminToken}` };
    for (const [name, words] of [
      ["a\u0000b\u001b[31mred", 'control characters, line separators or direction overrides: "a\\u0000b\\u001b[31mred"'],
      ["shop\u2028two lines", '"shop\\u2028two lines"'],
      ["\u202Egnp.exe", '"\\u202egnp.exe"'],
      ["x".repeat(201), "at most 200 characters, not 201"],
    ] as const) {
      const e = await rpcError(admin.createAccount({ name }, { headers }));
      expect([e?.code, e?.rawMessage]).toEqual([Code.InvalidArgument, expect.stringContaining(words)]);
      expect(e?.rawMessage).not.toMatch(/[\u0000-\u001f\u2028\u202e]/);
    }
    // A name from before the check is printed (accounts list) with the same escapes.
    expect(printableName("a\u001b[31m\u202eb 云栖")).toBe("a\\u001b[31m\\u202eb 云栖");
    // Any script, up to 200 characters (not UTF-16 units: each of these is two).
    const wide = "𠮷".repeat(200);
    expect((await admin.createAccount({ name: wide }, { headers })).account?.name).toBe(wide);
    expect((await admin.createAccount({ name: "云栖 Shop-2 (test)" }, { headers })).account?.name).toBe("云栖 Shop-2 (test)");
  });
});
