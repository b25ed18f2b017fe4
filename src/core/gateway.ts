import { create } from "@bufbuild/protobuf";
import type { AlertOutbox, AlertRecord } from "./alerts.ts";
import { errorCodeInfo, fourDigits } from "../contract/error-codes.ts";
import { ErrorCode, LanguageInfoSchema, type StatusBlock } from "../gen/gateway/catalogue/v1/status_pb.js";
import { newStatusBlock } from "./status-block.ts";
import type { AccountStore } from "./account-store.ts";
import type { Account } from "./accounts.ts";
import { MemoryAddressLockout, type AddressLockout } from "./address-lockout.ts";
import { Authenticator, type AuthenticationOptions, type Credentials } from "./authentication.ts";
import { MemoryReplayGuard, type ReplayGuard } from "./replay-guard.ts";
import type { CachedCatalogue } from "./cached-catalogue.ts";
import type { TranslationReport } from "./translation.ts";
import type { Found, NotFound, SentRequests } from "./catalogue-source.ts";
import { dayOf, formatDateTime, nextDayStarts, previousDay, systemClock, type Clock } from "./clock.ts";
import { GatewayError, type Limit } from "./gateway-error.ts";
import { AddressNotAllowed, addressAllowed } from "./allowed-addresses.ts";
import type { Args, Operation } from "./operation.ts";
import { createRequestIdGenerator } from "./request-id.ts";
import { OwnReads } from "./own-reads.ts";
import type { MaybeAsync } from "./maybe-async.ts";
import { balanceAccounting, UnconfirmedCommit, type Admission, type BalanceAccounting, type Meter, type Transport, type UsageQuery, type UsageSummary } from "./meter.ts";
import { callPage, followCalls, totalsPage, type CallPage, type FeedPage, type TotalsPage } from "./usage-pages.ts";
import type { Micros } from "./money.ts";
import type { OperatorSwitches } from "./operator-switches.ts";
import type { EntryMemo } from "./response-cache.ts";
import { noTelemetry, type AbandonStage, type StoppedWaiting, type Telemetry } from "./telemetry.ts";
import { quotaStanding, type QuotaStanding } from "./quota-standing.ts";
import { rateStanding } from "./call-rate.ts";
import type { TraceContext } from "./trace-context.ts";
import { spanLogFields, type ActiveSpan, type SpanAttributes, type Tracer } from "./tracing.ts";
import { idempotencyKey, idempotencyKeyOf, keyForOtherRequest, keyInFlight, type TakenKey } from "./idempotency.ts";

export type { Transport } from "./meter.ts";

export type { Credentials } from "./authentication.ts";

export type { Limit } from "./gateway-error.ts";

export type { QuotaStanding } from "./quota-standing.ts";

/**
 * A call a limit refused, and how long until that limit admits a call
 * again, in whole ms, where that is known: the rate's next place, an
 * address's lock, the account's day ending (the daily maximum). A full
 * concurrency frees when any call in flight ends, and a balance when it is
 * topped up: neither is known.
 */
export interface LimitRefusal {
  readonly limit: Limit;
  readonly retryAfterMs: number | undefined;
}

/**
 * One call as a transport hands it to the core. Values are the legacy
 * strings: the RPC path converts its typed fields to them, so both paths
 * share one set of checks, in one order.
 */
export interface CallInput {
  /** The operation's own arguments as received; absent ones are undefined. */
  readonly args: Readonly<Record<string, string | undefined>>;
  /** `yes` or `no`; undefined means yes. */
  readonly cache?: string | undefined;
  /** `cn`, `en` or `ru`; undefined means cn. */
  readonly lang?: string | undefined;
  readonly credentials: Credentials;
  readonly transport: Transport;
  readonly clientIp: string;
  /**
   * The request cannot be read unambiguously (a repeated parameter, say):
   * answered 4003 before authentication, since its credentials cannot be
   * trusted either, and not counted as a failed authentication.
   */
  readonly malformed?: string | undefined;
  /** A fault in the request's options (e.g. an unknown result_type); answered 4003 once the caller is authenticated. */
  readonly rejection?: string | undefined;
  readonly signal?: AbortSignal | undefined;
  /**
   * When the caller stops waiting (its RPC deadline), as `performance.now()`
   * reads; undefined for none. A call whose deadline passes before its
   * answer is ready is answered 4017 and not charged (`Gateway.call`).
   */
  readonly deadline?: number | undefined;
  /**
   * Whether the caller has gone, asked where the deadline is: undefined
   * while it waits, `hung_up` once its connection was reset, its stream
   * reset or its RPC cancelled (or `deadline`, where the transport learns
   * of the deadline first). A call whose caller has gone before its answer
   * is ready is answered 4017 and not charged, as one past its deadline.
   * Undefined: a caller that cannot go.
   */
  readonly gone?: (() => StoppedWaiting | undefined) | undefined;
  /** The transport's id of the request (its log lines carry it); the core makes one when absent. */
  readonly requestId?: string | undefined;
  /** The caller's trace context, handed on to the upstream provider when the call buys its item (trace-context.ts). */
  readonly trace?: TraceContext | undefined;
  /** Where the core tells the transport's access line how the call went (CallLogFields); undefined where no line is written. */
  readonly logFields?: CallLogFields | undefined;
  /** The request's `Idempotency-Key` as sent (a repeated one joined with ", "); read once the caller is authenticated (idempotency.ts). */
  readonly idempotencyKey?: string | undefined;
}

