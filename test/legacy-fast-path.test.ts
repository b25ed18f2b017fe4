// The legacy fast path (legacy-fast-path.ts) answers plain GETs on Node's
// request, before Fastify. Legacy clients parse these bytes, so it must be
// indistinguishable from the Fastify route: two gateways, one with the fast
// path and one without, get the same matrix of requests, and the status,
// every header in order (Date aside) and the body (its per-call fields
// aside) must match, and so must the access log lines.
import http from "node:http";
import { brotliDecompressSync, gunzipSync, inflateSync } from "node:zlib";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { parseRate } from "../src/core/call-rate.ts";
import { formatDateTime } from "../src/core/clock.ts";
import { legacySign, legacySigningKey } from "../src/core/legacy-signature.ts";
import { operations } from "../src/operations/index.ts";
import { fastifyHandlers } from "./support/fastify-handlers.ts";
import { demo, startGateway, type GatewayFixture } from "./support/gateway-fixture.ts";
import { steadyQuota } from "./support/quota-headers.ts";

/** A GET with exactly these headers (fetch would add its own): status, raw headers in order, body as sent. */
function get(port: number, path: string, headers: Record<string, string> = {}, method = "GET", body?: string): Promise<{ status: number; head: string[]; body: Buffer }> {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: "127.0.0.1", port, path, method, headers, agent: false }, (res) => {
      const chunks: Buffer[] = [];
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("end", () => resolve({ status: res.statusCode!, head: res.rawHeaders, body: Buffer.concat(chunks) }));
      res.on("error", reject);
    });
    req.on("error", reject);
    req.end(body);
  });
}

// Fields that differ from call to call, or between two gateways that stored the same item at different moments.
const perCall = ["request_id", "execution_time", "server_time", "server_memory", "secache", "secache_time", "secache_date", "translate_time"];
const fieldList = perCall.join("|");

/** The body as a client reads it, its per-call fields blanked, whatever the result_type. */
function steady(res: { head: string[]; body: Buffer }): string {
  const encoding = header(res, "content-encoding");
  const body = encoding === "gzip" ? gunzipSync(res.body) : encoding === "br" ? brotliDecompressSync(res.body) : encoding === "deflate" ? inflateSync(res.body) : res.body;
  // A refusal for the rate says its wait to the ms: the same within a second on both gateways.
  const text = body.toString("utf8").replace(/admitted in \d+ ms/, "admitted in … ms");
  const type = header(res, "content-type") ?? "";
  if (type.startsWith("application/json")) {
    const json = JSON.parse(text) as Record<string, unknown>;
    for (const k of perCall) if (k in json) json[k] = "…";
    return JSON.stringify(json);
  }
  if (type.startsWith("application/xml")) return text.replace(new RegExp(`<(${fieldList})( [^>]*)?>[^<]*</\\1>`, "g"), "<$1>…</$1>");
  // serialize: s:N:"key"; then the value; var_export: 'key' => value,
  return text
    .replace(new RegExp(`(s:\\d+:"(?:${fieldList})";)(s:\\d+:"[^"]*";|i:-?\\d+;|d:[^;]*;)`, "g"), "$1…;")
    .replace(new RegExp(`('(?:${fieldList})' => )('(?:[^'\\\\]|\\\\.)*'|-?[\\d.E+-]+)`, "g"), "$1…");
}

function header(res: { head: string[] }, name: string): string | undefined {
  for (let i = 0; i < res.head.length; i += 2) if (res.head[i]!.toLowerCase() === name) return res.head[i + 1];
  return undefined;
}

/** The header block in order, the date and the body's length aside (the per-call fields' lengths vary). */
function headBlock(res: { head: string[] }): string[] {
  const out: string[] = [];
  for (let i = 0; i < res.head.length; i += 2) {
    const name = res.head[i]!;
    if (name === "Date") continue;
    const value = name.toLowerCase() === "ratelimit" ? steadyQuota(res.head[i + 1]!) : res.head[i + 1];
    out.push(name.toLowerCase() === "content-length" ? name : `${name}: ${value}`);
  }
  return out;
}

