import {
  BrokenCircuitError,
  circuitBreaker,
  ExponentialBackoff,
  handleType,
  handleWhen,
  retry,
  SamplingBreaker,
  wrap,
  type IPolicy,
} from "cockatiel";
import { hash } from "node:crypto";
import type { IncomingHttpHeaders } from "node:http";
import type { Duplex } from "node:stream";
import { Pool, type Dispatcher } from "undici";
import { isObject, readLegacyMessage } from "../../catalogue/legacy-message.ts";
import { LateAnswer, type CatalogueSource, type Found, type NotFound, type SentRequests } from "../../core/catalogue-source.ts";
import type { Args, Operation } from "../../core/operation.ts";
import type { TraceContext } from "../../core/trace-context.ts";
import { formatDateTime } from "../../core/clock.ts";
import { GatewayError } from "../../core/gateway-error.ts";
import { legacySign, legacySigningKey } from "../../core/legacy-signature.ts";
import { noTelemetry, type Telemetry } from "../../core/telemetry.ts";
import { within } from "../../core/within.ts";
import type { ProviderWaits } from "../../core/provider-waits.ts";
import { ErrorCode } from "../../gen/gateway/catalogue/v1/status_pb.js";

export interface UpstreamOptions {
  /** Base URL of the provider, e.g. http://127.0.0.1:9000 */
  readonly url: string;
  /** The provider's name for this catalogue (retail -> "taobao"). */
  readonly catalogue: string;
  /** The gateway's own account at the provider. */
  readonly key: string;
  readonly secret: string;
  /** "plain" sends the secret; "md5" signs with dateline and sign instead. */
  readonly signing: "plain" | "md5";
  /** Limit of one attempt; past it the attempt is a timeout (4017). */
  readonly attemptTimeoutMs: number;
  /** Limit of the whole call, retries included (4017). */
  readonly deadlineMs: number;
  /** Most attempts per call, the first included. */
  readonly maxAttempts: number;
  /** Retries may add at most this share of extra calls (0.2 = 20%). */
  readonly retryBudget: number;
  /** Open the breaker when this share of calls fails over `breakerWindowMs`… */
  readonly breakerThreshold: number;
  readonly breakerWindowMs: number;
  /** …given at least this many calls a second. */
  readonly breakerMinimumRps: number;
  /** How long an open breaker answers 4002 at once before a probe goes through. */
  readonly breakerHalfOpenAfterMs: number;
  /** Keep-alive connections to the provider; at most half of them wait for answers their callers stopped waiting for. */
  readonly connections: number;
  /** Largest answer read, in bytes: past it the answer is 4002 and its connection is dropped. */
  readonly maxBodyBytes: number;
  /** Zone of the signed `dateline`. */
  readonly timeZone: string;
  readonly now: () => number;
  /** Our name of the catalogue this source serves (the breaker's label in metrics). */
  readonly label: string;
  /** Where each upstream call and the breaker's state are reported. */
  readonly telemetry: Telemetry;
  /** Where the provider's waits (its Retry-After) are shared with the other replicas calling it, under `label`; unset, this source's own. */
  readonly waits?: ProviderWaits | undefined;
}

export const defaultUpstreamOptions: Omit<UpstreamOptions, "url" | "catalogue" | "key" | "secret"> = {
  signing: "plain",
  attemptTimeoutMs: 3000,
  deadlineMs: 8000,
  maxAttempts: 3,
  retryBudget: 0.2,
  breakerThreshold: 0.5,
  breakerWindowMs: 10_000,
  breakerMinimumRps: 2,
  breakerHalfOpenAfterMs: 5000,
  connections: 32,
  maxBodyBytes: 4 * 1048576,
  timeZone: "Asia/Shanghai",
  now: Date.now,
  label: "",
  telemetry: noTelemetry,
};

/** A failure it is safe to try again: the provider cannot have acted on the request. */
class RetryableFault extends GatewayError {}

/**
 * The provider refusing the gateway's own account (its 4004–4016, which it
 * does not bill): a code the operator must act on (credentials, an API not
 * enabled, a stopped account, a quota or a balance spent), not retried.
 */
class ProviderRefusal extends GatewayError {}

/** The provider holding the gateway's calls back for now (its 4008, a limit on the account's calls; its 4009, maintenance): tried again. */
class ProviderHolding extends RetryableFault {}