/**
 * What a call's access line (`request completed`) says of it besides the
 * HTTP status, set by the core as the call goes: the four-digit code it
 * ended with (a legacy answer and a gRPC call are HTTP 200 whatever the
 * code), and, where the core records the call's span (tracing.ts), its
 * trace and span ids, so that a log search leads to the trace, including
 * one the gateway started for a call that sent no `traceparent`.
 */
export interface CallLogFields {
  errorCode?: string;
  traceId?: string;
  spanId?: string;
  /** Set while the core runs the call (`call`, `refuse`): a line written before it ends would not know the code. */
  running?: boolean;
  /**
   * Told as the core's call ends, set by a transport that waits for that to
   * write the call's last line: its caller went before the answer was made.
   */
  onEnd?: () => void;
}

/**
 * The result of a call. On success `item` is the operation's answer (its
 * response's `item`: a record or a list), which may be shared with other
 * calls through the cache: read it, never change it. `memo` is the cache
 * entry's scratch space for renderers.
 */
export type Outcome =
  | {
      readonly kind: "success";
      readonly operation: Operation;
      readonly status: StatusBlock;
      readonly item: unknown;
      readonly memo?: EntryMemo | undefined;
      /** Where the call left its account's daily maximum and rate. */
      readonly quota?: QuotaStanding | undefined;
      /** The request id of the charged call this one answered again for its idempotency key, not charging it (idempotency.ts). */
      readonly replayOf?: string | undefined;
    }
  | {
      readonly kind: "error";
      readonly operation: Operation | undefined;
      readonly status: StatusBlock;
      /** Where the call left its account's daily maximum and rate; undefined where no account was identified. */
      readonly quota?: QuotaStanding | undefined;
      /** The call said nothing of who the caller is (no key): RPC callers see `unauthenticated`. */
      readonly unauthenticated?: boolean;
      /** The limit that refused the call, if one did: transports tell the caller when to come back. */
      readonly refusedBy?: LimitRefusal | undefined;
      /** As a success's: a replay whose answer is not a success (a 2000, or the source failing while the item is bought again). */
      readonly replayOf?: string | undefined;
    };

/** A caller asking about its own account (Gateway.identifyCaller): who it says it is, from where. */
export interface CallerInput {
  readonly credentials: Credentials;
  readonly transport: Transport;
  readonly clientIp: string;
  readonly requestId?: string | undefined;
  /** Where a refusal's code is told to the access line (CallLogFields); a read that is answered has none. */
  readonly logFields?: CallLogFields | undefined;
}

/** The account a caller proved is its own, or its refusal with the status block a call's would carry. */
export type CallerIdentity =
  | { readonly kind: "account"; readonly account: Account; readonly requestId: string; readonly now: number; readonly logFields: CallLogFields | undefined }
  | { readonly kind: "refused"; readonly status: StatusBlock; readonly unauthenticated: boolean; readonly refusedBy: LimitRefusal | undefined };

export interface GatewayOptions {
  /** IANA zone of `server_time` and `secache_date`. */
  readonly timeZone: string;
  /** Label written before `server_time`, e.g. "Beijing". */
  readonly zoneLabel: string;
  /** First part of every request id. */
  readonly nodeLabel: string;
  /** The newest request id already used (e.g. from the ledger): new ids come after it. */
  readonly lastRequestId: string | undefined;
  /** Signature windows. */
  readonly authentication: Partial<AuthenticationOptions>;
  readonly clock: Clock;
}

export const defaultGatewayOptions: GatewayOptions = {
  timeZone: "Asia/Shanghai",
  zoneLabel: "Beijing",
  nodeLabel: "gw-1",
  lastRequestId: undefined,
  authentication: {},
  clock: systemClock,
};

export interface GatewayPorts {
  readonly accounts: AccountStore;
  readonly meter: Meter;
  readonly switches: OperatorSwitches;
  /** Where used signatures are remembered (default: this process's memory). */
  readonly replays?: ReplayGuard;
  /** Failed authentications per address (default: this gateway's own). */
  readonly lockout?: AddressLockout;
  /** The catalogue sources, behind the response cache. */
  readonly catalogue: CachedCatalogue;
  readonly log?: { error(obj: unknown, msg: string): void };
  /** Where calls, cache events and failed authentications are counted (default: nowhere). */
  readonly telemetry?: Telemetry;
  /** Where the gateway's own spans go (tracing.ts); none: no span is recorded. */
  readonly tracer?: Tracer | undefined;
  /** Where the accounts' usage alerts are kept (alerts.ts), for a caller's read of its own. */
  readonly alerts?: AlertOutbox | undefined;
}

