// An account's key working only from the addresses it names (src/core/allowed-addresses.ts): the list, and the
// gateway behind a trusted proxy (so each call says which address it comes from) on every transport.
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { addressAllowed, parseAllowedAddresses } from "../src/core/allowed-addresses.ts";
import { AdminService } from "../src/gen/gateway/admin/v1/admin_pb.js";
import { RetailService } from "../src/gen/gateway/catalogue/v1/retail_pb.js";
import { StatusBlockSchema } from "../src/gen/gateway/catalogue/v1/status_pb.js";
import { runCli } from "./support/cli.ts";
import { adminToken, demo, startGateway, type GatewayFixture } from "./support/gateway-fixture.ts";

describe("a list of allowed addresses", () => {
  it("is read as addresses and networks of either family, each once, in one written form; any is anywhere", () => {
    expect(parseAllowedAddresses("203.0.113.7, 10.0.0.0/08 2001:db8::/32,::ffff:192.0.2.1,203.0.113.7")).toEqual(["203.0.113.7", "10.0.0.0/8", "2001:db8::/32", "192.0.2.1"]);
    expect(parseAllowedAddresses("any")).toBeUndefined();
    expect(parseAllowedAddresses([])).toBeUndefined();
    for (const bad of ["10.0.0.0/33", "2001:db8::/129", "example.com", "10.0.0.1/8/8", "10.0.0.0/x", "1.2.3"]) expect(() => parseAllowedAddresses(bad), bad).toThrow();
    expect(() => parseAllowedAddresses(Array.from({ length: 65 }, (_, i) => `10.0.0.${i}`))).toThrow("at most 64 addresses or networks, not 65");
  });

  it("allows what it names, an IPv4 caller written as IPv6 too, and nothing else", () => {
    const list = parseAllowedAddresses("10.0.0.0/8, 203.0.113.7, 2001:db8::/32")!;
    expect(["10.200.1.1", "::ffff:10.1.2.3", "203.0.113.7", "2001:db8::1"].map((ip) => addressAllowed(list, ip))).toEqual([true, true, true, true]);
    expect(["11.0.0.1", "203.0.113.8", "2001:db9::1", "", "not an address"].map((ip) => addressAllowed(list, ip))).toEqual([false, false, false, false, false]);
    expect(addressAllowed(undefined, "198.51.100.1")).toBe(true);
  });
});