/** A call not sent at all: the provider asked the gateway to wait (its Retry-After), and the wait is not over. */
class HeldBack extends GatewayError {}

/** The longest a provider's `Retry-After` holds the gateway's requests back; a longer one (or a date further off) counts as this. */
export const longestUpstreamHoldMs = 300_000;

/**
 * A provider's `Retry-After` (RFC 9110, section 10.2.3), whole seconds or
 * an HTTP date, as ms from `now` (at most `longestUpstreamHoldMs`); undefined
 * when there is none, it cannot be read, or it asks for no wait.
 */
export function retryAfterMs(header: string | string[] | undefined, now: number): number | undefined {
  const text = (Array.isArray(header) ? header[0] : header)?.trim();
  if (text === undefined || text === "") return undefined;
  const ms = /^\d+$/.test(text) ? Number(text) * 1000 : Date.parse(text) - now;
  if (!(ms > 0)) return undefined;
  return Math.min(Math.ceil(ms), longestUpstreamHoldMs);
}

/** The provider's codes that hold calls back for now rather than refuse the account. */
const holdingCodes: Record<string, string> = { "4008": "its limit on the gateway's calls", "4009": "maintenance" };

const circuitOpen = "the upstream provider is failing; calls are held back for a few seconds";

/**
 * Retries may add at most `share` of extra load: every first attempt earns
 * `share` of a token, every retry spends one (a token bucket, capped).
 */
class RetryBudget {
  private tokens: number;
  private readonly share: number;

  constructor(share: number) {
    this.share = share;
    this.tokens = Math.min(10, share * 10);
  }

  earn(): void {
    this.tokens = Math.min(10, this.tokens + this.share);
  }

  spend(): boolean {
    if (this.tokens < 1) return false;
    this.tokens -= 1;
    return true;
  }
}

const connectFaults = new Set(["ECONNREFUSED", "ECONNRESET", "EPIPE", "UND_ERR_SOCKET", "ENOTFOUND", "EAI_AGAIN", "EHOSTUNREACH", "ENETUNREACH"]);
const timeoutFaults = new Set(["UND_ERR_CONNECT_TIMEOUT", "UND_ERR_HEADERS_TIMEOUT", "UND_ERR_BODY_TIMEOUT"]);

/** Where a request names what to call once undici has written it to a connection (`Written`). */
const onWritten = Symbol("onWritten");

/**
 * A request's handler that also says when undici has written the request
 * to a connection: from then on it may have reached the provider, and the
 * provider may bill it. A request never written (its connection refused or
 * never made, or cut while it queued for one) cannot be billed.
 */
class Written implements Dispatcher.DispatchHandler {
  private readonly handler: Dispatcher.DispatchHandler;
  private readonly written: () => void;

  constructor(handler: Dispatcher.DispatchHandler, written: () => void) {
    this.handler = handler;
    this.written = written;
  }

  onRequestStart(controller: Dispatcher.DispatchController, context: unknown): void {
    this.handler.onRequestStart?.(controller, context);
  }

  onRequestSent(): void {
    this.written();
    this.handler.onRequestSent?.();
  }

  onRequestUpgrade(controller: Dispatcher.DispatchController, statusCode: number, headers: IncomingHttpHeaders, socket: Duplex): void {
    this.handler.onRequestUpgrade?.(controller, statusCode, headers, socket);
  }

  onResponseStarted(): void {
    this.handler.onResponseStarted?.();
  }

  onResponseStart(controller: Dispatcher.DispatchController, statusCode: number, headers: IncomingHttpHeaders, statusMessage?: string): void {
    this.handler.onResponseStart?.(controller, statusCode, headers, statusMessage);
  }

  onResponseData(controller: Dispatcher.DispatchController, chunk: Buffer): void {
    this.handler.onResponseData?.(controller, chunk);
  }

  onResponseEnd(controller: Dispatcher.DispatchController, trailers: IncomingHttpHeaders): void {
    this.handler.onResponseEnd?.(controller, trailers);
  }

  onResponseError(controller: Dispatcher.DispatchController, error: Error): void {
    this.handler.onResponseError?.(controller, error);
  }
}

