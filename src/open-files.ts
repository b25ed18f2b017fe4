import { readFileSync } from "node:fs";

/**
 * The open-files limit (RLIMIT_NOFILE) and the connection cap it leaves
 * room for. Every connection is a file descriptor, and so is everything the
 * gateway opens for its own work: the store's files, its logs, its
 * connections to the provider, PostgreSQL and Redis. Past the limit the
 * system refuses them all alike: a client's connection is closed as it is
 * accepted (libuv accepts and closes it, and nothing is counted or logged),
 * and a connection to the provider or the database fails, its calls with
 * it. GATEWAY_MAX_CONNECTIONS (10,000 by default) above what the limit
 * holds is never reached: the system refuses first, and the gateway's own
 * work starves beside the clients.
 */

/**
 * The most files this process may hold open: the soft limit, which Node
 * raises to the hard one as it starts (so `ulimit -Hn`, LimitNOFILE= under
 * systemd or a container's `nofile` is what counts). Undefined where it
 * cannot be read (not Linux) or is unlimited.
 */
export function openFilesLimit(limits: () => string = () => readFileSync("/proc/self/limits", "utf8")): number | undefined {
  let text: string;
  try {
    text = limits();
  } catch {
    return undefined;
  }
  const soft = /^Max open files\s+(\S+)/m.exec(text)?.[1];
  const n = soft === undefined ? Number.NaN : Number(soft);
  return Number.isSafeInteger(n) && n > 0 ? n : undefined;
}

/** The files kept for the gateway's own work beside client connections: 256, or a quarter of a limit under 1,024. */
function ownFilesReserve(limit: number): number {
  return Math.min(256, Math.floor(limit / 4));
}

/** What the connection cap may be under `limit`: `maxConnections`, or what the limit leaves once the gateway's own files are kept. */
export function connectionCapUnder(maxConnections: number, limit: number | undefined): { readonly cap: number; readonly lowered: boolean; readonly reserve: number } {
  if (limit === undefined) return { cap: maxConnections, lowered: false, reserve: 0 };
  const reserve = ownFilesReserve(limit);
  const room = Math.max(1, limit - reserve);
  return maxConnections > room ? { cap: room, lowered: true, reserve } : { cap: maxConnections, lowered: false, reserve };
}

/** What `gateway serve` found of the open-files limit, and GATEWAY_MAX_CONNECTIONS as set when it lowered the cap to fit (none: not lowered). */
export interface OpenFilesFit {
  readonly limit: number | undefined;
  readonly maxConnectionsSet: number | undefined;
}