interface CallOptions {
  readonly useCache: boolean;
  readonly lang: "cn" | "en" | "ru";
}

type Answer = Found | NotFound;

const argForms = { numeric: /^[0-9]*$/, token: /^[A-Za-z0-9_-]*$/ };
const argFormText = { numeric: "numeric text", token: "letters, digits, _ or -" };
const neverAborted = new AbortController().signal;

const abandonedWhen: Record<AbandonStage, string> = {
  before_source: "before the call reached its source, so nothing was bought",
  before_answer: "before the answer was ready, so the call was not charged",
};

/**
 * Throws 4017 when the caller has stopped waiting: its deadline (a
 * `performance.now()` time) has passed, or it has gone; and tells the
 * operator's metrics.
 */
function stoppedWaiting(operation: Operation, input: CallInput, started: number, stage: AbandonStage, telemetry: Telemetry): void {
  const passed = input.deadline !== undefined && performance.now() > input.deadline;
  const why = passed ? "deadline" : input.gone?.();
  if (why === undefined) return;
  telemetry.callAbandoned(operation.id, why, stage);
  const who = why === "hung_up" ? "the caller hung up" : passed ? `the caller's deadline (${Math.round(input.deadline! - started)} ms) passed` : "the caller's deadline passed";
  throw new GatewayError(ErrorCode.TIMEOUT, `${who} ${abandonedWhen[stage]}`);
}

/**
 * The gateway's core: authenticates a call, checks its arguments, asks the
 * catalogue's source, meters the outcome and builds the status block. It
 * knows nothing of HTTP; the Connect handlers and the legacy shim adapt it.
 */
export class Gateway {
  private readonly ports: GatewayPorts;
  private readonly options: GatewayOptions;
  private readonly nextRequestId: () => string;
  private readonly telemetry: Telemetry;
  private readonly authenticator: Authenticator;
  private readonly lockout: AddressLockout;
  private readonly ownReads = new OwnReads();
  private memory = { at: 0, text: "" };
  private readonly dayEnds = new Map<string, { readonly day: string; readonly at: number }>();
  /** Calls (and refusals) begun and not yet ended, and who waits for there to be none (`settled`). */
  private inFlight = 0;
  private readonly settling: (() => void)[] = [];

  constructor(ports: GatewayPorts, options: Partial<GatewayOptions> = {}) {
    this.ports = ports;
    this.options = { ...defaultGatewayOptions, ...options };
    this.nextRequestId = createRequestIdGenerator(this.options.nodeLabel, () => this.options.clock.now(), this.options.lastRequestId);
    this.lockout = ports.lockout ?? new MemoryAddressLockout();
    this.telemetry = ports.telemetry ?? noTelemetry;
    this.authenticator = new Authenticator(ports.accounts, ports.replays ?? new MemoryReplayGuard(), {
      timeZone: this.options.timeZone,
      ...this.options.authentication,
    });
  }

  /** This replica's label, the first part of its request ids. */
  get nodeLabel(): string {
    return this.options.nodeLabel;
  }

  /** A new request id, for a transport that names its requests before they reach the core (see `CallInput.requestId`). */
  newRequestId(): string {
    return this.nextRequestId();
  }

  /**
   * Resolves once no call is in flight, or after `withinMs`: the stores a
   * call writes to (its ledger row, the cache its purchase fills) must stay
   * open until it ends, though its caller, and with it its connection, may
   * have gone long before (a server that has closed its last connection
   * still has calls to finish). Resolves with how many were left.
   */
  settled(withinMs: number): Promise<number> {
    if (this.inFlight === 0) return Promise.resolve(0);
    return new Promise((resolve) => {
      const timer = setTimeout(() => resolve(this.inFlight), withinMs);
      this.settling.push(() => {
        clearTimeout(timer);
        resolve(0);
      });
    });
  }

  private began(fields: CallLogFields | undefined): void {
    this.inFlight++;
    if (fields !== undefined) fields.running = true;
  }

  private ended(fields: CallLogFields | undefined): void {
    if (fields !== undefined) {
      fields.running = false;
      fields.onEnd?.();
    }
    if (--this.inFlight === 0) for (const resolve of this.settling.splice(0)) resolve();
  }

  async call(operation: Operation, input: CallInput): Promise<Outcome> {
    this.began(input.logFields);
    try {
      return await this.answerCall(operation, input);
    } finally {
      this.ended(input.logFields);
    }
  }

