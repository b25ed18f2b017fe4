import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import http from "node:http";
import zlib from "node:zlib";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { RetailService } from "../src/gen/gateway/catalogue/v1/retail_pb.js";
import { demo, startGateway, type GatewayFixture } from "./support/gateway-fixture.ts";

let gw: GatewayFixture;
let auth: { key: string; secret: string };

beforeAll(async () => {
  gw = await startGateway({ app: { maxBodyBytes: 4096 } });
  auth = { key: gw.account.key, secret: gw.account.secret };
});
afterAll(() => gw.close());

interface Raw {
  status: number;
  headers: http.IncomingHttpHeaders;
  body: Buffer;
}

/** A request with exactly the headers given (fetch would add and undo Accept-Encoding). */
function raw(method: string, path: string, headers: Record<string, string> = {}, body?: string | Buffer): Promise<Raw> {
  return new Promise((resolve, reject) => {
    const req = http.request(`${gw.base}${path}`, { method, headers }, (res) => {
      const chunks: Buffer[] = [];
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("end", () => resolve({ status: res.statusCode!, headers: res.headers, body: Buffer.concat(chunks) }));
    });
    req.on("error", reject);
    req.end(body);
  });
}

const itemPath = () => `/retail/item_get/?${new URLSearchParams({ ...auth, num_iid: demo.retailNumIid })}`;

describe("compression", () => {
  it.each([
    ["gzip", zlib.gunzipSync],
    ["deflate", zlib.inflateSync],
    ["br", zlib.brotliDecompressSync],
  ] as const)("%s compresses the body and says Vary: Accept-Encoding", async (encoding, decode) => {
    const plain = await raw("GET", itemPath());
    const packed = await raw("GET", itemPath(), { "accept-encoding": encoding });
    expect(packed.headers["content-encoding"]).toBe(encoding);
    expect(packed.headers.vary).toMatch(/accept-encoding/i);
    expect(packed.body.length).toBeLessThan(plain.body.length / 2);
    const body = JSON.parse(decode(packed.body).toString()) as { item: unknown };
    expect(body.item).toEqual((JSON.parse(plain.body.toString()) as { item: unknown }).item);
  });

  it("sends identity when nothing is accepted, still with Vary", async () => {
    const plain = await raw("GET", itemPath());
    expect(plain.headers["content-encoding"]).toBeUndefined();
    expect(plain.headers.vary).toMatch(/accept-encoding/i);
    expect(JSON.parse(plain.body.toString()).error_code).toBe("0000");
  });

  it("compresses error answers too (legacy clients read bodies of every answer)", async () => {
    const packed = await raw("GET", "/retail/item_get/?num_iid=1", { "accept-encoding": "gzip" });
    expect(JSON.parse(zlib.gunzipSync(packed.body).toString()).error_code).toBe("4014");
  });
});

describe("result formats", () => {
  it.each([
    ["json", "application/json; charset=utf-8"],
    ["jsonu", "application/json; charset=utf-8"],
    ["xml", "application/xml; charset=utf-8"],
    ["serialize", "text/plain; charset=utf-8"],
    ["var_export", "text/plain; charset=utf-8"],
  ])("%s has content type %s, success and error alike", async (format, type) => {
    const ok = await raw("GET", `${itemPath()}&result_type=${format}`);
    const error = await raw("GET", `/retail/item_get/?num_iid=1&result_type=${format}`);
    for (const r of [ok, error]) {
      expect(r.status).toBe(200);
      expect(r.headers["content-type"]).toBe(type);
    }
    const errorText = error.body.toString();
    const expectCode = { json: '"error_code":"4014"', jsonu: '"error_code":"4014"', xml: "<error_code>4014</error_code>", serialize: 's:10:"error_code";s:4:"4014";', var_export: "'error_code' => '4014'," }[format]!;
    expect(errorText).toContain(expectCode);
  });

  it("answers an unknown result_type with 4003 in json, listing the accepted values", async () => {
    const r = await raw("GET", `${itemPath()}&result_type=yaml`);
    const json = JSON.parse(r.body.toString()) as { error_code: string; reason: string };
    expect(json.error_code).toBe("4003");
    expect(json.reason).toContain("json, jsonu, xml, serialize, var_export");
  });
});

