import { BlockList, isIP } from "node:net";
import { ErrorCode } from "../gen/gateway/catalogue/v1/status_pb.js";
import { GatewayError } from "./gateway-error.ts";

/**
 * The addresses an account's key works from: single addresses and networks
 * (`203.0.113.7`, `10.0.0.0/8`, `2001:db8::/32`), IPv4 or IPv6. A call from
 * anywhere else is refused 4005 even with the right secret, so a key that
 * leaks is no use (and bills nothing) outside the team's own addresses.
 * Undefined on an account: anywhere.
 */

/** The most entries one account may list. */
export const maxAllowedAddresses = 64;

/** 4005 for a key used from an address its account does not list (told apart in the operator's metrics). */
export class AddressNotAllowed extends GatewayError {
  constructor(clientIp: string) {
    super(ErrorCode.INVALID_CREDENTIALS, `this key does not work from ${clientIp}: its account allows calls only from the addresses it names`);
  }
}

/** A list that cannot be used, in words. */
export class AllowedAddressesError extends Error {
  override name = "AllowedAddressesError";
}

/** An IPv4 address written as IPv6 (`::ffff:10.1.2.3`, as a dual-stack socket reports one) as the IPv4 it is. */
export function plainAddress(ip: string): string {
  return ip.startsWith("::ffff:") && isIP(ip.slice(7)) === 4 ? ip.slice(7) : ip;
}

/** One entry in its written form (`10.0.0.0/8`, `2001:db8::/32`, `203.0.113.7`), or thrown why not. */
function entry(text: string): string {
  const [address = "", prefix, extra] = text.trim().split("/");
  const ip = plainAddress(address);
  const family = isIP(ip);
  if (family === 0 || extra !== undefined) throw new AllowedAddressesError(`${JSON.stringify(text.trim())} is not an address or a network (203.0.113.7, 10.0.0.0/8, 2001:db8::/32)`);
  if (prefix === undefined) return ip;
  const bits = family === 4 ? 32 : 128;
  if (!/^[0-9]{1,3}$/.test(prefix) || Number(prefix) > bits) throw new AllowedAddressesError(`${JSON.stringify(text.trim())}: a network's prefix is 0 to ${bits}`);
  return `${ip}/${Number(prefix)}`;
}

/**
 * What a usage query is narrowed to: one address or network, in its written
 * form, or thrown why not.
 */
export function usageAddressFilter(text: string): string {
  return entry(text);
}

/** Of the addresses the ledger holds, those in a filter's address or network (`usageAddressFilter`'s form). */
export function addressesIn(filter: string, addresses: Iterable<string>): string[] {
  const list = [filter];
  return [...addresses].filter((ip) => ip !== "" && addressAllowed(list, ip));
}

/**
 * A list as text or as entries, each of which may itself hold several
 * (comma or space separated), checked and written in one form, each once,
 * in its order; `any` (or nothing) is undefined: anywhere.
 */
export function parseAllowedAddresses(list: string | readonly string[]): string[] | undefined {
  const items = (typeof list === "string" ? [list] : list).flatMap((s) => s.split(/[\s,]+/)).filter((s) => s !== "");
  if (items.length === 0 || (items.length === 1 && items[0] === "any")) return undefined;
  const entries = [...new Set(items.map(entry))];
  if (entries.length > maxAllowedAddresses) throw new AllowedAddressesError(`at most ${maxAllowedAddresses} addresses or networks, not ${entries.length}`);
  return entries;
}

/** A list as the CLI and the history write it: its entries, or `any`. */
export function formatAllowedAddresses(list: readonly string[] | undefined): string {
  return list === undefined ? "any" : list.join(", ");
}

// Accounts are records read from their store (and reread when changed), so a list is matched through one
// BlockList made the first time that very list is asked about.
const compiled = new WeakMap<readonly string[], BlockList>();

function blockList(list: readonly string[]): BlockList {
  let rules = compiled.get(list);
  if (rules === undefined) {
    rules = new BlockList();
    for (const e of list) {
      const [ip, prefix] = e.split("/") as [string, string | undefined];
      const type = isIP(ip) === 6 ? "ipv6" : "ipv4";
      if (prefix === undefined) rules.addAddress(ip, type);
      else rules.addSubnet(ip, Number(prefix), type);
    }
    compiled.set(list, rules);
  }
  return rules;
}

/** Whether a caller's address is one the list allows (an undefined list allows every one). */
export function addressAllowed(list: readonly string[] | undefined, clientIp: string): boolean {
  if (list === undefined) return true;
  const ip = plainAddress(clientIp);
  const family = isIP(ip);
  if (family === 0) return false;
  return blockList(list).check(ip, family === 6 ? "ipv6" : "ipv4");
}
