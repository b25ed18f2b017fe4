import type { Redis } from "ioredis";
import { lockedOut } from "../../core/limit-refusals.ts";
import { readWithin } from "../../core/clock.ts";
import { defaultAddressLockoutOptions, holdMs, lockEnd, MemoryAddressLockout, type AddressLockout, type AddressLockoutOptions } from "../../core/address-lockout.ts";
import { MapSweep } from "../../core/map-sweep.ts";
import type { MaybeAsync } from "../../core/maybe-async.ts";
import { RedisLink } from "./redis-link.ts";

// One failure, in one step: drop what left the window, count this one, and lock the address when
// the count reaches the limit, telling every replica on the channel (ARGV[6]). Returns the count
// in the window (0 once locked) and what is left of the address's lock in ms (-2 when there is none).
const failScript = `
local window, lockAfter, lockMs, now = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
redis.call('zremrangebyscore', KEYS[1], '-inf', now - window)
redis.call('zadd', KEYS[1], now, ARGV[5])
redis.call('pexpire', KEYS[1], window)
local n = redis.call('zcard', KEYS[1])
if n >= lockAfter then
  redis.call('del', KEYS[1])
  if lockMs > 0 then
    redis.call('set', KEYS[2], '1', 'PX', lockMs)
    redis.call('publish', ARGV[6], lockMs .. ' ' .. ARGV[7])
  end
  n = 0
end
return {n, redis.call('pttl', KEYS[2])}`;

export interface RedisAddressLockoutOptions extends AddressLockoutOptions {
  /**
   * How long an address found not locked is taken as such without asking
   * Redis again, while this replica listens for locks. A lock made anywhere
   * reaches every listening replica at once; this bounds the wait for one
   * whose message was lost.
   */
  readonly recheckMs: number;
  /** Addresses remembered as not locked; past this the memory starts again. */
  readonly rememberedAddresses: number;
}

/**
 * The failed-authentication counts of every replica, in Redis: each address's
 * failures in a sorted set trimmed to the window, and its lock as a key that
 * expires. One script per failure, so replicas counting at once never lose one.
 *
 * A call asks Redis about its address at most once per `recheckMs` (it had
 * been a round trip to Redis on every call): the script that locks an address
 * publishes the lock, and every replica listening keeps the locks it hears of
 * until they end. While this replica is not listening (its subscription is
 * down or not yet made), every call asks Redis, as before.
 *
 * Without Redis (RedisLink: down), the replica counts the failures it sees
 * itself, as an embedded gateway does, and keeps every lock it knew of: an
 * address is then held to the limit on each replica rather than on all of
 * them together, until Redis answers. What it counted alone keeps counting
 * for its own window after that.
 */
export class RedisAddressLockout implements AddressLockout {
  private readonly link: RedisLink;
  /** The failures this replica counted while Redis was down. */
  private readonly alone: MemoryAddressLockout;
  private readonly options: RedisAddressLockoutOptions;
  private readonly prefix: string;
  private readonly channel: string;
  private sequence = 0;
  /** Whether the link was made here (a client was given): then closing this closes it. */
  private readonly ownLink: boolean;
  private readonly unlisten: () => void;
  private listening = false;
  /** Addresses known to be locked, until when (ms). */
  private readonly locked = new Map<string, number>();
  private readonly lockSweep = new MapSweep(this.locked);
  /** Addresses found not locked, and when (ms). */
  private readonly clear = new Map<string, number>();

  constructor(redis: Redis | RedisLink, options: Partial<RedisAddressLockoutOptions> = {}, prefix = "gateway:") {
    this.ownLink = !(redis instanceof RedisLink);
    this.link = redis instanceof RedisLink ? redis : new RedisLink(redis);
    this.options = { ...defaultAddressLockoutOptions, recheckMs: 1000, rememberedAddresses: 100_000, ...options };
    this.alone = new MemoryAddressLockout(this.options);
    this.prefix = prefix;
    this.channel = `${prefix}locked`;
    this.unlisten = this.link.listen(this.channel, {
      message: (text) => {
        const space = text.indexOf(" ");
        this.remember(text.slice(space + 1), Number(text.slice(0, space)), Date.now());
      },
      listening: (on) => {
        // Either way, what was found while not listening may since have changed.
        this.clear.clear();
        this.listening = on;
      },
    });
  }

  /** Whether this replica hears of locks made elsewhere, and so may skip asking Redis. */
  get isListening(): boolean {
    return this.listening;
  }

  /**
   * At once (MaybeAsync) when this replica knows the address is locked, or, hearing of locks, saw it clear lately, or
   * Redis is down; else asks Redis.
   */
  check(clientIp: string, now: number): MaybeAsync<void> {
    const known = this.locked.get(clientIp);
    if (known !== undefined) {
      const until = lockEnd(known, now, this.options);
      if (until > now) {
        if (until !== known) this.locked.set(clientIp, until);
        throw lockedOut(until - now);
      }
      this.locked.delete(clientIp);
    }
    this.alone.check(clientIp, now);
    if (!this.link.up) return;
    if (this.listening) {
      const seen = this.clear.get(clientIp);
      if (seen !== undefined && readWithin(seen, now, this.options.recheckMs)) return;
    }
    return this.checkShared(clientIp, now);
  }

  private async checkShared(clientIp: string, now: number): Promise<void> {
    let ms: number;
    try {
      ms = await this.link.run((redis) => redis.pttl(`${this.prefix}locked:${clientIp}`));
    } catch {
      return; // Redis went down: this replica's own count decides (check, above)
    }
    if (ms > 0) {
      this.remember(clientIp, ms, now);
      throw lockedOut(ms);
    }
    if (this.clear.size >= this.options.rememberedAddresses) this.clear.clear();
    this.clear.set(clientIp, now);
  }

  /** Counted in Redis, for every replica; while Redis is down, by this replica alone. */
  async failed(clientIp: string, now: number): Promise<number> {
    const o = this.options;
    if (!this.link.up) return this.alone.failed(clientIp, now);
    let n: number;
    let lockMs: number;
    try {
      [n, lockMs] = (await this.link.run((redis) => redis.eval(
        failScript, 2, `${this.prefix}failures:${clientIp}`, `${this.prefix}locked:${clientIp}`,
        o.failureWindowSeconds * 1000, o.lockAfterFailures, o.lockSeconds * 1000, now, `${now}-${process.pid}-${++this.sequence}`, this.channel, clientIp,
      ))) as [number, number];
    } catch {
      return this.alone.failed(clientIp, now);
    }
    if (lockMs > 0) this.remember(clientIp, lockMs, now);
    return holdMs(n, o);
  }

  /** Stops listening for locks. */
  close(): void {
    this.unlisten();
    if (this.ownLink) this.link.close();
  }

  private remember(clientIp: string, ms: number, now: number): void {
    if (!(ms > 0)) return;
    this.clear.delete(clientIp);
    // Ended locks are forgotten a few at a time (before, a full map was looked at whole for each lock, to forget none).
    this.lockSweep.step((until) => until <= now);
    // Full: this lock is not kept here, and calls from the address ask Redis, which has it.
    if (this.locked.size >= this.options.rememberedAddresses && !this.locked.has(clientIp)) return;
    this.locked.set(clientIp, now + ms);
  }
}
