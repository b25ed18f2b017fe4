import { create, mergeFromBinary, toBinary } from "@bufbuild/protobuf";
import type { Redis } from "ioredis";
import { LRUCache } from "lru-cache";
import { randomBytes } from "node:crypto";
import { GatewayError } from "../../core/gateway-error.ts";
import type { MaybeAsync } from "../../core/maybe-async.ts";
import { zeroMessage } from "../../core/message-shape.ts";
import type { Operation } from "../../core/operation.ts";
import { EntryMemo, entryBytes, weight, type CacheEntry, type ResponseCache } from "../../core/response-cache.ts";
import { ErrorCode } from "../../gen/gateway/catalogue/v1/status_pb.js";
import { operationById } from "../../operations/index.ts";
import { reweighOnGrowth } from "../reweigh.ts";
import { RedisLink } from "./redis-link.ts";

export interface RedisResponseCacheOptions {
  /** Put before every key, so several gateways (or test files) can share one Redis. */
  readonly prefix: string;
  /** How long this replica answers from its own memory before asking Redis again: a refresh elsewhere is seen within this. */
  readonly localMs: number;
  /** Bytes the in-process tier may hold. */
  readonly localMaxBytes: number;
  readonly now: () => number;
}

export const defaultRedisResponseCacheOptions: RedisResponseCacheOptions = {
  prefix: "gateway:",
  localMs: 1000,
  localMaxBytes: 16 * 1_048_576,
  now: Date.now,
};

const unreachable = "the shared cache (Redis) cannot be reached, and this answer is neither held by this replica nor read from the gateway's own catalogue: a paid provider's item is bought only through the shared cache, so that no two replicas buy it; refused, not charged, until Redis answers";

// Deletes a claim only while it is still this holder's: a claim that expired and was taken by
// another replica is left alone.
const releaseScript = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";

interface Head {
  /** The answer is a stored "no result" (2000). */
  readonly n: boolean;
  readonly r: string;
  readonly s: number;
  readonly t: string;
  readonly f: number;
  readonly x: number;
  readonly b: number;
  readonly tr: CacheEntry["translation"] | null;
}

/**
 * The response cache shared by replicas: entries in Redis, kept until their
 * stale bound, in front of them a small in-process tier that answers a hot
 * item for up to `localMs` without a round trip (and keeps the entry's
 * renderings). An entry travels as its operation's response message in
 * protobuf binary, so every replica decodes exactly what was stored. Claims
 * (SET NX PX) let one replica buy an item while the others wait for it.
 *
 * Without Redis (RedisLink: down), a replica goes on with what it holds: a
 * read is answered from the in-process tier, however old its copy, as long
 * as the entry itself is fresh (or may stand in for a failing source), and
 * is otherwise a miss, which the gateway's own catalogue answers. What it
 * stores stays in its own memory. Only a claim, which a paid provider's item
 * needs before it is bought, is refused (4000, naming Redis).
 */
export class RedisResponseCache implements ResponseCache {
  private readonly link: RedisLink;
  private readonly options: RedisResponseCacheOptions;
  private readonly local: LRUCache<string, CacheEntry>;

  constructor(redis: Redis | RedisLink, options: Partial<RedisResponseCacheOptions> = {}) {
    this.link = redis instanceof RedisLink ? redis : new RedisLink(redis);
    this.options = { ...defaultRedisResponseCacheOptions, ...options };
    // Past its time a copy is not served while Redis answers, but kept (within the tier's bytes) in case Redis stops.
    this.local = new LRUCache({ maxSize: this.options.localMaxBytes, sizeCalculation: weight, ttl: this.options.localMs, ttlAutopurge: false, noDeleteOnStaleGet: true });
  }

  get bytes(): number {
    return this.local.calculatedSize;
  }

  /** A fresh entry of the in-process tier at once (MaybeAsync), anything else from Redis; without Redis, this replica's own copy, at once. */
  get(key: string): MaybeAsync<CacheEntry | undefined> {
    const now = this.options.now();
    const near = this.local.get(key);
    if (near !== undefined && near.freshUntil > now) return near;
    if (!this.link.up) return this.ownCopy(key, now);
    return this.shared(key, now);
  }

  /** What this replica holds of `key` past its tier's time, while it may still be served or stand in. */
  private ownCopy(key: string, now: number): CacheEntry | undefined {
    const entry = this.local.get(key, { allowStale: true });
    return entry !== undefined && entry.staleUntil > now ? entry : undefined;
  }

  private async shared(key: string, now: number): Promise<CacheEntry | undefined> {
    let stored: Buffer | null;
    try {
      stored = await this.link.run((redis) => redis.getBuffer(this.options.prefix + key));
    } catch {
      return this.ownCopy(key, this.options.now());
    }
    const entry = stored === null ? undefined : decode(key, stored);
    if (entry === undefined || entry.staleUntil <= now) {
      this.local.delete(key); // gone for every replica (expired, purged): not kept for an outage either
      return undefined;
    }
    this.keepLocal(key, entry);
    return entry;
  }