  private async answerCall(operation: Operation, input: CallInput): Promise<Outcome> {
    this.telemetry.callStarted();
    const started = performance.now();
    const now = this.options.clock.now();
    const requestId = input.requestId ?? this.nextRequestId();
    let account: Account | undefined;
    let code: ErrorCode;
    let reason = "";
    let answer: Answer | undefined;
    let options: CallOptions = { useCache: true, lang: "cn" };
    let admission: Admission | undefined;
    let fromCache = false;
    let memo: EntryMemo | undefined;
    let translation: TranslationReport | undefined;
    let refusedBy: LimitRefusal | undefined;
    let notAllowedHere = false;
    let key: TakenKey | undefined;
    let replayOf: string | undefined;
    // The requests this call's own purchase sends to a paid provider (none for the gateway's own catalogue).
    let sent: SentRequests | undefined;
    // The call's own span, where it is traced; its purchases hang beneath it.
    const span = this.ports.tracer?.startCall(input.trace, spanName(operation, input.transport));
    if (span !== undefined && input.logFields !== undefined) {
      input.logFields.traceId = span.traceId;
      input.logFields.spanId = span.spanId;
    }
    // Each step awaits only a promise: a port that answers at once is not waited for (MaybeAsync).
    try {
      const locked = this.lockedOut(input.clientIp, now);
      if (locked instanceof Promise) await locked;
      if (input.malformed !== undefined) throw new GatewayError(ErrorCode.PARAM_ERROR, input.malformed);
      const identified = this.authenticator.identify(operation, input.credentials, now);
      account = identified instanceof Promise ? await identified : identified;
      this.authenticator.authorize(account, operation, now, input.clientIp);
      if (input.rejection !== undefined) throw new GatewayError(ErrorCode.PARAM_ERROR, input.rejection);
      const keyText = idempotencyKeyOf(input.idempotencyKey);
      const args = checkArgs(operation, input.args);
      options = checkOptions(input);
      const source = this.ports.catalogue.source(operation);
      const maintenance = source === undefined || this.ports.switches.inMaintenance(operation.id);
      if (maintenance instanceof Promise ? await maintenance : maintenance) {
        throw new GatewayError(ErrorCode.API_MAINTENANCE, `${operation.id} is under maintenance; try again later`);
      }
      // Nothing is bought that could not be recorded: refusals keep their own codes, a call that would be served waits for the ledger.
      const unavailable = this.ports.meter.unavailable(now);
      if (unavailable !== undefined) throw new GatewayError(ErrorCode.SERVER_INTERNAL_ERROR, unavailable);
      if (keyText !== undefined) {
        // The key first: a copy of a call in flight, or of one charged, must not take a place under the limits.
        const claimed = this.ports.meter.claim(account.key, idempotencyKey(keyText, operation, args, options), now);
        const claim = claimed instanceof Promise ? await claimed : claimed;
        this.telemetry.idempotencyKey(operation.id, claim.kind === "replay" ? "replayed" : claim.kind);
        if (claim.kind === "in_flight") throw keyInFlight();
        if (claim.kind === "other_request") throw keyForOtherRequest();
        if (claim.kind === "replay") replayOf = claim.requestId;
        else key = claim;
      }
      if (replayOf === undefined) {
        const admitted = this.ports.meter.admit(account, operation.id, dayOf(now, account.zone));
        admission = admitted instanceof Promise ? await admitted : admitted;
      }
      stoppedWaiting(operation, input, started, "before_source", this.telemetry);
      // A replay is answered from the cache, where the charged call's answer was kept (bought again only if it was evicted).
      const useCache = options.useCache || replayOf !== undefined;
      if (source?.local !== true) sent = { count: 0 };
      const answering = this.ports.catalogue.answer(operation, args, options.lang, useCache, input.signal ?? neverAborted, span?.context ?? input.trace, sent);
      const answered = answering instanceof Promise ? await answering : answering;
      // A caller that has stopped waiting (its deadline passed: it sees deadline_exceeded; or it hung up) gets nothing,
      // so the call is not charged. Its purchase (shared with any other caller of the item, and kept for the next) was
      // waited for: the call's concurrency place stays taken until it ends, so callers that give up at once cannot
      // have more purchases running than their limit.
      stoppedWaiting(operation, input, started, "before_answer", this.telemetry);
      ({ answer, fromCache, memo, translation } = answered);
      code = answer.found ? ErrorCode.SUCCESS : ErrorCode.NO_RESULT;
      if (!answer.found) reason = answer.reason;
    } catch (e) {
      ({ code, reason } = this.failureOf(e, requestId, "call failed inside the gateway", span));
      if (e instanceof GatewayError) {
        notAllowedHere = e instanceof AddressNotAllowed;
        refusedBy = this.refusalOf(e, account, now);
        if (refusedBy !== undefined) this.telemetry.callLimited(operation.id, refusedBy.limit);
      }
    }

    // Awaited only when there is something to wait for: a call's path to its row takes no turn it does not need.
    const failed = this.authenticationFailed(code, notAllowedHere, input.clientIp, now);
    if (failed !== undefined) await failed;

    // The response waits for its ledger row: nothing charged goes unrecorded. A replay is charged nothing (its row says uncharged).
    const charge = replayOf !== undefined && errorCodeInfo(code).charge === "charged" ? "uncharged" : errorCodeInfo(code).charge;
    const day = dayOf(now, account?.zone ?? this.options.timeZone);
    try {
      await this.ports.meter.record(
        {
          requestId,
          at: now,
          day,
          account: account?.key,
          operation: operation.id,
          code,
          charge,
          price: charge === "charged" ? (admission?.price ?? 0n) : 0n,
          cacheHit: fromCache,
          upstreamRequests: sent === undefined ? 0 : sent.count,
          latencyMicros: Math.round((performance.now() - started) * 1000),
          transport: input.transport,
          clientIp: input.clientIp,
        },
        admission,
        key,
      );
    } catch (e) {
      // A call that would be charged is not answered unrecorded; a refusal keeps its own code.
      this.ports.log?.error({ err: e, requestId, ...spanLogFields(span) }, "the usage ledger cannot be written");
      if (charge === "charged") {
        code = ErrorCode.SERVER_INTERNAL_ERROR;
        reason =
          e instanceof UnconfirmedCommit
            ? `the usage ledger did not confirm this call's row in time, so its answer was withheld; it is charged only if the ledger lists request id ${requestId}`
            : `the usage ledger cannot be written, so the call was not charged; quote request id ${requestId}`;
        answer = undefined;
      }
    }
    let usage = account === undefined ? undefined : this.usageNow(account, day);
    if (usage instanceof Promise) usage = await usage;
    // Charged as the call ends (a row the ledger could not take made it an uncharged 4000, a replay is not): else its day's place went back.
    const charged = replayOf === undefined && errorCodeInfo(code).charge === "charged";
    const quota = account === undefined ? undefined : quotaStanding(account, { admission, refusedBy, usage, charged, dayEndsInMs: this.dayEndsAt(day, account.zone) - now });

    if (input.logFields !== undefined) input.logFields.errorCode = fourDigits(code);
    const status = this.statusBlock(code, reason, now, requestId, operation.catalogue, input.clientIp);
    if (account !== undefined && usage !== undefined) status.apiInfo = apiInfoText(account, usage);
    status.callArgs = echoArgs(operation, input.args);
    // The text is in the target language unless its translation failed (then it stays Chinese).
    if (options.lang !== "cn") status.translateLanguage = options.lang;
    if (translation !== undefined) {
      status.translateEngine = translation.engine;
      status.translateStatus = translation.status;
      status.translateTime = translation.seconds;
    }
    const translated = translation !== undefined && translation.status !== "error";
    status.language = create(LanguageInfoSchema, { currentLang: translated ? options.lang : "cn", sourceLang: "cn" });
    status.executionTime = (performance.now() - started) / 1000;

    status.cache = fromCache;
    this.telemetry.callFinished(operation.id, code, input.transport, status.executionTime);
    if (span !== undefined) endCallSpan(span, operation, input, { code, charged, fromCache, requestId, replayOf, reason });
    if (answer === undefined || !answer.found) {
      const unauthenticated = code === ErrorCode.MISSING_URL_PARAM && account === undefined;
      if (unauthenticated) this.telemetry.authFailed("missing_key");
      return { kind: "error", operation, status, unauthenticated, refusedBy, quota, replayOf };
    }
    status.ddf = this.ports.catalogue.source(operation)!.label;
    status.secache = answer.token;
    status.secacheTime = BigInt(answer.storedAt);
    status.secacheDate = formatDateTime(answer.storedAt * 1000, this.options.timeZone);
    status.lastId = operation.lastId(answer.value);
    return { kind: "success", operation, status, item: answer.value, memo, quota, replayOf };
  }