/**
 * A catalogue source that asks a paid upstream provider speaking the legacy
 * query-string protocol. Every fault becomes the right code, and none leaks
 * the gateway's own provider credentials: a timeout of an attempt is 4017, a
 * refused or reset connection 4001, an HTTP 5xx, a body that is not JSON, a
 * 0000 without its payload or the provider refusing the gateway's account
 * 4002; the provider's 2000 is a real answer. Refused connections, HTTP 429
 * and 502/503/504, and the provider's 4008 and 4009 (calls held back) are
 * retried with jittered backoff within a retry budget, unless they came with
 * a Retry-After: then the provider has said when to come back, and nothing
 * is sent to it before (4002 at once, with the wait); a circuit breaker
 * answers 4002 at once while the provider keeps failing.
 */
export class UpstreamSource implements CatalogueSource {
  readonly label = "upstream";
  private readonly options: UpstreamOptions;
  private readonly pool: Pool;
  /** The pool, with each request's `onWritten` told when it is written. */
  private readonly dispatcher: Dispatcher;
  private readonly base: URL;
  private readonly policy: IPolicy;
  private readonly budget: RetryBudget;
  /** Requests whose callers stopped waiting, still awaited for their answers: each one's way to cut it. */
  private readonly late = new Set<AbortController>();
  /** Until when (`performance.now()`) the provider asked for no requests (its Retry-After): calls are answered 4002 unsent. */
  private heldUntil = 0;

  constructor(options: Partial<UpstreamOptions> & Pick<UpstreamOptions, "url" | "catalogue" | "key" | "secret">) {
    this.options = { ...defaultUpstreamOptions, ...options };
    this.base = new URL(this.options.url);
    this.pool = new Pool(this.base.origin, { connections: this.options.connections, keepAliveTimeout: 30_000, connectTimeout: this.options.attemptTimeoutMs });
    this.dispatcher = this.pool.compose((dispatch) => (opts, handler) => {
      const written = (opts as { [onWritten]?: () => void })[onWritten];
      return dispatch(opts, written === undefined ? handler : new Written(handler, written));
    });
    this.budget = new RetryBudget(this.options.retryBudget);
    const retrying = retry(
      // Not a fault that came with a Retry-After: the provider said when to come back, and no call is sent before.
      handleWhen((e) => e instanceof RetryableFault && e.retryAfterMs === undefined && this.budget.spend()),
      { maxAttempts: this.options.maxAttempts - 1, backoff: new ExponentialBackoff({ initialDelay: 50, maxDelay: 1000 }) },
    );
    const breaker = circuitBreaker(handleType(GatewayError), {
      halfOpenAfter: this.options.breakerHalfOpenAfterMs,
      breaker: new SamplingBreaker({
        threshold: this.options.breakerThreshold,
        duration: this.options.breakerWindowMs,
        minimumRps: this.options.breakerMinimumRps,
      }),
    });
    const { telemetry, label } = this.options;
    breaker.onBreak(() => telemetry.circuitChanged(label, true));
    breaker.onReset(() => telemetry.circuitChanged(label, false));
    telemetry.circuitChanged(label, false);
    this.policy = wrap(retrying, breaker);
    this.options.waits?.listen(label, (ms) => this.hold(ms));
  }

  /**
   * Asks the provider for one call of an operation: its api name and the
   * arguments its descriptor sends, and the answer's `item` read against
   * the operation's contract (one record, or a non-empty list). The
   * caller's trace context goes with each attempt (`traceparent`,
   * `tracestate`), so the provider's work joins the caller's trace.
   */
  async fetch(operation: Operation, args: Args, _signal?: AbortSignal, trace?: TraceContext, sent?: SentRequests): Promise<Found | NotFound> {
    const started = performance.now();
    let outcome = "error";
    // Counted for the metrics whether or not the caller counts them for its row.
    const counted = sent ?? { count: 0 };
    const before = counted.count;
    try {
      const answer = await this.read(operation, args, trace, counted);
      outcome = answer.found ? "ok" : "not_found";
      return answer;
    } catch (e) {
      if (e instanceof GatewayError && e.code === ErrorCode.TIMEOUT) outcome = "timeout";
      else if (e instanceof GatewayError && e.message === circuitOpen) outcome = "circuit_open";
      else if (e instanceof ProviderRefusal || e instanceof ProviderHolding) outcome = "refused";
      else if (e instanceof HeldBack) outcome = "held";
      throw e;
    } finally {
      this.options.telemetry.upstreamRequest(operation.id, outcome, (performance.now() - started) / 1000, counted.count - before);
    }
  }

