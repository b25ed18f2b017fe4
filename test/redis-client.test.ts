import { afterAll, describe, expect, it } from "vitest";
import { openRedis, redisCommandTimeoutMs } from "../src/stores/redis/redis-client.ts";

// The shared stores' Redis client: its command timeout is a timer on this process's own event loop.

const redis = await openRedis(process.env.GATEWAY_TEST_REDIS_URL ?? "redis://127.0.0.1:6379");
const key = `gw-test-redis-client:${process.pid}`;
afterAll(async () => {
  await redis.del(key);
  redis.disconnect();
});

describe("the Redis client", () => {
  it("takes a reply that came in time as an answer, though this process's event loop stalled past a second meanwhile", async () => {
    await redis.set(key, "answered", "PX", 60_000);
    const reply = redis.get(key).then((v) => v, (e: Error) => `failed: ${e.message}`);
    // Redis answers at once; this thread is busy for 1.2 s before it reads the reply.
    const until = Date.now() + 1200;
    while (Date.now() < until) {
      // a replica's event loop, stalled under a burst
    }
    expect(await reply).toBe("answered");
    expect(redisCommandTimeoutMs).toBeGreaterThan(1200);
  });
});