describe("POST", () => {
  const path = () => `/retail/item_get/?key=${auth.key}`;

  it("takes the parameters as a JSON body", async () => {
    const r = await raw("POST", path(), { "content-type": "application/json" }, JSON.stringify({ secret: auth.secret, num_iid: demo.retailNumIid, is_promotion: 1 }));
    const json = JSON.parse(r.body.toString());
    expect(json.error_code).toBe("0000");
    expect(json.call_args).toEqual({ num_iid: demo.retailNumIid, is_promotion: "1" });
  });

  it("takes the parameters as a form body, in the result_type asked for", async () => {
    const form = new URLSearchParams({ secret: auth.secret, num_iid: demo.retailNumIid, result_type: "serialize" }).toString();
    const r = await raw("POST", path(), { "content-type": "application/x-www-form-urlencoded" }, form);
    expect(r.headers["content-type"]).toBe("text/plain; charset=utf-8");
    expect(r.body.toString()).toContain('s:10:"error_code";s:4:"0000";');
  });

  it("refuses a compressed body with 4003 saying so, whatever it holds: before, a gzipped form answered 4014 'missing url param: key' with the key inside it", async () => {
    const form = new URLSearchParams({ key: auth.key, secret: auth.secret, num_iid: demo.retailNumIid }).toString();
    const json = JSON.stringify({ key: auth.key, secret: auth.secret, num_iid: demo.retailNumIid });
    const reason = "the request body is sent with a Content-Encoding; a legacy call's body must be sent uncompressed";
    for (const [type, body] of [["application/x-www-form-urlencoded", form], ["application/json", json]] as const) {
      for (const coding of ["gzip", "deflate", "br", "GZIP "]) {
        const packed = coding.trim().toLowerCase() === "gzip" ? zlib.gzipSync(body) : coding === "deflate" ? zlib.deflateSync(body) : zlib.brotliCompressSync(body);
        const r = await raw("POST", "/retail/item_get/", { "content-type": type, "content-encoding": coding }, packed);
        const answer = JSON.parse(r.body.toString()) as { error_code: string; reason: string };
        expect([r.status, answer.error_code, answer.reason], `${type} ${coding}`).toEqual([200, "4003", reason]);
      }
      // A request without a body is not refused for the header alone (with an Origin, Fastify serves it, not the fast path).
      const bodiless = await raw("GET", `/retail/item_get/?${new URLSearchParams({ key: auth.key, secret: auth.secret, num_iid: demo.retailNumIid })}`, { "content-encoding": "gzip", origin: "https://x.example" });
      expect(JSON.parse(bodiless.body.toString()).error_code).toBe("0000");
      // Sent as it is (identity, named or not), it is read.
      for (const coding of [undefined, "identity"]) {
        const r = await raw("POST", "/retail/item_get/", { "content-type": type, ...(coding ? { "content-encoding": coding } : {}) }, body);
        expect(JSON.parse(r.body.toString()).error_code, `${type} ${coding}`).toBe("0000");
      }
    }
  });

  it("lets the query's key win over the body's", async () => {
    const r = await raw("POST", path(), { "content-type": "application/json" }, JSON.stringify({ key: "someone-else", secret: auth.secret, num_iid: demo.retailNumIid }));
    expect(JSON.parse(r.body.toString()).error_code).toBe("0000");
  });

  it.each([
    ["a different num_iid in query and body", `&num_iid=1`, "application/json", JSON.stringify({ num_iid: "2" }), "4003"],
    ["a non-string value", "", "application/json", JSON.stringify({ num_iid: ["1"] }), "4003"],
    ["a JSON list", "", "application/json", "[1]", "4003"],
    ["invalid JSON", "", "application/json", "{num_iid:", "4003"],
    ["another content type", "", "text/plain", "num_iid=1", "4003"],
    ["a repeated form field", "", "application/x-www-form-urlencoded", "num_iid=1&num_iid=2", "4003"],
  ])("refuses %s with %s", async (_name, extraQuery, type, body, code) => {
    const r = await raw("POST", `${path()}&secret=${auth.secret}${extraQuery}`, { "content-type": type }, body);
    expect(r.status).toBe(200);
    expect(JSON.parse(r.body.toString()).error_code).toBe(code);
  });

  it("caps the body on the legacy path with a clear 4003", async () => {
    const r = await raw("POST", path(), { "content-type": "application/json" }, JSON.stringify({ secret: auth.secret, num_iid: "1", pad: "x".repeat(5000) }));
    const json = JSON.parse(r.body.toString()) as { error_code: string; reason: string };
    expect(json.error_code).toBe("4003");
    expect(json.reason).toContain("larger than 4096 bytes");
  });

  it("caps the body on the Connect path (readMaxBytes)", async () => {
    const client = createClient(RetailService, createConnectTransport({ baseUrl: gw.base, httpVersion: "1.1" }));
    const err = await client
      .itemGet({ numIid: "1", isPromotion: "x".repeat(5000) }, { headers: { "x-api-key": auth.key, "x-api-secret": auth.secret } })
      .then(() => undefined, ConnectError.from);
    expect(err?.code).toBe(Code.ResourceExhausted);
  });
});

describe("HEAD and OPTIONS", () => {
  it("HEAD has GET's headers and no body", async () => {
    const r = await raw("HEAD", itemPath());
    expect(r.status).toBe(200);
    expect(r.headers["content-type"]).toBe("application/json; charset=utf-8");
    expect(r.body.length).toBe(0);
  });

  it("OPTIONS says what a legacy path allows", async () => {
    const r = await raw("OPTIONS", "/retail/item_get/");
    expect(r.status).toBe(204);
    expect(r.headers.allow).toBe("GET, HEAD, POST, OPTIONS");
  });

  it("answers a browser's CORS preflight for an RPC, allowing the Connect and credential headers", async () => {
    const r = await raw("OPTIONS", "/gateway.catalogue.v1.RetailService/ItemGet", {
      origin: "https://shop.example.com",
      "access-control-request-method": "POST",
      "access-control-request-headers": "content-type,connect-protocol-version,x-api-key,x-api-secret",
    });
    expect(r.status).toBe(204);
    expect(r.headers["access-control-allow-origin"]).toBe("*");
    const allowed = String(r.headers["access-control-allow-headers"]).toLowerCase();
    for (const h of ["content-type", "connect-protocol-version", "x-api-key", "x-api-secret"]) expect(allowed).toContain(h);
  });

  it("exposes the CORS headers on the actual responses", async () => {
    const r = await raw("GET", itemPath(), { origin: "https://shop.example.com" });
    expect(r.headers["access-control-allow-origin"]).toBe("*");
  });
});