  /**
   * Who a caller is, for a read of its own account (the AccountService):
   * its credentials checked as a call's are, with the lockout of its
   * address before them and the addresses its account lists after them, and
   * a failure counted against the address as a call's is. A stopped or
   * expired account is still its own to read. Nothing is charged, counted
   * against the plan's limits or written to the ledger; the reads have a
   * bound of their own (own-reads.ts).
   */
  async identifyCaller(input: CallerInput): Promise<CallerIdentity> {
    const now = this.options.clock.now();
    const requestId = input.requestId ?? this.nextRequestId();
    let account: Account | undefined;
    try {
      const locked = this.lockedOut(input.clientIp, now);
      if (locked instanceof Promise) await locked;
      const identified = this.authenticator.identify(undefined, input.credentials, now);
      account = identified instanceof Promise ? await identified : identified;
      if (!addressAllowed(account.allowedFrom, input.clientIp)) throw new AddressNotAllowed(input.clientIp);
      this.ownReads.take(account.key, now);
      return { kind: "account", account, requestId, now, logFields: input.logFields };
    } catch (e) {
      const { code, reason } = this.failureOf(e, requestId, "reading the caller's account failed inside the gateway");
      if (input.logFields !== undefined) input.logFields.errorCode = fourDigits(code);
      await this.authenticationFailed(code, e instanceof AddressNotAllowed, input.clientIp, now);
      const unauthenticated = code === ErrorCode.MISSING_URL_PARAM && account === undefined;
      if (unauthenticated) this.telemetry.authFailed("missing_key");
      const status = this.statusBlock(code, reason, now, requestId, "account", input.clientIp);
      return { kind: "refused", status, unauthenticated, refusedBy: e instanceof GatewayError ? this.refusalOf(e, account, now) : undefined };
    }
  }

