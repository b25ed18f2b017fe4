import proxyAddr from "proxy-addr";
import type { IncomingHttpHeaders } from "node:http";
import { isIP } from "node:net";

declare module "fastify" {
  interface FastifyRequest {
    /** The caller's address: the peer's, or, behind a trusted proxy, the one it forwarded. */
    readonly clientIp: string;
  }
}

/** The caller's address as the gateway sees it, from the peer address and its headers. */
export type ClientAddress = (peer: string, headers: IncomingHttpHeaders) => string;

/** The `for=` addresses of a `Forwarded` header (RFC 7239), leftmost first; ports, brackets and quotes removed. */
function forwardedFor(value: string): string[] {
  const out: string[] = [];
  for (const element of value.split(",")) {
    for (const pair of element.split(";")) {
      const eq = pair.indexOf("=");
      if (eq < 0 || pair.slice(0, eq).trim().toLowerCase() !== "for") continue;
      let node = pair.slice(eq + 1).trim();
      if (node.startsWith('"') && node.endsWith('"')) node = node.slice(1, -1);
      if (node.startsWith("[")) node = node.slice(1, node.indexOf("]") > 0 ? node.indexOf("]") : undefined);
      else if (/^[0-9.]+:\d+$/.test(node)) node = node.slice(0, node.lastIndexOf(":"));
      out.push(node);
    }
  }
  return out;
}

function header(headers: IncomingHttpHeaders, name: string): string | undefined {
  const v = headers[name];
  return Array.isArray(v) ? v.join(",") : v;
}

/**
 * How the client address is found. With no trusted proxies (the default) it
 * is the peer's address and headers change nothing. With some, a request
 * whose peer is trusted is followed back through `Forwarded` (or, without it,
 * `X-Forwarded-For`) hop by hop from the right, and the first address that is
 * not a trusted proxy is the client; a hop that is not an address stops the
 * walk at the last one that was. Trusted entries are addresses or CIDRs,
 * IPv4 or IPv6.
 */
export function clientAddressResolver(trusted: readonly string[]): ClientAddress {
  if (trusted.length === 0) return (peer) => peer;
  const isTrusted = proxyAddr.compile([...trusted]);
  return (peer, headers) => {
    if (!isTrusted(peer, 0)) return peer;
    const forwarded = header(headers, "forwarded");
    const xff = header(headers, "x-forwarded-for");
    const hops = forwarded !== undefined ? forwardedFor(forwarded) : xff !== undefined ? xff.split(",").map((h) => h.trim()) : [];
    let client = peer;
    for (let i = hops.length - 1, depth = 1; i >= 0; i--, depth++) {
      const hop = hops[i]!;
      if (isIP(hop) === 0) break;
      client = hop;
      if (!isTrusted(hop, depth)) break;
    }
    return client;
  };
}

/** Whether an address (a connection's peer) is one of the trusted proxies. */
export function trustedProxyTest(trusted: readonly string[]): (address: string) => boolean {
  if (trusted.length === 0) return () => false;
  const isTrusted = proxyAddr.compile([...trusted]);
  return (address) => address !== "" && isTrusted(address, 0);
}

/** Checks a list of trusted proxies; returns what is wrong with it, or undefined. */
export function trustedProxiesProblem(trusted: readonly string[]): string | undefined {
  try {
    proxyAddr.compile([...trusted]);
    return undefined;
  } catch (e) {
    return (e as Error).message;
  }
}