  private read(operation: Operation, args: Args, trace: TraceContext | undefined, sent: SentRequests | undefined): Promise<Found | NotFound> {
    return this.call(operation, operation.upstreamArgs(args), trace, sent, (body) => this.answerOf(operation, args, body));
  }

  /** The provider's answer read against the operation's contract. */
  private answerOf(operation: Operation, args: Args, body: Record<string, unknown> | "not-found"): Found | NotFound {
    if (body === "not-found") return { found: false, reason: operation.notFound(args) };
    const { message, list } = operation.item;
    const item = body.item;
    let value: unknown;
    if (list) {
      if (!Array.isArray(item) || item.length === 0) throw new GatewayError(ErrorCode.TARGET_SERVER_ERROR, "the upstream answered 0000 without its item list");
      value = readPayload(() => item.map((e, i) => readLegacyMessage(message, e, `item[${i}]`)));
    } else {
      if (!isObject(item)) throw new GatewayError(ErrorCode.TARGET_SERVER_ERROR, "the upstream answered 0000 without its item");
      value = readPayload(() => readLegacyMessage(message, item, "item"));
    }
    return this.found(value, [operation.id, ...operation.args.map((a) => args[a.name] ?? "")].join("\u0000"));
  }

  /** Stops waiting for late answers (no caller waits for them, and the cache they would fill is closing too), then closes the pool. */
  async close(): Promise<void> {
    for (const abandon of this.late) abandon.abort();
    await this.pool.close();
  }

  private found<T>(value: T, id: string): Found<T> {
    const storedAt = Math.floor(this.options.now() / 1000);
    return { found: true, value, storedAt, token: hash("md5", `${this.options.catalogue}\u0000${id}\u0000${storedAt}`) };
  }

  /** One upstream call under the deadline, retry and breaker policies; `answerOf` reads the provider's answer. */
  private async call(
    operation: Operation,
    args: Record<string, string>,
    trace: TraceContext | undefined,
    sent: SentRequests | undefined,
    answerOf: (body: Record<string, unknown> | "not-found") => Found | NotFound,
  ): Promise<Found | NotFound> {
    const held = Math.ceil(this.heldUntil - performance.now());
    if (held > 0) {
      throw new HeldBack(ErrorCode.TARGET_SERVER_ERROR, `the upstream provider asked the gateway to wait before calling it again (Retry-After); nothing was sent; ask again in ${Math.ceil(held / 1000)} s`, {
        limit: "upstream",
        retryAfterMs: held,
      });
    }
    this.budget.earn();
    const deadline = AbortSignal.timeout(this.options.deadlineMs);
    const headers: Record<string, string> = { "accept-encoding": "identity" };
    if (trace !== undefined) {
      headers.traceparent = trace.traceparent;
      if (trace.tracestate !== undefined) headers.tracestate = trace.tracestate;
    }
    try {
      return await this.policy.execute(() => this.attempt(operation, args, deadline, headers, sent, answerOf), deadline);
    } catch (e) {
      if (e instanceof GatewayError) throw e;
      if (e instanceof BrokenCircuitError) throw new GatewayError(ErrorCode.TARGET_SERVER_ERROR, circuitOpen);
      if (deadline.aborted) throw new GatewayError(ErrorCode.TIMEOUT, `the upstream provider did not answer within ${this.options.deadlineMs} ms`);
      throw e;
    }
  }

  private url(apiName: string, args: Record<string, string>): string {
    const params: Record<string, string> = { ...args, result_type: "json", lang: "cn", key: this.options.key };
    if (this.options.signing === "md5") {
      params.dateline = formatDateTime(this.options.now(), this.options.timeZone);
      params.sign = legacySign({ ...params, api_name: apiName }, legacySigningKey(this.options.secret));
    } else {
      params.secret = this.options.secret;
    }
    const path = `${this.base.pathname.replace(/\/$/, "")}/${this.options.catalogue}/${apiName}/`;
    return `${path}?${new URLSearchParams(params)}`;
  }