  /** The status block of a read of its own account that asks for what cannot be (a day out of form): a refusal as a call's. */
  ownRefusal(code: ErrorCode, reason: string, identity: { readonly requestId: string; readonly now: number; readonly logFields: CallLogFields | undefined }, clientIp: string): StatusBlock {
    if (identity.logFields !== undefined) identity.logFields.errorCode = fourDigits(code);
    return this.statusBlock(code, reason, identity.now, identity.requestId, "account", clientIp);
  }

  /**
   * Where a caller's own account stands now (the AccountService): its day,
   * the day's counts, its balance and what its rate admits at once, read
   * from the store now (exact across replicas).
   */
  async ownStanding(
    account: Account,
    now: number,
  ): Promise<{ readonly day: string; readonly usage: UsageSummary; readonly balance: Micros | undefined; readonly rate: { readonly left: number; readonly resetMs: number } | undefined }> {
    const day = dayOf(now, account.zone);
    const meter = this.ports.meter;
    const [usage, balance, arrival] = await Promise.all([meter.usage(account.key, day, previousDay(day), true), meter.balance(account.key), account.rate === undefined ? undefined : meter.rateArrival(account.key)]);
    const rate = account.rate === undefined ? undefined : arrival === undefined ? { left: account.rate.burst, resetMs: 0 } : rateStanding(arrival, now, account.rate);
    return { day, usage, balance, rate };
  }

  /** A caller's own usage alerts, newest first (the AccountService); none where the gateway keeps none. */
  async ownAlerts(account: Account, limit: number): Promise<AlertRecord[]> {
    return (await this.ports.alerts?.recent(account.key, limit)) ?? [];
  }

  /**
   * The ledger's totals of a caller's own calls (the AccountService), whole
   * or a page at a time (usage-pages.ts): narrowed to its account whatever
   * else is asked, and no rows.
   */
  ownUsage(account: Account, query: Pick<UsageQuery, "from" | "to" | "operation" | "byAddress">, page: { readonly pageSize: number; readonly pageToken: string }): Promise<TotalsPage> {
    return totalsPage(this.ports.meter, { filter: { from: query.from, to: query.to, operation: query.operation, byAddress: query.byAddress, account: account.key }, ...page });
  }

  /** A caller's own balance accounted for (the AccountService), read from the store as one moment left it. */
  async ownStatement(account: Account): Promise<BalanceAccounting & { readonly balance: Micros | undefined }> {
    const record = await this.ports.meter.balanceRecord(account.key);
    return { balance: record.balance, ...balanceAccounting(record) };
  }

  /** A page of a caller's own calls (the AccountService): narrowed to its account whatever else is asked (usage-pages.ts). */
  ownCalls(account: Account, filter: Pick<UsageQuery, "from" | "to" | "operation" | "code" | "requestId">, page: { readonly pageSize: number; readonly pageToken: string }): Promise<CallPage> {
    return callPage(this.ports.meter, { filter: { from: filter.from, to: filter.to, operation: filter.operation, code: filter.code, requestId: filter.requestId, account: account.key }, ...page });
  }

  /** A caller's own calls in commit order from its cursor (the AccountService): the ledger's feed narrowed to its account (usage-pages.ts). */
  ownFeed(account: Account, page: { readonly cursor: string; readonly fromNow?: boolean; readonly pageSize: number }): Promise<FeedPage> {
    return followCalls(this.ports.meter, { cursor: page.cursor, fromNow: page.fromNow, pageSize: page.pageSize, account: account.key });
  }

  /** Refuses (4008) a caller whose address is locked out for failed authentications, and counts it; at once where the lockout answers at once. */
  private lockedOut(clientIp: string, now: number): MaybeAsync<void> {
    const counted = (e: unknown): never => {
      this.telemetry.authFailed("address_locked");
      throw e;
    };
    try {
      const locked = this.lockout.check(clientIp, now);
      return locked instanceof Promise ? locked.catch(counted) : locked;
    } catch (e) {
      return counted(e);
    }
  }

  /**
   * What a caller is told of a step that threw: a GatewayError's code and
   * words (a 4000 logged with its cause), anything else an internal error,
   * logged as `what`, that the caller is asked to quote.
   */
  private failureOf(e: unknown, requestId: string, what: string, span?: ActiveSpan): { readonly code: ErrorCode; readonly reason: string } {
    if (e instanceof GatewayError) {
      if (e.code === ErrorCode.SERVER_INTERNAL_ERROR) this.ports.log?.error({ err: e.cause ?? e, requestId, ...spanLogFields(span) }, e.message);
      return { code: e.code, reason: e.message };
    }
    this.ports.log?.error({ err: e, requestId, ...spanLogFields(span) }, what);
    return { code: ErrorCode.SERVER_INTERNAL_ERROR, reason: `internal error; quote request id ${requestId}` };
  }

