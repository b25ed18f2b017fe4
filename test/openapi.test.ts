import { validate } from "@readme/openapi-parser";
import { Ajv2020 } from "ajv/dist/2020.js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { operations } from "../src/operations/index.ts";
import { demo, legacyGet, startGateway, type GatewayFixture } from "./support/gateway-fixture.ts";

let gw: GatewayFixture;
let doc: { openapi: string; paths: Record<string, { get: { parameters: { name: string; schema: Record<string, unknown>; required: boolean }[] } }>; components: { schemas: Record<string, unknown> } };

beforeAll(async () => {
  gw = await startGateway();
  const res = await fetch(`${gw.base}/openapi.json`);
  expect(res.status).toBe(200);
  expect(res.headers.get("content-type")).toMatch(/^application\/json/);
  doc = (await res.json()) as typeof doc;
});
afterAll(async () => {
  await gw?.close();
});

describe("GET /openapi.json", () => {
  it("is a valid OpenAPI 3.1 document by a maintained parser, which does refuse a broken one", async () => {
    expect(doc.openapi).toBe("3.1.0");
    const result = await validate(structuredClone(doc) as never);
    expect(result.valid, JSON.stringify(result)).toBe(true);
    const broken = structuredClone(doc) as unknown as { paths: Record<string, { get: { responses: unknown } }> };
    broken.paths["/retail/item_get/"]!.get.responses = { "200": { content: { "application/json": { schema: { $ref: "#/components/schemas/Nothing" } } } } };
    expect((await validate(broken as never)).valid).toBe(false);
  });

  it("has every legacy path the proto annotations declare, each argument with its allowed values", () => {
    expect(Object.keys(doc.paths).sort()).toEqual(operations.map((op) => op.path).sort());
    for (const op of operations) {
      const params = doc.paths[op.path]!.get.parameters;
      for (const arg of op.args) {
        const p = params.find((x) => x.name === arg.name)!;
        expect(p.required).toBe(arg.required);
        if (typeof arg.accepts === "string") expect(p.schema.pattern).toBe(arg.accepts === "numeric" ? "^[0-9]*$" : "^[A-Za-z0-9_-]*$");
        else expect(p.schema.enum).toEqual([...arg.accepts]);
      }
      expect(params.find((x) => x.name === "result_type")!.schema.enum).toEqual(["json", "jsonu", "xml", "serialize", "var_export"]);
      // The Idempotency-Key header, on GET and POST (test/idempotency-keys.test.ts sends it).
      for (const method of ["get", "post"] as const) {
        expect((doc.paths[op.path] as unknown as Record<string, { parameters: { name: string; in: string }[] }>)[method]!.parameters.find((x) => x.name === "Idempotency-Key")?.in).toBe("header");
      }
      // What a refused caller's software reads besides the body (test/rate-limit.test.ts sends it).
      const answer = (doc.paths[op.path] as unknown as { get: { responses: Record<string, { headers?: Record<string, { schema: unknown }> }> } }).get.responses["200"]!;
      expect(answer.headers?.["Retry-After"]?.schema).toEqual({ type: "integer", minimum: 1 });
      // And on every answer to an identified account (test/quota-headers.test.ts).
      expect(Object.keys(answer.headers ?? {})).toEqual(["Retry-After", "RateLimit", "RateLimit-Policy", "Idempotent-Replayed", "Original-Request-Id"]);
    }
    expect((doc.components.schemas.ErrorCode as { enum: string[] }).enum).toEqual(expect.arrayContaining(["0000", "2000", "4004", "4010", "4017"]));
  });

  it("describes the real answers: each operation's found answer and a refusal validate against its schemas", async () => {
    const ajv = new Ajv2020({ strict: false });
    ajv.addSchema({ $id: "doc", components: doc.components });
    const schemaOf = (name: string) => ajv.getSchema(`doc#/components/schemas/${name}`)!;
    const auth = { key: gw.account.key, secret: gw.account.secret };
    const calls: [string, Record<string, string>, string][] = [
      ["/retail/item_get/", { num_iid: demo.retailNumIid }, "ItemGetRetailAnswer"],
      ["/wholesale/item_get/", { num_iid: demo.wholesaleNumIid }, "ItemGetWholesaleAnswer"],
      ["/wholesale/item_search_peerbuy/", { num_iid: demo.wholesaleNumIid, sid: demo.wholesaleSid }, "ItemSearchPeerbuyWholesaleAnswer"],
    ];
    for (const [path, args, schema] of calls) {
      const res = await legacyGet(gw.base, path, { ...auth, ...args });
      expect(res.json.error_code, res.body.slice(0, 300)).toBe("0000");
      const check = schemaOf(schema);
      expect(check(res.json), JSON.stringify(check.errors)).toBe(true);
    }
    const refused = await legacyGet(gw.base, "/retail/item_get/", { num_iid: demo.retailNumIid });
    const status = schemaOf("StatusBlock");
    expect(status(refused.json), JSON.stringify(status.errors)).toBe(true);
    // Not vacuous: an answer missing its status block does not pass.
    const { error_code: _, ...withoutCode } = refused.json;
    expect(status(withoutCode)).toBe(false);
  });
});
