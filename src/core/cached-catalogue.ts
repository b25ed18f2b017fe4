import { createHash } from "node:crypto";
import type { OperationId } from "../contract/operations.ts";
import { LateAnswer, type CatalogueSource, type Found, type NotFound, type SentRequests } from "./catalogue-source.ts";
import type { Args, Operation } from "./operation.ts";
import { Doorkeeper } from "./doorkeeper.ts";
import { ErrorCode } from "../gen/gateway/catalogue/v1/status_pb.js";
import { GatewayError } from "./gateway-error.ts";
import { EntryMemo, entryBytes, type CacheEntry, type ResponseCache } from "./response-cache.ts";
import { thenMaybe, type MaybeAsync } from "./maybe-async.ts";
import { noTelemetry, type Telemetry } from "./telemetry.ts";
import type { TargetLanguage, TranslationReport, Translator } from "./translation.ts";
import type { TraceContext } from "./trace-context.ts";
import { within } from "./within.ts";

export interface CachePolicy {
  /** How long a found answer is fresh, per operation, in seconds, where it is not the operation's own `ttlSeconds`. */
  readonly ttlSeconds: ReadonlyMap<OperationId, number>;
  /** How long a stored "no result" (2000) is fresh. */
  readonly notFoundTtlSeconds: number;
  /** How long past its freshness an answer may stand in for a failing source. */
  readonly staleIfErrorSeconds: number;
  /** With a cache shared by replicas: how long one replica may hold the right to fetch a key before the others fetch it too. */
  readonly claimMs: number;
}

export const defaultCachePolicy: CachePolicy = {
  ttlSeconds: new Map(),
  notFoundTtlSeconds: 60,
  staleIfErrorSeconds: 86_400,
  claimMs: 10_000,
};

/** What the core learns from asking for an answer. */
export interface Answered {
  readonly answer: Found | NotFound;
  /** Served from the cache (fresh, or stale in place of a failing source). */
  readonly fromCache: boolean;
  /** The entry's memo for renderers, when the answer is a stored one. */
  readonly memo: EntryMemo | undefined;
  /** For a call in another language than the source's: how the translation went. */
  readonly translation?: TranslationReport | undefined;
}

/**
 * The catalogue sources behind the response cache. Only real answers are
 * stored (0000, and 2000 for a shorter time), never faults; a local
 * source's answer from the second time its key is asked for. Simultaneous
 * misses for one key make one source call and share its answer. When the
 * source fails and an expired answer younger than the stale bound exists,
 * that answer is served instead of the fault. A purchase whose answer comes
 * after its caller's time (LateAnswer) is kept when it comes, and calls for
 * its key wait on it meanwhile: an item the provider was asked for is not
 * bought again because it answered late.
 */
export class CachedCatalogue {
  private readonly sources: ReadonlyMap<string, CatalogueSource>;
  private readonly cache: ResponseCache | undefined;
  private readonly policy: CachePolicy;
  private readonly now: () => number;
  private readonly inFlight = new Map<string, Promise<Fetched>>();
  /** Purchases past their caller's time whose answers are still awaited (LateAnswer), by key. */
  private readonly landings = new Map<string, Landing>();
  private readonly doorkeeper = new Doorkeeper();
  private readonly translator: Translator | undefined;
  private readonly telemetry: Telemetry;

  constructor(
    sources: ReadonlyMap<string, CatalogueSource>,
    cache: ResponseCache | undefined,
    policy: CachePolicy = defaultCachePolicy,
    now: () => number = Date.now,
    translator?: Translator,
    telemetry: Telemetry = noTelemetry,
  ) {
    this.telemetry = telemetry;
    this.sources = sources;
    this.cache = cache;
    this.policy = policy;
    this.now = now;
    this.translator = translator;
  }

  source(operation: Operation): CatalogueSource | undefined {
    return this.sources.get(operation.catalogue);
  }

  /**
   * The answer to one call; `useCache` false always asks the source (and
   * refreshes the entry). An answer in another language is translated from
   * the source-language answer (itself cached, so the item is bought once)
   * and stored under its language, unless its translation failed. A fresh
   * entry in a cache that answers at once is answered at once (MaybeAsync).
   * `sent` counts the requests this call's own purchase sends to a paid
   * provider; a call that shares another's purchase sends none.
   */
  answer(operation: Operation, args: Args, lang: string, useCache: boolean, signal: AbortSignal, trace?: TraceContext, sent?: SentRequests): MaybeAsync<Answered> {
    if (lang === "cn") return this.sourceAnswer(operation, args, useCache, signal, trace, sent);
    const key = this.key(operation, args, lang);
    return thenMaybe(this.cache?.get(key), (stored) => this.translatedAnswer(key, stored, operation, args, lang as TargetLanguage, useCache, signal, trace, sent));
  }

