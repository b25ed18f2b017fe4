// The AdminService and a team's AccountService take only the fields they have (src/transports/connect/known-fields.ts):
// a misspelt or newer field is refused, invalid_argument, on every protocol, and nothing is done; the catalogue
// services still ignore one, as connect-node does.
import { create, type DescMessage, type MessageShape } from "@bufbuild/protobuf";
import { WireType } from "@bufbuild/protobuf/wire";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport, createGrpcWebTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { AccountService, ListMyCallsRequestSchema } from "../src/gen/gateway/account/v1/account_pb.js";
import { AdminService, CallRateSchema, CreateAccountRequestSchema, WatchCallsRequestSchema } from "../src/gen/gateway/admin/v1/admin_pb.js";
import { ItemGetRequestSchema, RetailService } from "../src/gen/gateway/catalogue/v1/retail_pb.js";
import { adminToken, demo, startGateway, type GatewayFixture } from "./support/gateway-fixture.ts";

let gw: GatewayFixture;
beforeAll(async () => {
  gw = await startGateway();
});
afterAll(() => gw.close());

const asAdmin = { headers: { authorization: `Bearer ${adminToken}` } };
const transports = {
  "Connect binary": () => createConnectTransport({ baseUrl: gw.base, httpVersion: "1.1", useBinaryFormat: true }),
  gRPC: () => createGrpcTransport({ baseUrl: gw.base }),
  "gRPC-Web": () => createGrpcWebTransport({ baseUrl: gw.base, httpVersion: "1.1" }),
};

/** A message with a field number its schema lacks, as a client built from a newer schema writes it. */
function withUnknown<D extends DescMessage>(schema: D, init: Parameters<typeof create<D>>[1], no = 99): MessageShape<D> {
  const message = create(schema, init);
  (message as { $unknown?: unknown }).$unknown = [{ no, wireType: WireType.Varint, data: Uint8Array.of(1) }];
  return message;
}

async function accountCount(): Promise<number> {
  return (await createClient(AdminService, createConnectTransport({ baseUrl: gw.base, httpVersion: "1.1" })).listAccounts({ pageSize: 1000 }, asAdmin)).accounts.length;
}

async function postJson(path: string, body: string, headers: Record<string, string>): Promise<{ status: number; json: { code?: string; message?: string } & Record<string, unknown> }> {
  const res = await fetch(`${gw.base}${path}`, { method: "POST", headers: { "content-type": "application/json", ...headers }, body });
  return { status: res.status, json: (await res.json()) as { code?: string; message?: string } };
}

describe("the AdminService takes only the fields it has", () => {
  it("refuses a JSON key or enum name it lacks, naming it, and changes nothing", async () => {
    const before = await accountCount();
    // Meant: dailyMax. Before, this made an account of the default 10,000 calls a day, and answered OK.
    const misspelt = await postJson("/gateway.admin.v1.AdminService/CreateAccount", JSON.stringify({ name: "misspelt", dailyMaximum: 5 }), asAdmin.headers);
    expect(misspelt.status).toBe(400);
    expect(misspelt.json).toMatchObject({ code: "invalid_argument" });
    expect(misspelt.json.message).toContain('key "dailyMaximum" is unknown');
    const nested = await postJson("/gateway.admin.v1.AdminService/CreateAccount", JSON.stringify({ name: "nested", rate: { calls: 5, second: 1 } }), asAdmin.headers);
    expect(nested.json.message).toContain('key "second" is unknown');
    const enumName = await postJson("/gateway.admin.v1.AdminService/ListCalls", JSON.stringify({ errorCode: "ERROR_CODE_CALLS_EXCEDED" }), asAdmin.headers);
    expect(enumName.json).toMatchObject({ code: "invalid_argument" });
    expect(await accountCount()).toBe(before);
    // What it has is taken as before.
    const right = await postJson("/gateway.admin.v1.AdminService/CreateAccount", JSON.stringify({ name: "right", dailyMax: 5 }), asAdmin.headers);
    expect(right.status).toBe(200);
    expect((right.json.account as { dailyMax: string }).dailyMax).toBe("5");
  });

  it.each(Object.entries(transports))("refuses a field number it lacks over %s, at any depth, and changes nothing", async (_name, transport) => {
    const client = createClient(AdminService, transport());
    const before = await accountCount();
    for (const request of [
      withUnknown(CreateAccountRequestSchema, { name: "newer" }),
      create(CreateAccountRequestSchema, { name: "newer rate", rate: withUnknown(CallRateSchema, { calls: 5, seconds: 1 }, 7) }),
    ]) {
      const err = await client.createAccount(request, asAdmin).then(() => undefined, ConnectError.from);
      expect(err?.code).toBe(Code.InvalidArgument);
      expect(err?.rawMessage).toMatch(/field number (99|7 in rate) is unknown/);
    }
    expect(await accountCount()).toBe(before);
    // The token is checked first: a caller without one learns nothing of the fields.
    const anonymous = await client.createAccount(withUnknown(CreateAccountRequestSchema, { name: "newer" })).then(() => undefined, ConnectError.from);
    expect(anonymous?.code).toBe(Code.Unauthenticated);
  });

  it("refuses a server stream's request with a field it lacks (WatchCalls) before its first message", async () => {
    const client = createClient(AdminService, createGrpcTransport({ baseUrl: gw.base }));
    const stream = client.watchCalls(withUnknown(WatchCallsRequestSchema, { pageSize: 10 }), asAdmin);
    const err = await (async () => {
      for await (const _ of stream) return undefined;
    })().then(() => undefined, ConnectError.from);
    expect(err?.code).toBe(Code.InvalidArgument);
    expect(err?.rawMessage).toContain("field number 99 is unknown");
  });
});