  /** In the in-process tier, re-weighed as renderings are memoised for it. */
  private keepLocal(key: string, entry: CacheEntry): void {
    reweighOnGrowth(this.local, key, entry);
    this.local.set(key, entry);
  }

  set(key: string, entry: CacheEntry): void {
    this.keepLocal(key, entry);
    const ms = entry.staleUntil - this.options.now();
    const bytes = encode(key, entry);
    if (ms <= 0 || bytes === undefined || !this.link.up) return;
    // Written behind the answer: a replica that misses it fetches the item again, nothing worse.
    this.link.run((redis) => redis.set(this.options.prefix + key, bytes, "PX", Math.ceil(ms))).catch(() => {});
  }

  /** Every replica's entries under `prefix` in Redis (SCAN, then UNLINK), and this replica's own copies. */
  async purge(prefix: string): Promise<number> {
    for (const k of [...this.local.keys()]) if (k.startsWith(prefix)) this.local.delete(k);
    const pattern = `${globEscaped(this.options.prefix + prefix)}*`;
    let dropped = 0;
    let cursor = "0";
    try {
      do {
        const [next, keys] = await this.link.run((redis) => redis.scan(cursor, "MATCH", pattern, "COUNT", 1000));
        cursor = next;
        if (keys.length > 0) dropped += await this.link.run((redis) => redis.unlink(...keys));
      } while (cursor !== "0");
    } catch (e) {
      throw new GatewayError(ErrorCode.SERVER_INTERNAL_ERROR, "the shared cache (Redis) cannot be reached, so the purge may not have reached every replica's entries; purge again once it answers", { cause: e });
    }
    return dropped;
  }

  async claim(key: string, ms: number): Promise<(() => Promise<void>) | "held"> {
    const claimKey = `${this.options.prefix}claim:${key}`;
    const token = randomBytes(12).toString("base64url");
    let taken: string | null;
    try {
      if (!this.link.up) throw new Error(this.link.reason);
      taken = await this.link.run((redis) => redis.set(claimKey, token, "PX", ms, "NX"));
    } catch (e) {
      throw new GatewayError(ErrorCode.SERVER_INTERNAL_ERROR, unreachable, { cause: e });
    }
    if (taken !== "OK") return "held";
    return async () => {
      await this.link.run((redis) => redis.eval(releaseScript, 1, claimKey, token));
    };
  }
}

/** Text that Redis's MATCH takes as itself: its glob's special characters escaped. */
function globEscaped(text: string): string {
  return text.replace(/[*?[\]\\]/g, (c) => `\\${c}`);
}

function encode(key: string, entry: CacheEntry): Buffer | undefined {
  const operation = operationById.get(key.slice(0, key.indexOf("\u0000")));
  if (operation === undefined) return undefined;
  const head: Head = { n: entry.value === null, r: entry.reason, s: entry.storedAt, t: entry.token, f: entry.freshUntil, x: entry.staleUntil, b: entry.bytes, tr: entry.translation ?? null };
  const body = entry.value === null ? new Uint8Array() : toBinary(operation.method.output, create(operation.method.output, { item: entry.value } as never));
  const h = Buffer.from(JSON.stringify(head), "utf8");
  const out = Buffer.alloc(4 + h.length + body.length);
  out.writeUInt32BE(h.length, 0);
  h.copy(out, 4);
  out.set(body, 4 + h.length);
  return out;
}

/** The `item` of an answer as `encode` wrote it; a single record decoded into a message in fast mode, as a store's read makes it (message-shape.ts). */
function decodeItem(operation: Operation, body: Uint8Array): unknown {
  const output = operation.method.output;
  const answer = zeroMessage(output) as unknown as { item: unknown };
  if (!operation.item.list) answer.item = zeroMessage(operation.item.message);
  return (mergeFromBinary(output, answer as never, body) as unknown as { item: unknown }).item;
}

function decode(key: string, bytes: Buffer): CacheEntry | undefined {
  const operation = operationById.get(key.slice(0, key.indexOf("\u0000")));
  if (operation === undefined || bytes.length < 4) return undefined;
  try {
    const length = bytes.readUInt32BE(0);
    const head = JSON.parse(bytes.subarray(4, 4 + length).toString("utf8")) as Head;
    const value = head.n ? null : decodeItem(operation, bytes.subarray(4 + length));
    return {
      value,
      reason: head.r,
      storedAt: head.s,
      token: head.t,
      freshUntil: head.f,
      staleUntil: head.x,
      bytes: entryBytes(value, head.r), // measured here: what this replica's copy holds
      ...(head.tr !== null ? { translation: head.tr } : {}),
      memo: new EntryMemo(),
    };
  } catch {
    return undefined; // an entry this version cannot read is a miss
  }
}
