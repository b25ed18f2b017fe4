import { Code, ConnectError, createClient, createRouterTransport, type Transport } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { demoRecords } from "../src/catalogue/demo-dataset.ts";
import { RetailService } from "../src/gen/gateway/catalogue/v1/retail_pb.js";
import { CacheMode, Lang, StatusBlockSchema } from "../src/gen/gateway/catalogue/v1/status_pb.js";
import { WholesaleService } from "../src/gen/gateway/catalogue/v1/wholesale_pb.js";
import { operations } from "../src/operations/index.ts";
import { catalogueRoutes } from "../src/transports/connect/catalogue-services.ts";
import { demo, legacyGet, startGateway, type GatewayFixture } from "./support/gateway-fixture.ts";

/**
 * The error-code table, where it is decided: the legacy shim through
 * app.inject() and the RPC handlers over an in-memory router transport,
 * both on the fixture's real stores. That each transport carries a code
 * over a real socket is test/rpc-transports.test.ts's and
 * test/legacy-transport.test.ts's business.
 */
let gw: GatewayFixture;
let rpc: Transport;
let accounts: Record<"ok" | "stopped" | "expired" | "apiStopped" | "apiMissing", { key: string; secret: string }>;

const records = demoRecords();
const unobtainable = (records.find((r) => r.kind === "item_detail" && r.obtainable === false)!.item as { num_iid: string }).num_iid;
const noPeers = records.find((r) => r.kind === "peer_viewed" && (r.item as unknown[]).length === 0)!;

beforeAll(async () => {
  gw = await startGateway();
  rpc = createRouterTransport(catalogueRoutes(gw.runtime.gateway, operations));
  const admin = gw.runtime.admin;
  const stopped = await gw.newAccount();
  await admin.setStatus(stopped.key, "stopped");
  const apiStopped = await gw.newAccount();
  await admin.setOperation(apiStopped.key, "retail/item_get", "stopped");
  await admin.setOperation(apiStopped.key, "wholesale/item_search_peerbuy", "stopped");
  await admin.setOperation(apiStopped.key, "wholesale/item_get", "stopped");
  accounts = {
    ok: gw.account,
    stopped,
    expired: await gw.newAccount({ expires: "2020-01-01" }),
    apiStopped,
    apiMissing: await gw.newAccount({ operations: [] }),
  };
});
afterAll(() => gw.close());

type Op = "item_get" | "peerbuy" | "wholesale_item_get";
const paths: Record<Op, string> = { item_get: "/retail/item_get/", peerbuy: "/wholesale/item_search_peerbuy/", wholesale_item_get: "/wholesale/item_get/" };
interface Case {
  name: string;
  code: string;
  connect: Code;
  op: Op;
  account?: keyof typeof accounts;
  /** Credentials that differ from the account's. */
  credentials?: { key?: string; secret?: string };
  args: Record<string, string>;
  /** Options, as legacy query strings; the RPC path sends the typed equivalent. */
  options?: { cache?: string; lang?: string };
  /** RPC enum numbers for options the legacy path gives as unknown text. */
  rpcOptions?: { cache?: number; lang?: number };
  legacyOnly?: Record<string, string>;
}

const retail = { num_iid: demo.retailNumIid };
const wholesale = { num_iid: demo.wholesaleNumIid, sid: demo.wholesaleSid };

