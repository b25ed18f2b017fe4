import { Redis } from "ioredis";

/**
 * A Redis client that fails fast: no offline queue (a command while the
 * connection is down fails at once instead of waiting), one attempt per
 * command, short timeouts; it reconnects by itself. Resolves once ready.
 */
export async function openRedis(url: string): Promise<Redis> {
  const redis = new Redis(url, { enableOfflineQueue: false, maxRetriesPerRequest: 1, connectTimeout: 2000, commandTimeout: 1000 });
  redis.on("error", () => {}); // each failed command says why; the client reconnects
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("Redis did not answer within 5 s")), 5000);
    redis.once("ready", () => {
      clearTimeout(timer);
      resolve();
    });
  }).catch((e: unknown) => {
    redis.disconnect();
    throw e;
  });
  return redis;
}
