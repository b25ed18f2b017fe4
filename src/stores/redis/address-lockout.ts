import type { Redis } from "ioredis";
import { defaultAddressLockoutOptions, holdMs, type AddressLockout, type AddressLockoutOptions } from "../../core/address-lockout.ts";
import { GatewayError } from "../../core/gateway-error.ts";
import { ErrorCode } from "../../gen/gateway/catalogue/v1/status_pb.js";

const unreachable = "the shared cache (Redis) cannot be reached, so calls are refused, and not charged, until it answers";

// One failure, in one step: drop what left the window, count this one, and lock the address when
// the count reaches the limit. Returns the count in the window (0 once locked).
const failScript = `
local window, lockAfter, lockMs, now = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
redis.call('zremrangebyscore', KEYS[1], '-inf', now - window)
redis.call('zadd', KEYS[1], now, ARGV[5])
redis.call('pexpire', KEYS[1], window)
local n = redis.call('zcard', KEYS[1])
if n >= lockAfter then
  redis.call('del', KEYS[1])
  if lockMs > 0 then redis.call('set', KEYS[2], '1', 'PX', lockMs) end
  return 0
end
return n`;

/**
 * The failed-authentication counts of every replica, in Redis: each address's
 * failures in a sorted set trimmed to the window, and its lock as a key that
 * expires. One script per failure, so replicas counting at once never lose one.
 */
export class RedisAddressLockout implements AddressLockout {
  private readonly redis: Redis;
  private readonly options: AddressLockoutOptions;
  private readonly prefix: string;
  private sequence = 0;

  constructor(redis: Redis, options: Partial<AddressLockoutOptions> = {}, prefix = "gateway:") {
    this.redis = redis;
    this.options = { ...defaultAddressLockoutOptions, ...options };
    this.prefix = prefix;
  }

  async check(clientIp: string, now: number): Promise<void> {
    let ms: number;
    try {
      ms = await this.redis.pttl(`${this.prefix}locked:${clientIp}`);
    } catch (e) {
      throw new GatewayError(ErrorCode.SERVER_INTERNAL_ERROR, unreachable, { cause: e });
    }
    if (ms > 0) throw new GatewayError(ErrorCode.RATE_LIMIT_EXCEEDED, `too many failed authentications from this address; try again in ${Math.ceil(ms / 1000)} s`);
    void now;
  }

  async failed(clientIp: string, now: number): Promise<number> {
    const o = this.options;
    const n = Number(
      await this.redis.eval(
        failScript, 2, `${this.prefix}failures:${clientIp}`, `${this.prefix}locked:${clientIp}`,
        o.failureWindowSeconds * 1000, o.lockAfterFailures, o.lockSeconds * 1000, now, `${now}-${process.pid}-${++this.sequence}`,
      ),
    );
    return holdMs(n, o);
  }
}