describe("behind the app, each call from the address its proxy forwards", () => {
  let gw: GatewayFixture;
  beforeAll(async () => {
    // Two refusals lock an address out: a leaked key's user is stopped, not the team.
    gw = await startGateway({ config: { trustedProxies: "127.0.0.1", authLockAfter: 2, authSlowAfter: 100 } });
  });
  afterAll(() => gw.close());

  const legacy = async (a: { key: string; secret: string }, from: string) => {
    const res = await fetch(`${gw.base}/retail/item_get/?${new URLSearchParams({ key: a.key, secret: a.secret, num_iid: demo.retailNumIid })}`, { headers: { "x-forwarded-for": from } });
    const json = (await res.json()) as Record<string, unknown>;
    return `${String(json.error_code)} ${String(json.reason ?? "")}`.trim();
  };
  const rpc = (a: { key: string; secret: string }, from: string, grpc: boolean) =>
    createClient(RetailService, grpc ? createGrpcTransport({ baseUrl: gw.base }) : createConnectTransport({ baseUrl: gw.base, httpVersion: "1.1" }))
      .itemGet({ numIid: demo.retailNumIid }, { headers: { "x-api-key": a.key, "x-api-secret": a.secret, "x-forwarded-for": from } })
      .then(
        () => "0000",
        (e: unknown) => {
          const error = ConnectError.from(e);
          return `${error.code === Code.Unauthenticated ? "unauthenticated" : Code[error.code]} ${String(error.findDetails(StatusBlockSchema)[0]?.errorCode).padStart(4, "0")}`;
        },
      );

  it("answers a key from its own addresses and refuses it elsewhere with 4005 on every transport, counting the refusals against the caller's address", async () => {
    const a = await gw.newAccount({ allowedFrom: ["203.0.113.0/24", "2001:db8::/32"] });
    expect(await legacy(a, "203.0.113.9")).toBe("0000");
    expect(await rpc(a, "2001:db8::7", false)).toBe("0000");
    expect(await rpc(a, "203.0.113.200", true)).toBe("0000");
    expect(await legacy(a, "198.51.100.7")).toBe("4005 this key does not work from 198.51.100.7: its account allows calls only from the addresses it names");
    expect(await rpc(a, "198.51.100.7", true)).toBe("unauthenticated 4005");
    // That address has failed twice: locked out (4008) before its key is looked at, while the team goes on.
    expect(await rpc(a, "198.51.100.7", false)).toBe("ResourceExhausted 4008");
    expect(await legacy(a, "203.0.113.9")).toBe("0000");
    const rows = (await gw.runtime.meter.query({ account: a.key, rows: 10 })).rows;
    // The account's ledger has both refusals, not charged; the operator's metrics tell them from wrong secrets.
    expect(rows.filter((r) => r.code === 4005).map((r) => r.charge)).toEqual(["ignored", "ignored"]);
    const failures = (await gw.runtime.metrics.registry.getSingleMetric("gateway_auth_failures_total")!.get()) as { values: { labels: Record<string, string>; value: number }[] };
    expect(Object.fromEntries(failures.values.map((v) => [v.labels.reason, v.value]))).toMatchObject({ address_not_allowed: 2, address_locked: 1 });
    expect(failures.values.find((v) => v.labels.reason === "bad_credentials")).toBeUndefined();
  });

  it("is set, changed and removed with the plan (the AdminService, the CLI), recorded in the account's history", async () => {
    const admin = createClient(AdminService, createConnectTransport({ baseUrl: gw.base, httpVersion: "1.1" }));
    const ok = { headers: { authorization: `Bearer ${adminToken}` } };
    const created = await admin.createAccount({ name: "allowed", allowedFrom: { addresses: ["192.0.2.0/24"] } }, ok);
    const a = { key: created.account!.key, secret: created.secret };
    expect(created.account!.allowedFrom?.addresses).toEqual(["192.0.2.0/24"]);
    expect(await legacy(a, "192.0.2.1")).toBe("0000");
    const refused = await admin.setPlan({ key: a.key, allowedFrom: { addresses: ["192.0.2.0/99"] } }, ok).catch((e: unknown) => ConnectError.from(e));
    expect([(refused as ConnectError).code, (refused as ConnectError).rawMessage]).toEqual([Code.InvalidArgument, 'allowed addresses: "192.0.2.0/99": a network\'s prefix is 0 to 32']);
    // The CLI: another list, then anywhere.
    const env = { GATEWAY_DATA_DIR: gw.config.dataDir };
    const set = await runCli(["accounts", "set-plan", a.key, "--allow-from", "192.0.2.7,198.51.100.0/25"], env);
    expect(set.code).toBe(0);
    const listed = JSON.parse((await runCli(["accounts", "list", "--json", "--query", a.key], env)).stdout) as { allowedFrom: string }[];
    expect(listed[0]!.allowedFrom).toBe("192.0.2.7, 198.51.100.0/25");
    expect((await runCli(["accounts", "set-plan", a.key, "--allow-from", "10.0.0.0/40"], env)).stderr.trim()).toBe('allowed addresses: "10.0.0.0/40": a network\'s prefix is 0 to 32');
    // The running gateway rereads the account within a second.
    let seen = "";
    for (let i = 0; i < 30 && seen !== "4005"; i++) seen = (await legacy(a, "192.0.2.1")).slice(0, 4);
    expect(seen).toBe("4005");
    expect(await legacy(a, "198.51.100.100")).toBe("0000");
    await admin.setPlan({ key: a.key, allowedFrom: { addresses: [] } }, ok);
    expect((await admin.getAccount({ key: a.key }, ok)).account!.allowedFrom).toBeUndefined();
    expect(await legacy(a, "203.0.113.50")).toBe("0000");
    const plans = (await gw.runtime.admin.history(a.key)).filter((e) => e.kind === "plan").map((e) => e.changes);
    expect(plans).toEqual([
      [{ field: "allowedFrom", before: "192.0.2.0/24", after: "192.0.2.7, 198.51.100.0/25" }],
      [{ field: "allowedFrom", before: "192.0.2.7, 198.51.100.0/25", after: "" }],
    ]);
  });
});