const cases: Case[] = [
  { name: "item not found", code: "2000", connect: Code.NotFound, op: "item_get", args: { num_iid: "123" } },
  { name: "item cannot be obtained", code: "2000", connect: Code.NotFound, op: "item_get", args: { num_iid: unobtainable } },
  { name: "no such wholesale item", code: "2000", connect: Code.NotFound, op: "peerbuy", args: { num_iid: "123", sid: "b2b-1" } },
  { name: "no peer-viewed items", code: "2000", connect: Code.NotFound, op: "peerbuy", args: { num_iid: noPeers.num_iid as string, sid: noPeers.sid as string } },
  { name: "non-numeric num_iid", code: "4003", connect: Code.InvalidArgument, op: "item_get", args: { num_iid: "12ab" } },
  { name: "too long num_iid", code: "4003", connect: Code.InvalidArgument, op: "item_get", args: { num_iid: "1".repeat(21) } },
  { name: "sid with odd characters", code: "4003", connect: Code.InvalidArgument, op: "peerbuy", args: { num_iid: "1", sid: "a b" } },
  { name: "unknown is_promotion", code: "4003", connect: Code.InvalidArgument, op: "item_get", args: { ...retail, is_promotion: "yes" } },
  { name: "unknown cache value", code: "4003", connect: Code.InvalidArgument, op: "item_get", args: retail, options: { cache: "maybe" }, rpcOptions: { cache: 9 } },
  { name: "unknown lang value", code: "4003", connect: Code.InvalidArgument, op: "peerbuy", args: wholesale, options: { lang: "de" }, rpcOptions: { lang: 9 } },
  { name: "unknown key", code: "4004", connect: Code.Unauthenticated, op: "item_get", credentials: { key: "nosuchkey", secret: "x" }, args: retail },
  { name: "wrong secret", code: "4005", connect: Code.Unauthenticated, op: "item_get", credentials: { secret: "wrong" }, args: retail },
  { name: "missing secret", code: "4005", connect: Code.Unauthenticated, op: "peerbuy", credentials: { secret: "" }, args: wholesale },
  { name: "expired key", code: "4005", connect: Code.Unauthenticated, op: "item_get", account: "expired", args: retail },
  { name: "operation stopped", code: "4006", connect: Code.PermissionDenied, op: "item_get", account: "apiStopped", args: retail },
  { name: "account stopped", code: "4007", connect: Code.PermissionDenied, op: "peerbuy", account: "stopped", args: wholesale },
  { name: "operation not added", code: "4012", connect: Code.PermissionDenied, op: "peerbuy", account: "apiMissing", args: wholesale },
  { name: "missing key", code: "4014", connect: Code.Unauthenticated, op: "item_get", credentials: { key: "" }, args: retail },
  { name: "missing num_iid", code: "4014", connect: Code.InvalidArgument, op: "item_get", args: {} },
  { name: "missing sid", code: "4014", connect: Code.InvalidArgument, op: "peerbuy", args: { num_iid: "1" } },
  { name: "no such wholesale item detail", code: "2000", connect: Code.NotFound, op: "wholesale_item_get", args: { num_iid: "123" } },
  { name: "a retail id is no wholesale item", code: "2000", connect: Code.NotFound, op: "wholesale_item_get", args: retail },
  { name: "non-numeric wholesale num_iid", code: "4003", connect: Code.InvalidArgument, op: "wholesale_item_get", args: { num_iid: "62ab" } },
  { name: "unknown wholesale is_promotion", code: "4003", connect: Code.InvalidArgument, op: "wholesale_item_get", args: { num_iid: demo.wholesaleNumIid, is_promotion: "2" } },
  { name: "wrong secret on wholesale item detail", code: "4005", connect: Code.Unauthenticated, op: "wholesale_item_get", credentials: { secret: "wrong" }, args: { num_iid: demo.wholesaleNumIid } },
  { name: "wholesale item detail stopped", code: "4006", connect: Code.PermissionDenied, op: "wholesale_item_get", account: "apiStopped", args: { num_iid: demo.wholesaleNumIid } },
  { name: "wholesale item detail not added", code: "4012", connect: Code.PermissionDenied, op: "wholesale_item_get", account: "apiMissing", args: { num_iid: demo.wholesaleNumIid } },
  { name: "missing wholesale num_iid", code: "4014", connect: Code.InvalidArgument, op: "wholesale_item_get", args: {} },
];

function credentialsOf(c: Case) {
  const account = accounts[c.account ?? "ok"];
  return { key: c.credentials?.key ?? account.key, secret: c.credentials?.secret ?? account.secret };
}