  /**
   * One request to the provider, under the whole call's deadline. Its caller
   * waits for it at most `attemptTimeoutMs` (4017 past it), but the request
   * is not cut there: the provider may have acted on it and billed it, so
   * its answer is still awaited until the call's deadline and handed on as a
   * `LateAnswer`, for the cache to keep (at most half the pool's connections
   * wait so; past that, and past the deadline, the request is cut as it
   * times out). It is counted in `sent` once undici has written it to a
   * connection (`Written`): from then on it may have reached the provider. A
   * request not yet written when its caller's time is up (queued for a
   * connection, or one still opening) is cut then, and never counted.
   */
  private async attempt(
    operation: Operation,
    args: Record<string, string>,
    deadline: AbortSignal,
    headers: Record<string, string>,
    sent: SentRequests | undefined,
    answerOf: (body: Record<string, unknown> | "not-found") => Found | NotFound,
  ): Promise<Found | NotFound> {
    const abandon = new AbortController();
    let written = false;
    const exchange = this.exchange(operation, args, AbortSignal.any([deadline, abandon.signal]), headers, () => {
      written = true;
      if (sent !== undefined) sent.count++;
    }).then(answerOf);
    const first = await within(exchange, this.options.attemptTimeoutMs, "waited" as const);
    if (first !== "waited") return first;
    // The caller's time is up; the request's may not be.
    const ms = this.options.attemptTimeoutMs;
    if (!written) {
      abandon.abort();
      exchange.catch(() => {});
      throw new GatewayError(ErrorCode.TIMEOUT, `no connection to the upstream provider was free or could be opened within ${ms} ms; nothing was sent`);
    }
    const timedOut = `the upstream provider did not answer within ${ms} ms`;
    if (deadline.aborted || this.late.size >= Math.max(1, Math.floor(this.options.connections / 2))) {
      abandon.abort();
      exchange.catch(() => {});
      this.options.telemetry.upstreamLate(operation.id, "abandoned");
      throw new GatewayError(ErrorCode.TIMEOUT, timedOut);
    }
    this.late.add(abandon);
    const landing = exchange.then(
      (answer) => {
        this.options.telemetry.upstreamLate(operation.id, "landed");
        return answer;
      },
      () => {
        this.options.telemetry.upstreamLate(operation.id, "failed");
        return undefined;
      },
    );
    void landing.finally(() => this.late.delete(abandon));
    throw new LateAnswer(`${timedOut}; its answer is still awaited and will be kept: ask again`, landing, ms);
  }

  /** The request itself: the provider's answer, or the fault it ends in (as its code); `written` is called once it is written. */
  private async exchange(
    operation: Operation,
    args: Record<string, string>,
    signal: AbortSignal,
    headers: Record<string, string>,
    written: () => void,
  ): Promise<Record<string, unknown> | "not-found"> {
    let status: number;
    let text: string;
    let wait: number | undefined;
    try {
      const request: Dispatcher.RequestOptions & { [onWritten]: () => void } = { method: "GET", path: this.url(operation.apiName, args), signal, headers, [onWritten]: written };
      const res = await this.dispatcher.request(request);
      status = res.statusCode;
      wait = retryAfterMs(res.headers["retry-after"], this.options.now());
      text = await this.readBody(res.body);
    } catch (e) {
      if (e instanceof GatewayError) throw e;
      throw this.fault(e, signal);
    }
    // 429 (too many requests, as a proxy in front of the provider answers) and 502/503/504 were not acted on.
    if (status === 429 || status === 502 || status === 503 || status === 504) throw new RetryableFault(ErrorCode.TARGET_SERVER_ERROR, `the upstream answered HTTP ${status}${this.holdFor(wait)}`, this.waitOptions(wait));
    if (status >= 500) throw new GatewayError(ErrorCode.TARGET_SERVER_ERROR, `the upstream answered HTTP ${status}`);
    let body: unknown;
    try {
      body = JSON.parse(text);
    } catch {
      throw new GatewayError(ErrorCode.TARGET_SERVER_ERROR, `the upstream answered something that is not JSON (HTTP ${status})`);
    }
    if (typeof body !== "object" || body === null || Array.isArray(body)) throw new GatewayError(ErrorCode.TARGET_SERVER_ERROR, "the upstream answered JSON that is not a response");
    const record = body as Record<string, unknown>;
    const code = String(record.error_code ?? "");
    if (code === "0000") return record;
    if (code === "2000") return "not-found";
    const n = Number(code);
    if (/^\d{4}$/.test(code) && n >= 4004 && n <= 4016) {
      this.options.telemetry.upstreamRefused(operation.id, code);
      const holding = holdingCodes[code];
      if (holding !== undefined) {
        const asked = this.holdFor(wait);
        throw new ProviderHolding(ErrorCode.TARGET_SERVER_ERROR, `the upstream provider is holding the gateway's calls back (its code ${code}: ${holding})${asked === "" ? "; ask again shortly" : asked}`, this.waitOptions(wait));
      }
      throw new ProviderRefusal(ErrorCode.TARGET_SERVER_ERROR, `the upstream provider refused the gateway's call (its code ${code}); the operator must check the upstream account`);
    }
    throw new GatewayError(ErrorCode.TARGET_SERVER_ERROR, /^\d{4}$/.test(code) ? `the upstream provider failed (its code ${code})` : "the upstream answered without an error_code");
  }

