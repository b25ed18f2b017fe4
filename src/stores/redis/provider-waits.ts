import type { ProviderWaits } from "../../core/provider-waits.ts";
import { RedisLink } from "./redis-link.ts";

// A wait told: kept as a key that expires when the wait is over (a longer wait already kept stands), and published
// to every replica listening. KEYS[1] the catalogue's wait; ARGV: the wait (ms), the channel, the message.
const tellScript = `
local left = redis.call('pttl', KEYS[1])
if left >= tonumber(ARGV[1]) then return left end
redis.call('set', KEYS[1], '1', 'PX', ARGV[1])
redis.call('publish', ARGV[2], ARGV[3])
return left`;

/**
 * The providers' waits in Redis (ProviderWaits): each as a key that expires
 * with it, for a replica that starts (or hears again) during the wait, and a
 * message on one channel, heard by every replica within about a millisecond.
 *
 * Without Redis, each replica waits for what it was told itself, as one
 * gateway alone does: a wait told while Redis is away reaches the others
 * only by their own requests; a wait told before is read again when the
 * link hears again.
 */
export class RedisProviderWaits implements ProviderWaits {
  private readonly link: RedisLink;
  private readonly prefix: string;
  private readonly channel: string;
  /** Tells apart this replica's own messages, which it does not hold to again. */
  private readonly origin = `${process.pid}-${Math.random().toString(36).slice(2)}`;
  private readonly holds = new Map<string, (ms: number) => void>();
  private readonly unlisten: () => void;

  constructor(link: RedisLink, prefix = "gateway:") {
    this.link = link;
    this.prefix = prefix;
    this.channel = `${prefix}provider-wait`;
    this.unlisten = link.listen(this.channel, {
      message: (text) => {
        const [catalogue, ms, origin] = text.split(" ");
        if (origin !== this.origin) this.holds.get(catalogue ?? "")?.(Number(ms));
      },
      // Heard again (or at last): a wait told meanwhile is in its key.
      listening: (on) => {
        if (on) for (const catalogue of this.holds.keys()) this.readKept(catalogue);
      },
    });
  }

  tell(catalogue: string, ms: number): void {
    if (!this.link.up || !(ms > 0)) return;
    const wait = String(Math.ceil(ms));
    this.link.run((redis) => redis.eval(tellScript, 1, this.key(catalogue), wait, this.channel, `${catalogue} ${wait} ${this.origin}`)).catch(() => {});
  }

  listen(catalogue: string, hold: (ms: number) => void): void {
    this.holds.set(catalogue, hold);
    this.readKept(catalogue);
  }

  close(): void {
    this.unlisten();
  }

  private key(catalogue: string): string {
    return `${this.prefix}provider-wait:${catalogue}`;
  }

  /** What is left of a wait told before this replica heard of it. */
  private readKept(catalogue: string): void {
    if (!this.link.up) return;
    this.link.run((redis) => redis.pttl(this.key(catalogue))).then(
      (ms) => {
        if (ms > 0) this.holds.get(catalogue)?.(ms);
      },
      () => {},
    );
  }
}
