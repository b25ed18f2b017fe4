import { ReplyError, type Redis } from "ioredis";
import { redisCommandTimeoutMs } from "./redis-client.ts";

/** What a channel's listener is told (RedisLink.listen). */
export interface ChannelListener {
  /** A message published on the channel. */
  message(text: string): void;
  /**
   * Whether messages are heard: true once subscribed (and again after each
   * reconnection), false when the subscription's connection closes or the
   * subscription fails. While false, messages are missed, so what a listener
   * keeps from them must be asked of Redis instead.
   */
  listening(on: boolean): void;
}

export interface RedisLinkOptions {
  /** While Redis is down, it is pinged this often (one ping at a time) to see whether it answers again. */
  readonly retryMs: number;
  /** Told when Redis stops answering (with why) and when it answers again. */
  readonly onChange?: (up: boolean, reason: string) => void;
}

/**
 * What the replica knows of its Redis, shared by everything that asks it
 * (the response cache, the failed-authentication counts, readiness).
 *
 * Redis holds nothing that bills (the ledger, limits and accounts are in
 * PostgreSQL), so a Redis that fails is worked around, not waited for: once
 * a command failed (on a closed connection at once, on a frozen server
 * after the command timeout), Redis is taken as down and its users go on
 * without it, asking it nothing, until a ping answers. The link pings it
 * every `retryMs`, and at once when the client's connection is ready again.
 * So a Redis that stops answering costs the calls in flight at that moment
 * the command timeout, and no call after them.
 */
export class RedisLink {
  readonly redis: Redis;
  private readonly options: RedisLinkOptions;
  private isUp = true;
  private why = "";
  private pinging = false;
  private timer: NodeJS.Timeout | undefined;
  private closed = false;
  /** The connection's last error (refused, a wrong password…), to say why while it is not connected. */
  private lastError = "";
  /** The one connection every channel of this link is heard on, opened by the first `listen`. */
  private subscriber: Redis | undefined;
  private readonly channels = new Map<string, ChannelListener>();

  constructor(redis: Redis, options: Partial<RedisLinkOptions> = {}) {
    this.redis = redis;
    this.options = { retryMs: 1000, ...options };
    redis.on("error", (e: unknown) => (this.lastError = e instanceof Error ? e.message : String(e)));
    redis.on("ready", () => {
      this.lastError = "";
      if (!this.isUp) this.ping();
    });
  }

  /** Whether Redis answered the last command sent to it: while false, its users do not ask it. */
  get up(): boolean {
    return this.isUp;
  }

  /** Why the last command failed, while down. */
  get reason(): string {
    return this.why;
  }

  /** Runs `command` and learns from its outcome; rejects with the command's own error. */
  async run<T>(command: (redis: Redis) => Promise<T>): Promise<T> {
    try {
      const result = await command(this.redis);
      this.answered();
      return result;
    } catch (e) {
      // An error Redis answered (out of memory, a wrong type) is its answer: it is up.
      if (e instanceof ReplyError) this.answered();
      else this.failed(e);
      throw e;
    }
  }

  /** A command answered: Redis is up. */
  answered(): void {
    if (this.isUp) return;
    this.isUp = true;
    this.why = "";
    clearTimeout(this.timer);
    this.options.onChange?.(true, "");
  }

  /** A command failed: Redis is down until a ping answers. */
  failed(e: unknown): void {
    this.why = this.describe(e);
    if (!this.isUp) return;
    this.isUp = false;
    this.options.onChange?.(false, this.why);
    this.later();
  }

  /**
   * Hears `channel` on the link's one subscribing connection (a subscribed
   * connection takes no other command, so it is not the link's own). It
   * reconnects by itself, and each listener is told when it hears and when
   * it stops (ChannelListener.listening). Returns the way to stop.
   */
  listen(channel: string, listener: ChannelListener): () => void {
    this.channels.set(channel, listener);
    const subscriber = (this.subscriber ??= this.openSubscriber());
    if (subscriber.status === "ready") this.subscribe(subscriber, [channel]);
    return () => {
      if (this.channels.get(channel) !== listener) return;
      this.channels.delete(channel);
      listener.listening(false);
      if (subscriber.status === "ready") subscriber.unsubscribe(channel).catch(() => {});
    };
  }

  /** Stops pinging, and closes the subscribing connection. */
  close(): void {
    this.closed = true;
    clearTimeout(this.timer);
    this.subscriber?.disconnect();
  }

  private openSubscriber(): Redis {
    const subscriber = this.redis.duplicate();
    subscriber.on("error", () => {}); // it reconnects by itself; until then its listeners are told they do not hear
    subscriber.on("message", (channel: string, text: string) => this.channels.get(channel)?.message(text));
    subscriber.on("close", () => {
      for (const listener of this.channels.values()) listener.listening(false);
    });
    subscriber.on("ready", () => this.subscribe(subscriber, [...this.channels.keys()]));
    return subscriber;
  }

  private subscribe(subscriber: Redis, channels: readonly string[]): void {
    if (channels.length === 0) return;
    const tell = (on: boolean) => {
      for (const channel of channels) this.channels.get(channel)?.listening(on);
    };
    subscriber.subscribe(...channels).then(
      () => tell(true),
      () => tell(false),
    );
  }

  private later(): void {
    if (this.closed) return;
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.ping(), this.options.retryMs);
    this.timer.unref();
  }

  /** One ping at a time; a failed one tries again `retryMs` later. */
  private ping(): void {
    if (this.pinging || this.closed) return;
    this.pinging = true;
    this.redis.ping().then(
      () => {
        this.pinging = false;
        this.answered();
      },
      (e: unknown) => {
        this.pinging = false;
        this.why = this.describe(e);
        if (!this.isUp) this.later();
      },
    );
  }

  /** Why a command failed, in an operator's words rather than the client library's. */
  private describe(e: unknown): string {
    const message = e instanceof Error ? e.message : String(e);
    if (/command timed out/i.test(message)) return `no answer within ${redisCommandTimeoutMs} ms`;
    if (this.redis.status !== "ready") return `not connected (${this.redis.status}${this.lastError === "" ? "" : `: ${this.lastError}`})`;
    return message;
  }
}
