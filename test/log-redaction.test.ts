import { createClient } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";
import net from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { deriveSigningKey, newNonce, signCall } from "../src/client/browser-signature.ts";
import { formatDateTime } from "../src/core/clock.ts";
import { legacySign, legacySigningKey } from "../src/core/legacy-signature.ts";
import { AdminService } from "../src/gen/gateway/admin/v1/admin_pb.js";
import { RetailService } from "../src/gen/gateway/catalogue/v1/retail_pb.js";
import { adminToken, demo, startGateway, type GatewayFixture } from "./support/gateway-fixture.ts";
import { startServe, withoutSecrets } from "./support/gateway-process.ts";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const lines: string[] = [];
let gw: GatewayFixture;
const secrets: string[] = [];

beforeAll(async () => {
  gw = await startGateway({ logLines: lines, app: { logLevel: "trace" }, config: { authLockAfter: 1000 } });
});
afterAll(() => gw.close());

describe("logs", () => {
  it("carry no key, secret, signature, Authorization header or admin token, whatever the traffic", async () => {
    const a = await gw.newAccount();
    const hmacKey = await deriveSigningKey(a.secret);
    const q = (p: Record<string, string>) => `${gw.base}/retail/item_get/?${new URLSearchParams(p)}`;
    const now = Date.now();

    // Plain, wrong, and in a POST body.
    await fetch(q({ key: a.key, secret: a.secret, num_iid: demo.retailNumIid }));
    await fetch(q({ key: a.key, secret: `${a.secret}x`, num_iid: "1" }));
    await fetch(`${gw.base}/retail/item_get/?key=${a.key}`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ secret: a.secret, num_iid: "1" }) });
    // Legacy signed.
    const legacyParams = { key: a.key, num_iid: demo.retailNumIid, dateline: formatDateTime(now, "Asia/Shanghai") };
    const sign = legacySign({ ...legacyParams, api_name: "item_get" }, legacySigningKey(a.secret));
    await fetch(q({ ...legacyParams, sign }));
    // Browser form and Authorization header.
    const ts = Math.floor(now / 1000);
    const nonce = newNonce();
    const signature = await signCall(hmacKey, { method: "GET", path: "/retail/item_get/", params: { num_iid: demo.retailNumIid }, timestamp: ts, nonce });
    await fetch(q({ key: a.key, num_iid: demo.retailNumIid, timestamp: String(ts), nonceStr: nonce, signature }));
    const headerNonce = newNonce();
    const headerSignature = await signCall(hmacKey, { method: "GET", path: "/retail/item_get/", params: { num_iid: "1" }, timestamp: ts, nonce: headerNonce });
    const authorization = `GATEWAY-HMAC-SHA256 key=${a.key}, timestamp=${ts}, nonce=${headerNonce}, signature=${headerSignature}`;
    await fetch(q({ num_iid: "1" }), { headers: { authorization } });
    // RPC with secret headers and with a signed header.
    const rpcNonce = newNonce();
    const rpcSignature = await signCall(hmacKey, { method: "RPC", path: "/gateway.catalogue.v1.RetailService/ItemGet", params: { num_iid: demo.retailNumIid }, timestamp: ts, nonce: rpcNonce });
    for (const transport of [createConnectTransport({ baseUrl: gw.base, httpVersion: "1.1" }), createGrpcTransport({ baseUrl: gw.base })]) {
      const client = createClient(RetailService, transport);
      await client.itemGet({ numIid: demo.retailNumIid }, { headers: { "x-api-key": a.key, "x-api-secret": a.secret } });
      await client.itemGet({ numIid: "1" }, { headers: { "x-api-key": a.key, "x-api-secret": "wrong" } }).catch(() => undefined);
    }
    await createClient(RetailService, createConnectTransport({ baseUrl: gw.base, httpVersion: "1.1" }))
      .itemGet({ numIid: demo.retailNumIid }, { headers: { authorization: `GATEWAY-HMAC-SHA256 key=${a.key}, timestamp=${ts}, nonce=${rpcNonce}, signature=${rpcSignature}` } });
    // The admin API.
    const admin = createClient(AdminService, createConnectTransport({ baseUrl: gw.base, httpVersion: "1.1" }));
    const created = await admin.createAccount({ name: "logged" }, { headers: { authorization: `Bearer ${adminToken}` } });
    await admin.listAccounts({}, { headers: { authorization: "Bearer wrong-token-wrong-token" } }).catch(() => undefined);
    // A request the HTTP parser refuses, with credentials in it.
    await new Promise<void>((resolve) => {
      const s = net.connect(gw.port, "127.0.0.1", () => s.end(`GET /retail/item_get/?key=${a.key}&secret=${a.secret} HTTP/1.1\r\nBad Header\r\n\r\n`));
      s.on("close", () => resolve());
      s.resume();
    });

    secrets.push(a.key, a.secret, hmacKey, sign, signature, headerSignature, rpcSignature, adminToken, created.secret, gw.account.secret);
    await new Promise((r) => setTimeout(r, 100));
    expect(lines.length).toBeGreaterThan(20);
    const leaks = lines.filter((line) => secrets.some((s) => line.includes(s)));
    expect(leaks).toEqual([]);
    expect(lines.some((l) => l.includes("secret=[redacted]"))).toBe(true);
  });
});

describe("a test's failure message", () => {
  it("quotes a demo gateway's output without the demo secret or the run's admin token, wherever the banner prints them", async () => {
    const dir = mkdtempSync(join(tmpdir(), "gateway-banner-"));
    const s = await startServe({ GATEWAY_DATA_DIR: dir, GATEWAY_LOG_LEVEL: "warn" }, { demo: true });
    try {
      const out = s.output();
      const secret = /Demo account\s+key: \S+\s+secret: (\S+)/.exec(out)![1]!;
      const token = /Admin API \(token for this run only[^)]*\): (\S+)/.exec(out)![1]!;
      // The banner prints each several times: in its header and in every ready-to-paste command.
      expect(out.split(secret).length).toBeGreaterThan(3);
      expect(out.split(token).length).toBeGreaterThan(2);
      const shown = withoutSecrets(out);
      expect(shown).not.toContain(secret);
      expect(shown).not.toContain(token);
      expect(withoutSecrets(JSON.stringify(out))).not.toContain(secret);
      expect(shown).toContain("[redacted]");
    } finally {
      s.child.kill("SIGKILL");
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
