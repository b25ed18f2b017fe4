import { Redis } from "ioredis";

/**
 * A Redis client that fails fast: no offline queue (a command while the
 * connection is down fails at once instead of waiting), one attempt per
 * command, bounded waits; it reconnects by itself. Resolves once ready.
 *
 * The command timeout is ioredis's timer on this process's event loop, so
 * it also fires when this process, not Redis, was late: with 1 s, a loop
 * that stalled for 1.2 s saw a Redis that had answered in time as timed
 * out (test/redis-client.test.ts), and a replica would answer 4000 for it;
 * the likeliest cause of the stray 4000s in test/replicas.test.ts's
 * 200-call burst (two of seven full test runs here, one of them CI's).
 * 5 s is PostgreSQL's bound for a connection from the pool, the other store
 * a call waits for.
 */
export const redisCommandTimeoutMs = 5000;

export async function openRedis(url: string): Promise<Redis> {
  const redis = redisClient(url);
  await whenReady(redis).catch((e: unknown) => {
    redis.disconnect();
    throw e;
  });
  return redis;
}

/** The client `openRedis` opens, not waited for: it connects, and reconnects, by itself. */
export function redisClient(url: string): Redis {
  const redis = new Redis(url, { enableOfflineQueue: false, maxRetriesPerRequest: 1, connectTimeout: 2000, commandTimeout: redisCommandTimeoutMs });
  redis.on("error", () => {}); // each failed command says why; the client reconnects
  return redis;
}

/** Resolves once `redis` is ready; rejects after 5 s (it goes on connecting). */
export function whenReady(redis: Redis): Promise<void> {
  if (redis.status === "ready") return Promise.resolve();
  return new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => {
      redis.off("ready", ready);
      reject(new Error("Redis did not answer within 5 s"));
    }, 5000);
    const ready = () => {
      clearTimeout(timer);
      resolve();
    };
    redis.once("ready", ready);
  });
}

/**
 * One look at a Redis server, for `gateway check`: its version, or the
 * reason it cannot be reached (no retry, so a refused connection answers at
 * once rather than after the reconnecting client's wait).
 */
export async function probeRedis(url: string): Promise<{ readonly version: string }> {
  const redis = new Redis(url, { lazyConnect: true, enableOfflineQueue: false, maxRetriesPerRequest: 0, retryStrategy: () => null, connectTimeout: 2000, commandTimeout: redisCommandTimeoutMs });
  // The connection's own error (ECONNREFUSED…) says why; the connect's rejection only that it closed.
  let cause: unknown;
  redis.on("error", (e: unknown) => (cause ??= e));
  try {
    await redis.connect().catch((e: unknown) => {
      throw cause ?? e;
    });
    const info = await redis.info("server");
    return { version: /redis_version:(\S+)/.exec(info)?.[1] ?? "unknown" };
  } finally {
    redis.disconnect();
  }
}