  /** The stored translation when it is fresh, or a new one. */
  private translatedAnswer(
    key: string,
    stored: CacheEntry | undefined,
    operation: Operation,
    args: Args,
    lang: TargetLanguage,
    useCache: boolean,
    signal: AbortSignal,
    trace: TraceContext | undefined,
    sent: SentRequests | undefined,
  ): MaybeAsync<Answered> {
    if (useCache && stored !== undefined && stored.freshUntil > this.now() && stored.translation !== undefined) {
      this.telemetry.cacheEvent(operation.id, "hit");
      return { ...this.fromEntry(stored, true), translation: { ...stored.translation, seconds: 0 } };
    }
    return this.translated(key, operation, args, lang, useCache, signal, trace, sent);
  }

  /** The source-language answer translated, and stored under its language unless its translation failed. */
  private async translated(
    key: string,
    operation: Operation,
    args: Args,
    lang: TargetLanguage,
    useCache: boolean,
    signal: AbortSignal,
    trace: TraceContext | undefined,
    sent: SentRequests | undefined,
  ): Promise<Answered> {
    const base = await this.sourceAnswer(operation, args, useCache, signal, trace, sent);
    if (!base.answer.found) return base;
    const source = base.answer.value;
    const translated =
      this.translator === undefined
        ? { value: source, report: { status: "error" as const, engine: "", seconds: 0 } }
        : await this.translator.translate(lang, signal, (t) => operation.translate(source, t));
    const report = translated.report;
    const token = createHash("md5").update(`${base.answer.token}\u0000${lang}`).digest("hex");
    const answer = { ...base.answer, value: translated.value, token } as Answered["answer"];
    if (this.cache === undefined || report.status === "error" || answer.found !== true) return { answer, fromCache: base.fromCache, memo: undefined, translation: report };
    const entry = this.store(key, operation, this.ttl(operation), {
      value: translated.value,
      reason: "",
      storedAt: answer.storedAt,
      token,
      translation: { status: report.status, engine: report.engine },
    });
    return { answer, fromCache: base.fromCache, memo: entry.memo, translation: report };
  }

  private ttl(operation: Operation): number {
    return this.policy.ttlSeconds.get(operation.id) ?? operation.ttlSeconds;
  }

  private key(operation: Operation, args: Args, lang: string): string {
    return [operation.id, ...operation.args.map((a) => args[a.name] ?? ""), lang].join("\u0000");
  }

  /**
   * An operator's purge: drops the stored answers of `operations` (in every
   * language and every variant of their other arguments), of one item
   * (`numIid`, each operation's first argument) or of every item, fresh or
   * kept as a stand-in, so the next call for them asks the source (and buys
   * again from a paid provider). A purchase in flight still stores what it
   * brings. Returns the entries dropped.
   */
  async purge(operations: readonly Operation[], numIid: string | undefined): Promise<number> {
    if (this.cache === undefined) return 0;
    let dropped = 0;
    for (const operation of operations) {
      // The prefix of `key`: the operation, then its arguments in its descriptor's order, num_iid first.
      if (numIid !== undefined && operation.args[0]?.name !== "num_iid") throw new Error(`${operation.id} does not take num_iid first`);
      dropped += await this.cache.purge(numIid === undefined ? `${operation.id}\u0000` : `${operation.id}\u0000${numIid}\u0000`);
    }
    return dropped;
  }

  private sourceAnswer(operation: Operation, args: Args, useCache: boolean, signal: AbortSignal, trace: TraceContext | undefined, sent: SentRequests | undefined): MaybeAsync<Answered> {
    const source = this.sources.get(operation.catalogue)!;
    if (this.cache === undefined) {
      this.telemetry.cacheEvent(operation.id, "miss");
      return this.bought(source, operation, args, signal, trace, sent).then((answer) => ({ answer, fromCache: false, memo: undefined }));
    }
    const key = this.key(operation, args, "cn");
    // The stored answer when it is fresh, or the source's.
    return thenMaybe(this.cache.get(key), (stored) => {
      if (useCache && stored !== undefined && stored.freshUntil > this.now()) {
        this.telemetry.cacheEvent(operation.id, "hit");
        return this.fromEntry(stored, true);
      }
      return this.fetched({ key, operation, source, args, useCache, trace, sent }, stored);
    });
  }

