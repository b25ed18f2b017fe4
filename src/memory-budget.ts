/**
 * One memory budget, GATEWAY_MEMORY_MB, and how it divides. The process's
 * RSS stays within the budget plus a fixed overhead: the code, Node's and
 * V8's own structures, the modules and SQLite's page cache, measured here at
 * about 150 MiB and the same whatever the traffic.
 *
 * - V8's young generation: three semi-spaces (`--max-semi-space-size`), each
 *   the power of two nearest below a thirty-second of the budget, from 8 to
 *   16 MiB (V8 rounds a semi-space up to a power of two). Not larger: every
 *   new object lands in the young generation, and a larger one spreads them
 *   over more memory than the CPU's caches hold. 32 MiB semi-spaces cost a
 *   legacy json hit about 2 µs of CPU more than 16 (median of 10 alternating
 *   runs 36.9 µs against 35.0, 16 better in 9 of 10) and a bare Fastify
 *   route 2-4 µs more than V8's own default (docs/performance-history.md).
 * - V8's old generation (`--max-old-space-size`): the rest of the budget.
 *   Everything long-lived is in it, the response cache first.
 * - The response cache: a quarter of the budget, unless
 *   GATEWAY_CACHE_MAX_BYTES says otherwise (at most half of the budget).
 *
 * - glibc's malloc: at most two arenas (MALLOC_ARENA_MAX, see servingEnv).
 *
 * - V8's allocation-site pretenuring: off (pretenuringFlag says why).
 *
 * `gateway serve` applies the heap limits, the pretenuring flag and the
 * arena cap by re-executing Node with them (process.execve: the same
 * process, pid and signals); see bin/gateway.js.
 * Imported by bin/gateway.js before anything else, so it imports only node:fs.
 */
import { readFileSync } from "node:fs";

export const defaultMemoryMb = 512;
export const minMemoryMb = 128;
/** What the process holds beyond the budget, measured at idle and under load (README, Configuration). */
export const fixedOverheadMb = 150;

export interface MemoryPlan {
  readonly memoryMb: number;
  readonly semiSpaceMb: number;
  readonly oldSpaceMb: number;
  /** The response cache's bound when GATEWAY_CACHE_MAX_BYTES does not set one. */
  readonly cacheMaxBytes: number;
  /** Bytes of HTTP/2 answers that may wait for clients that do not take them, all connections together (slow-readers.ts). */
  readonly waitingAnswerBytes: number;
}

export function memoryPlan(memoryMb: number): MemoryPlan {
  const semiSpaceMb = Math.min(16, Math.max(8, 2 ** Math.floor(Math.log2(memoryMb / 32))));
  return {
    memoryMb,
    semiSpaceMb,
    oldSpaceMb: memoryMb - 3 * semiSpaceMb,
    cacheMaxBytes: Math.floor(memoryMb / 4) * 1_048_576,
    waitingAnswerBytes: Math.floor(memoryMb / 8) * 1_048_576,
  };
}

/** The V8 flags of a plan. */
export function heapFlags(plan: MemoryPlan): string[] {
  return [`--max-old-space-size=${plan.oldSpaceMb}`, `--max-semi-space-size=${plan.semiSpaceMb}`];
}

/**
 * V8's allocation-site pretenuring, off. When the objects made at one place
 * in the code survive young-generation collections, V8 starts making that
 * place's objects directly in the old generation. A gateway whose start
 * happened to train a hot place of a call that way (it seeds and loads its
 * store while serving begins, and on a busy host collections are slow) goes
 * on making each call's short-lived objects in the old generation, and stays
 * there: young collections of 5-9 ms instead of 0.7, a full collection every
 * 200 ms, 49-78 µs of CPU a cached call instead of 36-39. Gateways
 * started two at a time on this 2-core machine ended that way in 10 of 50
 * starts; with this flag, in none of 32. One that starts well costs the
 * same either way (docs/performance-history.md).
 */
export const pretenuringFlag = "--no-allocation-site-pretenuring";

/** Whether the process was started with allocation-site pretenuring set either way (flags or NODE_OPTIONS): the operator's choice wins. */
export function hasPretenuringFlag(execArgv: readonly string[], nodeOptions: string | undefined): boolean {
  return givenFlag(execArgv, nodeOptions, /^--(no-)?allocation-site-pretenuring$/);
}