  /** A refusal's limit and, in whole ms (at least 1), when it admits a call again, where that is known. */
  private refusalOf(e: GatewayError, account: Account | undefined, now: number): LimitRefusal | undefined {
    if (e.limit === undefined) return undefined;
    // The daily maximum admits again when the account's day ends, which only the core knows (it names the day).
    // Whole ms, at least 1, here once: every transport says it as it is.
    const wait = e.limit === "daily_max" && account !== undefined ? this.dayEndsAt(dayOf(now, account.zone), account.zone) - now : e.retryAfterMs;
    return { limit: e.limit, retryAfterMs: wait === undefined ? undefined : Math.max(1, Math.ceil(wait)) };
  }

  /**
   * A failed authentication counts against the caller's address, and is
   * answered more slowly as they pile up: the wait, or undefined for
   * anything else.
   */
  private authenticationFailed(code: ErrorCode, notAllowedHere: boolean, clientIp: string, now: number): Promise<void> | undefined {
    if (code !== ErrorCode.ACCOUNT_NOT_FOUND && code !== ErrorCode.INVALID_CREDENTIALS) return undefined;
    this.telemetry.authFailed(code === ErrorCode.ACCOUNT_NOT_FOUND ? "unknown_key" : notAllowedHere ? "address_not_allowed" : "bad_credentials");
    return this.lockout.failed(clientIp, now).then(
      (hold) => (hold > 0 ? new Promise<void>((r) => setTimeout(r, hold)) : undefined),
      () => undefined,
    );
  }

  /**
   * The answer to a request that reached no operation: a path that names
   * none (4010), or a request the HTTP layer could not read (4003). Nothing
   * is charged; there is no account to charge.
   */
  async refuse(code: ErrorCode, apiType: string, reason: string, input: Pick<CallInput, "clientIp" | "transport" | "requestId" | "logFields">, cause?: unknown): Promise<Outcome> {
    this.began(input.logFields);
    try {
      return await this.refusal(code, apiType, reason, input, cause);
    } finally {
      this.ended(input.logFields);
    }
  }

  private async refusal(code: ErrorCode, apiType: string, reason: string, input: Pick<CallInput, "clientIp" | "transport" | "requestId" | "logFields">, cause?: unknown): Promise<Outcome> {
    const started = performance.now();
    const now = this.options.clock.now();
    const requestId = input.requestId ?? this.nextRequestId();
    if (input.logFields !== undefined) input.logFields.errorCode = fourDigits(code);
    if (code === ErrorCode.SERVER_INTERNAL_ERROR) this.ports.log?.error({ err: cause, requestId }, reason);
    const status = this.statusBlock(code, reason, now, requestId, apiType, input.clientIp);
    await this.ports.meter.record(
      {
        requestId,
        at: now,
        day: dayOf(now, this.options.timeZone),
        account: undefined,
        operation: undefined,
        code,
        charge: errorCodeInfo(code).charge,
        price: 0n,
        cacheHit: false,
        upstreamRequests: 0,
        latencyMicros: Math.round((performance.now() - started) * 1000),
        transport: input.transport,
        clientIp: input.clientIp,
      },
      undefined,
    );
    status.executionTime = (performance.now() - started) / 1000;
    // Counted once recorded: a refusal is never in flight for long, and one that cannot be recorded throws before it.
    this.telemetry.callStarted();
    this.telemetry.callFinished("", code, input.transport, status.executionTime);
    return { kind: "error", operation: undefined, status };
  }

  /** The fields every status block has, whatever the outcome. */
  private statusBlock(code: ErrorCode, reason: string, now: number, requestId: string, apiType: string, clientIp: string): StatusBlock {
    const status = newStatusBlock();
    status.error = errorCodeInfo(code).label;
    status.reason = reason;
    status.errorCode = code;
    status.serverTime = `${this.options.zoneLabel}/${formatDateTime(now, this.options.timeZone)}`;
    status.apiType = apiType;
    status.requestId = requestId;
    status.translateLanguage = "zh-CN";
    status.serverMemory = this.serverMemory(now);
    status.clientIp = clientIp;
    if (code !== ErrorCode.SUCCESS) status.success = 0;
    return status;
  }

  /** The account's counters for `api_info`, as the meter has them now, at once where it answers at once (MaybeAsync); undefined where they cannot be read. */
  private usageNow(account: Account, today: string): MaybeAsync<UsageSummary | undefined> {
    // The call is answered and recorded; only its counters cannot be read back now.
    const unread = (e: unknown): undefined => {
      this.ports.log?.error({ err: e }, "the account's usage cannot be read for api_info");
      return undefined;
    };
    try {
      const usage = this.ports.meter.usage(account.key, today, previousDay(today));
      return usage instanceof Promise ? usage.catch(unread) : usage;
    } catch (e) {
      return unread(e);
    }
  }