  /** The source's answer (one call per key at a time), or, when the source fails, the stored one if it may stand in. */
  private async fetched(ask: Ask, stored: CacheEntry | undefined): Promise<Answered> {
    try {
      const { entry, kept } = await this.fetchOnce(ask);
      return this.fromEntry(entry, false, kept);
    } catch (e) {
      // Stale-if-error: a fault of the source, and an answer young enough to stand in.
      if (e instanceof GatewayError && stored !== undefined && stored.staleUntil > this.now()) {
        this.telemetry.cacheEvent(ask.operation.id, "stale");
        return this.fromEntry(stored, true);
      }
      throw e;
    }
  }

  /**
   * One source call per key at a time; the others wait for it and share its
   * answer. With a cache shared by several replicas and a source that is not
   * local, one replica at a time: the others wait for its entry (up to the claim's length, then ask the
   * source themselves, under a claim of their own, so a replica that died holding the claim costs a wait,
   * never an answer, unless the shared cache stopped answering meanwhile: then it is refused, since the
   * holder may have bought it). A `cache=no` refresh always asks the source itself.
   * A purchase whose caller was told 4017 while the provider may still answer goes on (`land`): calls for its
   * key wait on it rather than buy it again. Only the call that starts a purchase counts its requests (`sent`).
   */
  private fetchOnce(ask: Ask): Promise<Fetched> {
    const { key, operation, source, useCache } = ask;
    const running = this.inFlight.get(key);
    if (running !== undefined) {
      this.telemetry.cacheEvent(operation.id, "coalesced");
      return running;
    }
    const landing = this.landings.get(key);
    if (landing !== undefined) return this.awaitLanding(landing, ask);
    const call = (async () => {
      // Claims keep a paid item from being bought twice; a local read needs none (and a local
      // answer may not be kept, which would leave the others waiting out the claim).
      let claim = useCache && source.local !== true ? await this.cache?.claim?.(key, this.policy.claimMs) : undefined;
      if (claim === "held") {
        const shared = await this.awaitShared(key);
        if (shared !== undefined) {
          this.telemetry.cacheEvent(operation.id, "coalesced");
          return { entry: shared, kept: true };
        }
        // The holder's time is up without an entry: buy under a claim of this call's own, so the others wait for it in
        // turn. Refused where the shared cache cannot be asked: the holder may have bought it meanwhile.
        claim = await this.cache!.claim!(key, this.policy.claimMs);
      }
      this.telemetry.cacheEvent(operation.id, "miss");
      try {
        // The shared call is not tied to the first caller's connection: others wait on it too. It carries the
        // trace of the call that started it.
        const answer = await this.bought(source, operation, ask.args, new AbortController().signal, ask.trace, ask.sent);
        return this.keep(ask, answer);
      } catch (e) {
        if (e instanceof LateAnswer && this.cache !== undefined) {
          // The claim, where there is one, is held until the answer comes, so other replicas wait for it too.
          this.land(ask, e, typeof claim === "function" ? claim : undefined);
          claim = undefined;
        }
        throw e;
      } finally {
        if (typeof claim === "function") await claim().catch(() => {});
      }
    })();
    this.inFlight.set(key, call);
    const clear = () => this.inFlight.delete(key);
    call.then(clear, clear);
    return call;
  }

  /** A source's answer stored as its key's entry: kept for its time to live, or (a local answer asked for once) not. */
  private keep({ key, operation, source }: Ask, answer: Found | NotFound): Fetched {
    // A local source's answer is kept from the second request for its key on (doorkeeper.ts).
    const keep = source.local !== true || this.doorkeeper.seenBefore(key);
    if (answer.found) {
      const entry = this.store(key, operation, keep ? this.ttl(operation) : 0, { value: answer.value, reason: "", storedAt: answer.storedAt, token: answer.token });
      return { entry, kept: keep };
    }
    const storedAt = Math.floor(this.now() / 1000);
    const token = createHash("md5").update(`${key}\u0000${storedAt}`).digest("hex");
    return { entry: this.store(key, operation, keep ? this.policy.notFoundTtlSeconds : 0, { value: null, reason: answer.reason, storedAt, token }), kept: keep };
  }

  /** A late purchase's answer awaited under its key: stored when it comes; the claim released once it has come or failed. */
  private land(ask: Ask, late: LateAnswer, release: (() => Promise<void>) | undefined): void {
    const landing: Landing = {
      fetched: late.landing.then((answer) => (answer === undefined ? undefined : this.keep(ask, answer))).catch(() => undefined),
      waitMs: late.waitMs,
    };
    this.landings.set(ask.key, landing);
    void landing.fetched.finally(async () => {
      if (this.landings.get(ask.key) === landing) this.landings.delete(ask.key);
      await release?.().catch(() => {});
    });
  }