describe.each(cases)("$code $name", (c) => {
  it("legacy: HTTP 200, status block with the code and success 0", async () => {
    const { key, secret } = credentialsOf(c);
    const path = paths[c.op];
    const params: Record<string, string> = { ...c.args, ...c.options };
    if (key !== "") params.key = key;
    if (secret !== "") params.secret = secret;
    const res = await gw.app.inject({ method: "GET", url: `${path}?${new URLSearchParams(params)}` });
    const json = JSON.parse(res.body) as Record<string, unknown>;
    expect(res.statusCode).toBe(200);
    expect(json.error_code).toBe(c.code);
    expect(json.success).toBe(0);
    expect(json).not.toHaveProperty("item");
    expect(String(json.error)).not.toBe("");
    expect(String(json.reason)).not.toBe("");
    if (c.code === "2000") expect(json.error).toBe("item-not-found");
  });

  it("rpc: the matching Connect code, and the status block as detail", async () => {
    const { key, secret } = credentialsOf(c);
    const transport = rpc;
    const headers: Record<string, string> = {};
    if (key !== "") headers["x-api-key"] = key;
    if (secret !== "") headers["x-api-secret"] = secret;
    const cache = c.rpcOptions?.cache ?? CacheMode.UNSPECIFIED;
    const lang = c.rpcOptions?.lang ?? Lang.UNSPECIFIED;
    const call =
      c.op === "item_get"
        ? createClient(RetailService, transport).itemGet({ numIid: c.args.num_iid ?? "", isPromotion: c.args.is_promotion ?? "", cache, lang }, { headers })
        : c.op === "wholesale_item_get"
          ? createClient(WholesaleService, transport).itemGet({ numIid: c.args.num_iid ?? "", isPromotion: c.args.is_promotion ?? "", cache, lang }, { headers })
          : createClient(WholesaleService, transport).itemSearchPeerbuy({ numIid: c.args.num_iid ?? "", sid: c.args.sid ?? "", cache, lang }, { headers });
    const error = await call.then(
      () => undefined,
      (e: unknown) => ConnectError.from(e),
    );
    expect(error).toBeInstanceOf(ConnectError);
    expect(Code[error!.code]).toBe(Code[c.connect]);
    const [status] = error!.findDetails(StatusBlockSchema);
    expect(String(status?.errorCode).padStart(4, "0")).toBe(c.code);
    expect(status?.success).toBe(0);
    expect(error!.rawMessage.startsWith(c.code)).toBe(true);
  });
});

describe("legacy-only codes", () => {
  it.each([
    ["result_type not offered", "/retail/item_get/", { result_type: "yaml" }, "4003"],
    ["repeated parameter", "/retail/item_get/?num_iid=2", {}, "4003"],
    ["array-style parameter", "/retail/item_get/?num_iid[]=2", {}, "4003"],
  ])("%s answers %s", async (_name, path, extra, code) => {
    const [p, q] = (path as string).split("?");
    const url = `${gw.base}${p}?${new URLSearchParams({ key: gw.account.key, secret: gw.account.secret, num_iid: "1", ...(extra as object) })}${q ? `&${q}` : ""}`;
    const json = (await (await fetch(url)).json()) as Record<string, unknown>;
    expect(json.error_code).toBe(code);
  });

  it.each([
    ["/wholesale/item_search/", "item_search"],
    ["/wholesale/item_search_shop/", "item_search_shop"],
    ["/retail/item_search_peerbuy/", "retail/item_search_peerbuy"],
    ["/outlet/item_get/", "outlet/item_get"],
  ])("%s answers 4010 naming the operations that exist", async (path, named) => {
    const { status, json } = await legacyGet(gw.base, path, { key: gw.account.key, secret: gw.account.secret });
    expect(status).toBe(200);
    expect(json.error_code).toBe("4010");
    expect(json.reason).toContain(named);
    expect(json.reason).toContain("retail/item_get");
    expect(json.reason).toContain("wholesale/item_search_peerbuy");
    expect(json.reason).toContain("wholesale/item_get");
  });

  it.each(["/", "/favicon.ico", "/a/b/c/d"])("%s gets a status block too", async (path) => {
    const res = await fetch(`${gw.base}${path}`);
    const json = (await res.json()) as Record<string, unknown>;
    expect(json.error_code).toBe("4010");
  });

  it("an undecodable path gets 4003", async () => {
    const json = (await (await fetch(`${gw.base}/retail/%ZZ/`)).json()) as Record<string, unknown>;
    expect(json.error_code).toBe("4003");
  });

  it("ignored codes do not count against the day", async () => {
    const a = await gw.newAccount();
    for (const num_iid of ["x", "", "1".repeat(30)]) await legacyGet(gw.base, "/retail/item_get/", { key: a.key, secret: a.secret, num_iid });
    const { json } = await legacyGet(gw.base, "/retail/item_get/", { key: a.key, secret: a.secret, num_iid: "123" });
    expect(json.error_code).toBe("2000");
    expect(json.api_info).toMatch(/^today:1 /);
  });
});