describe("a team's AccountService takes only the fields it has", () => {
  const asTeam = () => ({ headers: { "x-api-key": gw.account.key, "x-api-secret": gw.account.secret } });

  it("refuses a misspelt filter instead of giving every call", async () => {
    // A refused call, then an answered one: a filter for 4013 must not give the 0000.
    const legacy = `${gw.base}/retail/item_get/?${new URLSearchParams({ key: gw.account.key, secret: gw.account.secret, num_iid: demo.retailNumIid })}`;
    await (await fetch(legacy)).text();
    const misspelt = await postJson("/gateway.account.v1.AccountService/ListMyCalls", JSON.stringify({ errorCod: "ERROR_CODE_CALLS_EXCEEDED" }), asTeam().headers);
    expect(misspelt.status).toBe(400);
    expect(misspelt.json.message).toContain('key "errorCod" is unknown');
    const right = await postJson("/gateway.account.v1.AccountService/ListMyCalls", JSON.stringify({ errorCode: "ERROR_CODE_CALLS_EXCEEDED" }), asTeam().headers);
    expect(right.status).toBe(200);
    expect(right.json.calls ?? []).toEqual([]);
  });

  it.each(Object.entries(transports))("refuses a field number it lacks over %s", async (_name, transport) => {
    const client = createClient(AccountService, transport());
    const err = await client.listMyCalls(withUnknown(ListMyCallsRequestSchema, {}), asTeam()).then(() => undefined, ConnectError.from);
    expect(err?.code).toBe(Code.InvalidArgument);
    expect(err?.rawMessage).toContain("field number 99 is unknown");
    expect((await client.listMyCalls(create(ListMyCallsRequestSchema, {}), asTeam())).calls.length).toBeGreaterThan(0);
  });
});

describe("the catalogue services", () => {
  it("still ignore a field they lack, as a bare connect-node does (issue 15's differential test holds them to it)", async () => {
    const headers = { "x-api-key": gw.account.key, "x-api-secret": gw.account.secret };
    const answer = await postJson("/gateway.catalogue.v1.RetailService/ItemGet", JSON.stringify({ numIid: demo.retailNumIid, fromANewerClient: true }), headers);
    expect(answer.status).toBe(200);
    expect(answer.json.item).toBeDefined();
    // Over binary and gRPC too.
    for (const transport of [transports["Connect binary"], transports.gRPC]) {
      const retail = createClient(RetailService, transport());
      const res = await retail.itemGet(withUnknown(ItemGetRequestSchema, { numIid: demo.retailNumIid }), { headers });
      expect(res.item?.numIid).toBe(demo.retailNumIid);
    }
  });
});