  /**
   * A call for a key whose purchase is answering late: its answer if it comes within the wait a source gives one
   * attempt (coalesced: this call buys nothing), 4017 if not. If the purchase fails meanwhile, this call buys anew.
   */
  private async awaitLanding(landing: Landing, ask: Ask): Promise<Fetched> {
    const fetched = await within(landing.fetched, landing.waitMs, "waited" as const);
    if (fetched === "waited") throw new GatewayError(ErrorCode.TIMEOUT, `the upstream provider has not answered this item's request within ${landing.waitMs} ms; its answer is still awaited and will be kept: ask again`);
    if (fetched === undefined) return this.fetchOnce(ask);
    this.telemetry.cacheEvent(ask.operation.id, "coalesced");
    return fetched;
  }

  /**
   * A source's answer. Where the call is traced (tracing.ts), the purchase is
   * a client span beneath the call's, and the source hands that span's id
   * to the provider as its parent; the span says how many requests the
   * purchase sent (its retries: what its row counts).
   */
  private bought(source: CatalogueSource, operation: Operation, args: Args, signal: AbortSignal, trace: TraceContext | undefined, sent: SentRequests | undefined): Promise<Found | NotFound> {
    const span = trace?.span?.child(`${source.label} ${operation.id}`, "client");
    if (span === undefined) return source.fetch(operation, args, signal, trace, sent);
    const counted = sent ?? { count: 0 };
    const before = counted.count;
    const attributes = () => ({ "gateway.operation": operation.id, "gateway.source": source.label, "gateway.upstream_requests": counted.count - before });
    return source.fetch(operation, args, signal, span.context, counted).then(
      (answer) => {
        span.end({ ...attributes(), "gateway.found": answer.found });
        return answer;
      },
      (e: unknown) => {
        span.end(attributes(), e instanceof Error ? e.message : String(e));
        throw e;
      },
    );
  }

  /** The fresh entry another replica is fetching, polled until the claim would have expired. */
  private async awaitShared(key: string): Promise<CacheEntry | undefined> {
    const until = this.now() + this.policy.claimMs;
    while (this.now() < until) {
      await new Promise((r) => setTimeout(r, 25));
      const entry = await this.cache!.get(key);
      if (entry !== undefined && entry.freshUntil > this.now()) return entry;
    }
    return undefined;
  }

  /** An answer as a cache entry, fresh for `ttl` seconds and kept as a stand-in for the stale bound after; `ttl` 0 keeps nothing (and measures nothing). */
  private store(key: string, operation: Operation, ttl: number, answer: Pick<CacheEntry, "value" | "reason" | "storedAt" | "token" | "translation">): CacheEntry {
    const now = this.now();
    const entry: CacheEntry = {
      ...answer,
      freshUntil: now + ttl * 1000,
      staleUntil: now + (ttl + this.policy.staleIfErrorSeconds) * 1000,
      bytes: ttl > 0 ? entryBytes(answer.value, answer.reason) : 0,
      memo: new EntryMemo(),
    };
    if (ttl > 0) this.cache?.set(key, entry);
    return entry;
  }

  /** The answer of an entry; its memo only when the entry is kept (renderings of an answer used once are not worth keeping). */
  private fromEntry(entry: CacheEntry, fromCache: boolean, kept = true): Answered {
    const answer: Answered["answer"] =
      entry.value === null
        ? { found: false, reason: entry.reason }
        : { found: true, value: entry.value, storedAt: entry.storedAt, token: entry.token };
    return { answer, fromCache, memo: kept ? entry.memo : undefined };
  }
}

/**
 * One call's ask of a source-language answer, as the steps from the cache to
 * a purchase pass it on: its cache key, the operation and its source, the
 * arguments, whether a stored answer may serve, the call's trace, and where
 * the requests its own purchase sends are counted.
 */
interface Ask {
  readonly key: string;
  readonly operation: Operation;
  readonly source: CatalogueSource;
  readonly args: Args;
  readonly useCache: boolean;
  readonly trace: TraceContext | undefined;
  readonly sent: SentRequests | undefined;
}

/** A source's answer as an entry, and whether the cache keeps it. */
interface Fetched {
  readonly entry: CacheEntry;
  readonly kept: boolean;
}

/** A purchase answering late: its entry when it comes (undefined if it fails), and how long one call waits for it. */
interface Landing {
  readonly fetched: Promise<Fetched | undefined>;
  readonly waitMs: number;
}