/**
 * Node's debugger, never opened by a signal. By default a SIGUSR1 makes
 * Node listen on 127.0.0.1:9229 with an inspector that asks for nothing:
 * whoever connects from this machine (another user, another container of
 * the pod, which shares its loopback) runs code inside the gateway, with its
 * admin token, database credentials and every account's secret hashes.
 * Other servers take SIGUSR1 for "reopen the logs" (nginx), so an operator
 * sends it in good faith. With this flag the signal does nothing. A
 * debugger is still had on purpose, with `--inspect` in NODE_OPTIONS.
 */
export const debugSignalFlag = "--disable-sigusr1";

/**
 * The flags `serve` adds to its own: the plan's heap limits and pretenuring
 * off, each unless the process was given its own, and no debugger on SIGUSR1.
 */
export function servingFlags(plan: MemoryPlan, execArgv: readonly string[], nodeOptions: string | undefined): string[] {
  return [
    ...(hasHeapFlags(execArgv, nodeOptions) ? [] : heapFlags(plan)),
    ...(hasPretenuringFlag(execArgv, nodeOptions) ? [] : [pretenuringFlag]),
    ...(givenFlag(execArgv, nodeOptions, /^--disable-sigusr1$/) ? [] : [debugSignalFlag]),
  ];
}

/**
 * glibc's malloc arenas a serving gateway may have. Without a cap, glibc
 * gives each thread that allocates (V8's platform workers, libuv's pool) an
 * arena of its own, up to eight a core, and each arena keeps what its thread
 * freed. Under the bench's load (legacy, Connect JSON and gRPC hits, 64
 * connections) two arenas took the gateway's peak RSS from 261 to 233 MiB,
 * with no CPU cost a call that stood out of the run-to-run noise.
 */
export const mallocArenaMax = "2";

/**
 * The environment `gateway serve` runs in: MALLOC_ARENA_MAX set to
 * `mallocArenaMax` unless the operator set it. glibc reads it once, when the
 * process starts, so it must be there before Node is (re-)executed; other C
 * libraries ignore it. Returns `env` itself when nothing needs to change.
 */
export function servingEnv(env: NodeJS.ProcessEnv): NodeJS.ProcessEnv {
  return env.MALLOC_ARENA_MAX === undefined || env.MALLOC_ARENA_MAX === "" ? { ...env, MALLOC_ARENA_MAX: mallocArenaMax } : env;
}

/** Whether the process was started with heap limits of its own (flags or NODE_OPTIONS): those win over the budget's. */
export function hasHeapFlags(execArgv: readonly string[], nodeOptions: string | undefined): boolean {
  return givenFlag(execArgv, nodeOptions, /^--max-(old|semi)-space-size(=|$)/);
}

/** Whether a V8 flag matching `pattern` (written with dashes) was given on the command line or in NODE_OPTIONS, where V8 takes `_` for `-`. */
function givenFlag(execArgv: readonly string[], nodeOptions: string | undefined, pattern: RegExp): boolean {
  return [...execArgv, ...(nodeOptions ?? "").split(/\s+/)].some((a) => pattern.test(a.replaceAll("_", "-")));
}

/**
 * The budget as bin/gateway.js reads it, before the configuration is, by the
 * configuration's own precedence: GATEWAY_MEMORY_MB, else `memoryMb` in the
 * JSON file GATEWAY_CONFIG names, else the default. Undefined when the value
 * is not a whole number in range or the file cannot be read: the
 * configuration then says what is wrong, and the start stops there.
 */
export function memoryMbOf(env: NodeJS.ProcessEnv): number | undefined {
  let raw: unknown = env.GATEWAY_MEMORY_MB;
  if ((raw === undefined || raw === "") && env.GATEWAY_CONFIG) {
    try {
      raw = (JSON.parse(readFileSync(env.GATEWAY_CONFIG, "utf8")) as { memoryMb?: unknown }).memoryMb;
    } catch {
      return undefined;
    }
  }
  if (raw === undefined || raw === "") return defaultMemoryMb;
  const n = typeof raw === "string" && /^[0-9]+$/.test(raw) ? Number(raw) : raw;
  return typeof n === "number" && Number.isInteger(n) && n >= minMemoryMb && n <= 1_048_576 ? n : undefined;
}