  /** When a day ends in a zone (Unix ms): worked out once per zone and day, not a call. */
  private dayEndsAt(day: string, zone: string): number {
    const known = this.dayEnds.get(zone);
    if (known !== undefined && known.day === day) return known.at;
    const at = nextDayStarts(day, zone);
    this.dayEnds.set(zone, { day, at });
    return at;
  }

  /** Heap in use, sampled at most every 100 ms: reading it is not free. */
  private serverMemory(now: number): string {
    if (now - this.memory.at >= 100 || now < this.memory.at) {
      this.memory = { at: now, text: `${(process.memoryUsage().heapUsed / 1048576).toFixed(2)}MB` };
    }
    return this.memory.text;
  }
}

/** A call's span name: its legacy route, or its RPC's full method name (OpenTelemetry's HTTP and RPC conventions). */
function spanName(operation: Operation, transport: Transport): string {
  return transport === "legacy" ? operation.path : `${operation.service.typeName}/${operation.method.name}`;
}

const rpcSystem: Record<Transport, string | undefined> = { legacy: undefined, connect: "connect_rpc", grpc: "grpc", "grpc-web": "grpc" };

/**
 * Ends a call's span with what became of it: its code and billing, the
 * cache, its request id and the caller's address (never its key or
 * secret), and the RPC or route it came by. A fault of the gateway or its
 * source (an uncharged code) is the span's error; a refusal of the
 * caller's request is not.
 */
function endCallSpan(
  span: ActiveSpan,
  operation: Operation,
  input: CallInput,
  call: { readonly code: ErrorCode; readonly charged: boolean; readonly fromCache: boolean; readonly requestId: string; readonly replayOf: string | undefined; readonly reason: string },
): void {
  const billing = errorCodeInfo(call.code).charge;
  const attributes: SpanAttributes = {
    "gateway.operation": operation.id,
    "gateway.transport": input.transport,
    "gateway.error_code": fourDigits(call.code),
    "gateway.charge": call.charged ? "charged" : billing === "charged" ? "uncharged" : billing,
    "gateway.cache_hit": call.fromCache,
    "gateway.request_id": call.requestId,
    "client.address": input.clientIp,
  };
  if (call.replayOf !== undefined) attributes["gateway.replay_of"] = call.replayOf;
  const system = rpcSystem[input.transport];
  if (system === undefined) attributes["http.route"] = operation.path;
  else Object.assign(attributes, { "rpc.system": system, "rpc.service": operation.service.typeName, "rpc.method": operation.method.name });
  span.end(attributes, billing === "uncharged" ? call.reason : undefined);
}

/** `api_info`: the day's count and maximum, the charged calls of every day, and the key's expiry. */
function apiInfoText(account: Account, u: UsageSummary): string {
  const all = u.today + u.yesterday + u.before;
  return `today:${u.today} max:${account.dailyMax} all[${all}=${u.today}+${u.yesterday}+${u.before}];expires:${account.expires}`;
}

function checkArgs(operation: Operation, given: Readonly<Record<string, string | undefined>>): Args {
  for (const arg of operation.args) {
    if (arg.required && (given[arg.name] ?? "") === "") {
      throw new GatewayError(ErrorCode.MISSING_URL_PARAM, `missing url param: ${arg.name}`);
    }
  }
  const args: Record<string, string> = {};
  for (const arg of operation.args) {
    const value = given[arg.name] ?? "";
    const accepts = arg.accepts;
    const ok = value.length <= arg.maxLength && (typeof accepts === "string" ? argForms[accepts].test(value) : accepts.includes(value));
    if (!ok) {
      const accepted =
        typeof accepts === "string" ? `${argFormText[accepts]}, at most ${arg.maxLength} characters` : `one of ${accepts.map((v) => `"${v}"`).join(", ")}`;
      throw new GatewayError(ErrorCode.PARAM_ERROR, `${arg.name} must be ${accepted}`);
    }
    args[arg.name] = value;
  }
  return args;
}

function checkOptions(input: CallInput): CallOptions {
  const cache = input.cache === undefined || input.cache === "" ? "yes" : input.cache;
  if (cache !== "yes" && cache !== "no") throw new GatewayError(ErrorCode.PARAM_ERROR, "cache must be yes or no");
  const lang = input.lang === undefined || input.lang === "" ? "cn" : input.lang;
  if (lang !== "cn" && lang !== "en" && lang !== "ru") throw new GatewayError(ErrorCode.PARAM_ERROR, "lang must be cn, en or ru");
  return { useCache: cache === "yes", lang };
}

/** `call_args`: the operation's own arguments that the caller sent, in the operation's order. */
function echoArgs(operation: Operation, given: Readonly<Record<string, string | undefined>>): Record<string, string> {
  const echo: Record<string, string> = {};
  for (const arg of operation.args) {
    const value = given[arg.name];
    if (value !== undefined) echo[arg.name] = value;
  }
  return echo;
}