  /**
   * A wait the provider asked for (its Retry-After, in ms) held to: no
   * request is sent to it before the wait is over (`call`), by any call of
   * this source. Returns what the caller is told of it ("" for none).
   */
  private holdFor(wait: number | undefined): string {
    if (wait === undefined) return "";
    this.hold(wait);
    this.options.waits?.tell(this.options.label, wait);
    return `, and asked the gateway to wait ${Math.ceil(wait / 1000)} s before calling it again (Retry-After); ask again then`;
  }

  /** No request is sent before `ms` from now (a wait this source was told, or another replica's). */
  private hold(ms: number): void {
    if (!(ms > 0)) return;
    ms = Math.min(ms, longestUpstreamHoldMs);
    this.heldUntil = Math.max(this.heldUntil, performance.now() + ms);
  }

  /** A fault's limit and wait, where the provider asked for one: the caller is told when to come back. */
  private waitOptions(wait: number | undefined): { limit: "upstream"; retryAfterMs: number } | undefined {
    return wait === undefined ? undefined : { limit: "upstream", retryAfterMs: wait };
  }

  /**
   * The answer's body as text, read as it arrives and never more than
   * `maxBodyBytes`: a larger one is cut off, and destroying the body drops
   * its connection instead of returning it to the pool half read.
   */
  private async readBody(body: Dispatcher.ResponseData["body"]): Promise<string> {
    const max = this.options.maxBodyBytes;
    const chunks: Buffer[] = [];
    let size = 0;
    for await (const chunk of body as AsyncIterable<Buffer>) {
      size += chunk.length;
      if (size > max) {
        body.destroy();
        throw new GatewayError(ErrorCode.TARGET_SERVER_ERROR, `the upstream's answer is larger than ${max} bytes`);
      }
      chunks.push(chunk);
    }
    return Buffer.concat(chunks, size).toString("utf8");
  }

  /** A transport failure as its code; never with the URL, which carries credentials. */
  private fault(e: unknown, signal: AbortSignal): GatewayError {
    const code = (e as { code?: string }).code ?? "";
    const name = (e as { name?: string }).name ?? "";
    if (signal.aborted || timeoutFaults.has(code) || name === "TimeoutError" || name === "AbortError") {
      return new GatewayError(ErrorCode.TIMEOUT, `the upstream provider did not answer within ${this.options.attemptTimeoutMs} ms`);
    }
    if (code === "ECONNREFUSED") return new RetryableFault(ErrorCode.NETWORK_ERROR, "the upstream provider refused the connection");
    if (connectFaults.has(code)) return new GatewayError(ErrorCode.NETWORK_ERROR, `the connection to the upstream provider failed (${code})`);
    return new GatewayError(ErrorCode.NETWORK_ERROR, `the upstream provider could not be reached${code ? ` (${code})` : ""}`);
  }
}

function readPayload<T>(read: () => T): T {
  try {
    return read();
  } catch (e) {
    throw new GatewayError(ErrorCode.TARGET_SERVER_ERROR, `the upstream's payload does not fit the contract: ${(e as Error).message.slice(0, 200)}`);
  }
}