describe.each([
  ["default settings", {}],
  // CORS with a list of origins (Vary: Origin, no Allow-Origin without Origin), and a trusted proxy's forwarded address.
  ["a list of CORS origins and a trusted proxy", { corsOrigins: ["https://shop.example"], trustedProxies: ["127.0.0.1"] }],
])("the legacy fast path beside the Fastify route, %s", (_name, app) => {
  const fastLines: string[] = [];
  const slowLines: string[] = [];
  let fast: GatewayFixture;
  let slow: GatewayFixture;
  beforeAll(async () => {
    fast = await startGateway({ app, logLines: fastLines });
    slow = await startGateway({ app: { ...app, legacyFastPath: false }, logLines: slowLines });
  });
  afterAll(async () => {
    await fast?.close();
    await slow?.close();
  });

  const args: Record<string, Record<string, string>> = {
    "retail/item_get": { num_iid: demo.retailNumIid, is_promotion: "1" },
    "wholesale/item_search_peerbuy": { num_iid: demo.wholesaleNumIid, sid: demo.wholesaleSid },
    "wholesale/item_get": { num_iid: demo.wholesaleNumIid },
  };

  interface Case {
    readonly name: string;
    readonly params?: Record<string, string>;
    readonly headers?: Record<string, string>;
    readonly auth?: "query" | "wrong-secret" | "none" | "header" | "signed" | "over-rate";
    readonly bare?: boolean;
    readonly raw?: string;
  }
  const cases: Case[] = [
    { name: "json" },
    { name: "jsonu", params: { result_type: "jsonu" } },
    { name: "xml", params: { result_type: "xml" } },
    { name: "serialize", params: { result_type: "serialize" } },
    { name: "var_export", params: { result_type: "var_export" } },
    { name: "an unknown result_type (4003)", params: { result_type: "yaml" } },
    { name: "gzip accepted", headers: { "accept-encoding": "gzip" } },
    { name: "br then gzip accepted", params: { result_type: "xml" }, headers: { "accept-encoding": "gzip;q=0.5, br" } },
    { name: "deflate only", params: { result_type: "serialize" }, headers: { "accept-encoding": "deflate" } },
    { name: "an encoding we do not offer", headers: { "accept-encoding": "zstd" } },
    { name: "no trailing slash", bare: true },
    { name: "cache=no", params: { cache: "no" } },
    { name: "lang=en", params: { lang: "en" } },
    { name: "cache=maybe (4003)", params: { cache: "maybe" } },
    { name: "no such item (2000)", params: { num_iid: "999999999999" } },
    { name: "an argument out of form (4003)", params: { num_iid: "12ab" } },
    { name: "a missing argument (4014)", params: { num_iid: "" } },
    { name: "a repeated parameter (4003)", raw: "&num_iid=1" },
    { name: "a wrong secret (4005)", auth: "wrong-secret" },
    { name: "no key (4014)", auth: "none" },
    { name: "the key in Authorization (Bearer), the secret in the query", auth: "header" },
    { name: "a signed call (dateline and sign)", auth: "signed" },
    { name: "a forwarded address", headers: { "x-forwarded-for": "203.0.113.9" } },
    { name: "over the account's rate (4008, Retry-After)", auth: "over-rate" },
    { name: "over the account's rate, xml, gzip accepted", params: { result_type: "xml" }, headers: { "accept-encoding": "gzip" }, auth: "over-rate" },
  ];

  let signed = 0;
  const pathOf = (gw: GatewayFixture, op: (typeof operations)[number], c: Case, account = gw.account) => {
    const params: Record<string, string> = { ...args[op.id], ...c.params };
    if (c.auth === undefined || c.auth === "query" || c.auth === "over-rate") Object.assign(params, { key: account.key, secret: account.secret });
    if (c.auth === "wrong-secret") Object.assign(params, { key: gw.account.key, secret: "wrong" });
    if (c.auth === "header") params.secret = gw.account.secret;
    if (c.auth === "signed") {
      // A sign is good once: each call signs another version.
      Object.assign(params, { key: gw.account.key, version: String(++signed), dateline: formatDateTime(Date.now(), "Asia/Shanghai") });
      params.sign = legacySign({ ...params, api_name: op.apiName }, legacySigningKey(gw.account.secret));
    }
    const path = c.bare === true ? op.path.replace(/\/$/, "") : op.path;
    return `${path}?${new URLSearchParams(params)}${c.raw ?? ""}`;
  };
  const headersOf = (gw: GatewayFixture, c: Case) => ({ ...(c.auth === "header" ? { authorization: `Bearer ${gw.account.key}` } : {}), ...c.headers });

  describe.each(operations.map((op) => [op.id, op] as const))("%s", (_id, op) => {
    it.each(cases.map((c) => [c.name, c] as const))("%s", async (_case, c) => {
      // Over the rate: an account of 1/h of its own on each gateway, refused after its first call for the same whole seconds.
      const plan = { name: "over-rate", rate: parseRate("1/h") };
      const accounts = c.auth === "over-rate" ? new Map([[fast, await fast.newAccount(plan)], [slow, await slow.newAccount(plan)]]) : undefined;
      const send = (gw: GatewayFixture) => get(gw.port, pathOf(gw, op, c, accounts?.get(gw)), headersOf(gw, c));
      // Each twice, so the second is a cache hit on both.
      await send(fast);
      await send(slow);
      const { result: a, handled } = await fastifyHandlers(() => send(fast));
      const b = await send(slow);
      expect(handled, "the fast path answered without Fastify").toBe(0);
      expect(a.status).toBe(b.status);
      expect(headBlock(a)).toEqual(headBlock(b));
      expect(Number(header(a, "content-length"))).toBe(a.body.length);
      expect(steady(a)).toBe(steady(b));
      if (c.auth === "over-rate") expect([steady(a).includes("4008"), header(a, "retry-after")]).toEqual([true, "3600"]);
    });
  });

  it("writes the same access lines, under the id the answer carries", async () => {
    const op = operations[0]!;
    const at = [fastLines.length, slowLines.length];
    const a = await get(fast.port, pathOf(fast, op, { name: "json" }));
    const b = await get(slow.port, pathOf(slow, op, { name: "json" }));
    const lines = (all: string[], from: number) =>
      all.slice(from).map((l) => JSON.parse(l) as { msg: string; requestId?: string; req?: { url: string; remoteAddress: string }; res?: { statusCode: number }; responseTime?: number });
    const la = lines(fastLines, at[0]!);
    const lb = lines(slowLines, at[1]!);
    expect(la.map((l) => l.msg)).toEqual(["incoming request", "request completed"]);
    expect(lb.map((l) => l.msg)).toEqual(["incoming request", "request completed"]);
    const idOf = (res: { body: Buffer }) => (JSON.parse(res.body.toString()) as { request_id: string }).request_id;
    expect(la.every((l) => l.requestId === idOf(a))).toBe(true);
    expect(lb.every((l) => l.requestId === idOf(b))).toBe(true);
    const shape = (l: (typeof la)[number]) => ({ ...l, time: 0, pid: 0, requestId: "", responseTime: typeof l.responseTime, req: l.req && { ...l.req, url: l.req.url.replace(/key=[^&]*/, "key=…") } });
    expect(la.map(shape)).toEqual(lb.map(shape));
    expect(la[0]!.req!.url).toContain("secret=[redacted]");
  });

  it("leaves to Fastify what it does not serve, and answers those alike", async () => {
    const op = operations[0]!;
    const declined: { name: string; method: string; headers?: Record<string, string>; body?: string }[] = [
      { name: "a request with Origin (its CORS headers depend on it)", method: "GET", headers: { origin: "https://shop.example" } },
      { name: "HEAD", method: "HEAD" },
      { name: "a GET with a body", method: "GET", headers: { "content-type": "application/json", "content-length": "2" }, body: "{}" },
      { name: "POST", method: "POST", headers: { "content-type": "application/x-www-form-urlencoded" }, body: "is_promotion=1" },
    ];
    for (const d of declined) {
      const send = (gw: GatewayFixture) => get(gw.port, pathOf(gw, op, { name: d.name }), d.headers, d.method, d.body);
      const { result: a, handled } = await fastifyHandlers(() => send(fast));
      const b = await send(slow);
      expect(handled, d.name).toBe(1);
      expect(a.status, d.name).toBe(b.status);
      expect(headBlock(a), d.name).toEqual(headBlock(b));
      if (d.method !== "HEAD") expect(steady(a), d.name).toBe(steady(b));
    }
  });
});

it("is an operator's switch: GATEWAY_LEGACY_FAST_PATH=off sends every legacy call through Fastify", async () => {
  const off = await startGateway({ config: { legacyFastPath: "off" } });
  try {
    const op = operations[0]!;
    const { result, handled } = await fastifyHandlers(() => get(off.port, `${op.path}?${new URLSearchParams({ key: off.account.key, secret: off.account.secret, num_iid: demo.retailNumIid })}`));
    expect(JSON.parse(result.body.toString())).toMatchObject({ error_code: "0000" });
    expect(handled).toBe(1);
  } finally {
    await off.close();
  }
});
