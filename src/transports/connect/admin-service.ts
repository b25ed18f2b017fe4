import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, createContextKey, type ConnectRouter, type HandlerContext, type Interceptor } from "@connectrpc/connect";
import type { AdminTokens } from "../../core/admin-tokens.ts";
import { isCalendarDay } from "../../core/clock.ts";
import { createHash, timingSafeEqual } from "node:crypto";
import { setTimeout as sleep } from "node:timers/promises";
import type { OperationId } from "../../contract/operations.ts";
import { balanceChangeFields, callFields, usageTotalFields } from "./usage-fields.ts";
import { AccountAdminError, AccountExistsError, AccountNotFoundError, usageAddress, type AccountAdmin, type AccountEvent } from "../../core/account-admin.ts";
import { AccountListingTooLarge, AccountPageError } from "../../core/account-pages.ts";
import { callPage, followCalls, UsagePageError, totalsPage } from "../../core/usage-pages.ts";
import { CommitBell } from "../../core/commit-bell.ts";
import type { Account } from "../../core/accounts.ts";
import { keptUntil } from "../../core/secret-grace.ts";
import type { AddressLockout } from "../../core/address-lockout.ts";
import { noTelemetry, type Telemetry } from "../../core/telemetry.ts";
import { callerEndedKey, clientIpKey } from "./context.ts";
import { knownJsonOnly, refuseUnknownFields } from "./known-fields.ts";
import { GatewayError } from "../../core/gateway-error.ts";
import { refusalError, rpcTransportOf } from "./status-error.ts";
import type { LedgerRow, Meter, UsageQuery, UsageTotal } from "../../core/meter.ts";
import type { ErrorCode } from "../../gen/gateway/catalogue/v1/status_pb.js";
import type { OperatorSwitches } from "../../core/operator-switches.ts";
import { formatMoney, MoneyError, parseMoney } from "../../core/money.ts";
import {
  AccountEventKind,
  AccountEventSchema,
  AccountSchema,
  AccountStatus,
  AdminService,
  BalanceChangeKind,
  BalanceChangeSchema,
  AllowedFromSchema,
  CallRateSchema,
  MaintenanceChangeSchema,
  OperationState,
  UsageRowSchema,
  UsageTotalSchema,
  AlertSchema,
  AlertsSchema,
  type Account as AccountMessage,
  type Alert as AlertMessage,
  type CallRate as CallRateMessage,
} from "../../gen/gateway/admin/v1/admin_pb.js";
import type { CallRate } from "../../core/call-rate.ts";
import type { AlertOutbox, AlertPost, AlertRecord } from "../../core/alerts.ts";
import { alertFields, alertLineFields } from "./alert-fields.ts";
import type { CachedCatalogue } from "../../core/cached-catalogue.ts";
import { operationById, operations } from "../../operations/index.ts";
import type { ConnectionCounts } from "../server/one-port-server.ts";
import type { OpenFilesFit } from "../../open-files.ts";

const states = { enabled: OperationState.ENABLED, stopped: OperationState.STOPPED } as const;
const changeKinds = { opening: BalanceChangeKind.OPENING, "top-up": BalanceChangeKind.TOP_UP, carried: BalanceChangeKind.CARRIED, unbilled: BalanceChangeKind.UNBILLED } as const;
const eventKinds: Record<AccountEvent["kind"], AccountEventKind> = {
  created: AccountEventKind.CREATED,
  status: AccountEventKind.STATUS,
  plan: AccountEventKind.PLAN,
  operation: AccountEventKind.OPERATION,
  price: AccountEventKind.PRICE,
  secret: AccountEventKind.SECRET,
  alerts: AccountEventKind.ALERTS,
  opening: AccountEventKind.OPENING,
  "top-up": AccountEventKind.TOP_UP,
  carried: AccountEventKind.CARRIED,
  unbilled: AccountEventKind.UNBILLED,
};

/** `old_secret_until_ms` where a replaced secret still works. */
function untilMs(until: number | undefined): { oldSecretUntilMs?: bigint } {
  return until === undefined ? {} : { oldSecretUntilMs: BigInt(until) };
}

function accountMessage(a: Account): AccountMessage {
  return create(AccountSchema, {
    key: a.key,
    name: a.name,
    status: a.status === "active" ? AccountStatus.ACTIVE : AccountStatus.STOPPED,
    operations: Object.fromEntries([...a.operations].map(([op, state]) => [op, states[state]])),
    dailyMax: BigInt(a.dailyMax),
    concurrency: a.concurrency,
    ...(a.balance !== undefined ? { balance: formatMoney(a.balance) } : {}),
    prices: Object.fromEntries([...a.prices].map(([op, price]) => [op, formatMoney(price)])),
    expires: a.expires,
    zone: a.zone,
    createdAtMs: BigInt(a.createdAt),
    externalId: a.externalId ?? "",
    ...untilMs(keptUntil(a.previousSecrets, Date.now())),
    ...(a.rate !== undefined ? { rate: create(CallRateSchema, a.rate) } : {}),
    ...(a.allowedFrom !== undefined ? { allowedFrom: create(AllowedFromSchema, { addresses: [...a.allowedFrom] }) } : {}),
    ...(a.alerts !== undefined
      ? {
          alerts: create(AlertsSchema, {
            url: a.alerts.url,
            ...alertLineFields(a.alerts),
            ...untilMs(keptUntil(a.previousAlertSecrets, Date.now())),
          }),
        }
      : {}),
  });
}

function alertMessage(a: AlertRecord): AlertMessage {
  return create(AlertSchema, {
    ...alertFields(a),
    day: a.day,
    ...(a.kind === "usage"
      ? { percent: Number(a.level), calls: a.value, dailyMax: a.limit }
      : a.kind === "balance"
        ? { balance: formatMoney(a.value), below: formatMoney(a.level) }
        : { daysLeft: Number(a.value) }),
  });
}

/** A request's rate: unset, none (`calls` 0, where `none` may be asked for), or a rate whose burst 0 means `calls` (AccountAdmin checks it). */
function rateOf(message: CallRateMessage | undefined, none: boolean): CallRate | null | undefined {
  if (message === undefined) return undefined;
  if (message.calls === 0 && none) return null;
  return { calls: message.calls, seconds: message.seconds, burst: message.burst === 0 ? message.calls : message.burst };
}

function totalMessage(t: UsageTotal) {
  return create(UsageTotalSchema, { account: t.account ?? "", ...usageTotalFields(t), upstreamRequests: BigInt(t.upstreamRequests) });
}

function rowMessage(r: LedgerRow) {
  return create(UsageRowSchema, { account: r.account ?? "", ...callFields(r), upstreamRequests: r.upstreamRequests });
}

function digest(s: string): Buffer {
  return createHash("sha256").update(s).digest();
}

/** The named admin whose token a call carries; empty for GATEWAY_ADMIN_TOKEN's. */
const adminNameKey = createContextKey<string>("", { description: "the named admin making the call" });

const offMessage = "the admin API is off: set GATEWAY_ADMIN_TOKEN, or add an admin (gateway admins add NAME)";

/**
 * Only `authorization: Bearer <admin token>` passes: GATEWAY_ADMIN_TOKEN,
 * compared in constant time (as digests, so its length does not show), or
 * the token of a named admin that is not revoked, looked up by its SHA-256.
 * With neither the admin API is off. Wrong tokens count against the
 * caller's address as failed account credentials do: slowed, then refused
 * for a while. The named admin's name goes into the call's context, for the
 * record of what it changes.
 */
export function requireAdminToken(token: string, lockout: AddressLockout, telemetry: Telemetry = noTelemetry, admins?: AdminTokens): Interceptor {
  const expected = digest(token);
  return (next) => async (req) => {
    if (token === "" && (admins === undefined || !(await admins.any()))) throw new ConnectError(offMessage, Code.Unauthenticated);
    const ip = req.contextValues.get(clientIpKey);
    try {
      await lockout.check(ip, Date.now());
    } catch (e) {
      // Locked out (4008): when it ends, as a catalogue call is told; else the lockout's store cannot be read.
      const locked = e instanceof GatewayError && e.limit === "address_locked";
      throw refusalError((e as Error).message, locked ? Code.ResourceExhausted : Code.Unavailable, locked ? { limit: e.limit!, retryAfterMs: e.retryAfterMs } : undefined, rpcTransportOf(req.header.get("content-type")));
    }
    const presented = /^Bearer (.+)$/.exec(req.header.get("authorization") ?? "")?.[1];
    if (presented === undefined) {
      telemetry.authFailed("admin_token");
      throw new ConnectError("send authorization: Bearer <admin token>", Code.Unauthenticated);
    }
    let name: string | undefined = token !== "" && timingSafeEqual(digest(presented), expected) ? "" : undefined;
    let refusal = "the admin token is not valid";
    if (name === undefined && admins !== undefined) {
      const identified = admins.identify(presented);
      const admin = identified instanceof Promise ? await identified : identified;
      if (admin !== undefined && admin.revokedAt === undefined) name = admin.name;
      else if (admin !== undefined) refusal = `the admin token of ${admin.name} was revoked`;
    }
    if (name === undefined) {
      telemetry.authFailed("admin_token");
      const hold = await lockout.failed(ip, Date.now()).catch(() => 0);
      if (hold > 0) await new Promise((r) => setTimeout(r, hold));
      throw new ConnectError(refusal, Code.Unauthenticated);
    }
    req.contextValues.set(adminNameKey, name);
    return next(req);
  };
}

/** An operator mistake as an RPC error; anything else is passed on as internal. */
function adminError(e: unknown): never {
  if (e instanceof AccountNotFoundError) throw new ConnectError(e.message, Code.NotFound);
  if (e instanceof AccountExistsError) throw new ConnectError(e.message, Code.AlreadyExists);
  if (e instanceof UsagePageError && e.of === "folded") throw new ConnectError(e.message, Code.OutOfRange);
  if ((e instanceof UsagePageError && e.of === "large") || e instanceof AccountListingTooLarge) throw new ConnectError(e.message, Code.ResourceExhausted);
  if (e instanceof AccountAdminError || e instanceof MoneyError || e instanceof AccountPageError || e instanceof UsagePageError) throw new ConnectError(e.message, Code.InvalidArgument);
  throw e;
}

function guarded<Req, R>(f: (req: Req, ctx: HandlerContext) => R | Promise<R>): (req: Req, ctx: HandlerContext) => Promise<R> {
  return async (req, ctx) => {
    try {
      return await f(req, ctx);
    } catch (e) {
      return adminError(e);
    }
  };
}

export interface AdminPorts {
  readonly admin: AccountAdmin;
  /** Named admins, whose tokens the service takes besides GATEWAY_ADMIN_TOKEN. */
  readonly admins?: AdminTokens | undefined;
  readonly meter: Meter;
  readonly switches: OperatorSwitches;
  /** Where the accounts' usage alerts are kept (ListAlerts). */
  readonly alerts: AlertOutbox;
  /** What sends a test alert (TestAlerts). */
  readonly alertSender: AlertPost;
  /** Rung after each of this process's ledger commits: WatchCalls reads on at once (without it, on its poll alone). */
  readonly ledgerCommits?: CommitBell | undefined;
  /** A draining server ends its WatchCalls streams once they are caught up (its `drainSignal` wakes them when it starts). */
  readonly readiness?: { readonly draining: boolean; readonly drainSignal?: AbortSignal } | undefined;
  /** The cache in front of the sources, which PurgeCache drops answers from (none: nothing is cached). */
  readonly answers?: Pick<CachedCatalogue, "purge"> | undefined;
  /** Told of each purge, for the log: who made it, of what, and how many entries went. */
  readonly onPurge?: ((purge: { readonly by: string; readonly operation: string; readonly numIid: string; readonly entries: number }) => void) | undefined;
}

export interface AdminRouteOptions {
  /** The bearer token; empty turns the admin API off. */
  readonly token: string;
  readonly lockout: AddressLockout;
  /** Run before the token check (a service's interceptors replace the router's). */
  readonly interceptors?: readonly Interceptor[];
  /** Where failed admin tokens are counted. */
  readonly telemetry?: Telemetry;
  /** How long a WatchCalls stream goes without a message while no call commits (default 15 s). */
  readonly watchHeartbeatMs?: number;
  /** The replica's label (GATEWAY_NODE_ID), which GetConnections names. */
  readonly node?: string;
  /** The server's connections and caps, which GetConnections reports (none: it answers unimplemented). */
  readonly connections?: ServerConnections | undefined;
}

/** The server's connection counts and the caps they are held to, as AdminService.GetConnections reports them. */
export interface ServerConnections {
  readonly counts: ConnectionCounts;
  readonly maxConnections: number;
  readonly maxConnectionsPerAddress: number;
  /** The open-files limit, and GATEWAY_MAX_CONNECTIONS as set when serve lowered it to fit (open-files.ts). */
  readonly openFiles?: OpenFilesFit | undefined;
}

/** The most addresses GetConnections lists at once, and how many when the request does not say. */
const mostHolders = 1000;
const defaultHolders = 10;

/** How often a caught-up WatchCalls stream reads the ledger again for calls committed by other replicas. */
const watchPollMs = 250;

/**
 * The least time between two reads of a caught-up WatchCalls stream: a
 * busy replica commits thousands of times a second, and a stream that read
 * at each ring (one of an account that makes few calls, most reads finding
 * none) cost each call of every account a read. Calls committed meanwhile
 * come together in the next read, at most this much later.
 */
const watchReadGapMs = 25;

/** The AdminService over the same core the CLI uses. */
export function adminRoutes(ports: AdminPorts, options: AdminRouteOptions): (router: ConnectRouter) => void {
  const { meter, switches } = ports;
  // Changes are recorded as made by the admin API's caller: the named admin whose token it sent, and its address.
  const actor = (ctx: HandlerContext) => {
    const name = ctx.values.get(adminNameKey);
    return `admin-api ${name === "" ? "" : `${name}@`}${ctx.values.get(clientIpKey)}`;
  };
  const by = (ctx: HandlerContext) => ports.admin.as(actor(ctx));
  const admin = ports.admin;
  const money = (text: string | undefined) => (text === undefined || text === "" ? undefined : parseMoney(text));
  const priceMap = (prices: Record<string, string>) => new Map(Object.entries(prices).map(([op, p]) => [admin.operation(op), parseMoney(p)]));
  /** The ledger filter QueryUsage and ListCalls share, under their common field names. */
  const usageFilter = (req: { account: string; from: string; to: string; operation: string; errorCode?: ErrorCode | undefined; clientIp: string; requestId: string }): UsageQuery => {
    for (const [name, value] of [["from", req.from], ["to", req.to]] as const) {
      if (value !== "" && !isCalendarDay(value)) throw new AccountAdminError(`${name}: a day is YYYY-MM-DD, not ${JSON.stringify(value.slice(0, 32))}`);
    }
    return {
      account: req.account || undefined,
      from: req.from || undefined,
      to: req.to || undefined,
      operation: req.operation ? admin.operation(req.operation) : undefined,
      code: req.errorCode,
      address: req.clientIp ? usageAddress(req.clientIp) : undefined,
      requestId: req.requestId || undefined,
    };
  };

  /** The account a follower of the ledger asked for (FollowCalls, WatchCalls), one the gateway has (else not_found): undefined for every account. */
  const followedAccount = async (key: string): Promise<string | undefined> => (key === "" ? undefined : (await admin.get(key)).key);

  return (router) =>
    router.service(
      AdminService,
      {
        createAccount: guarded(async (req, ctx) => {
          const { account, secret, repeated } = await by(ctx).create({
            name: req.name,
            ...(req.externalId !== "" ? { externalId: req.externalId } : {}),
            ...(req.dailyMax !== undefined ? { dailyMax: Number(req.dailyMax) } : {}),
            ...(req.concurrency !== undefined ? { concurrency: req.concurrency } : {}),
            balance: money(req.balance),
            expires: req.expires,
            ...(req.zone !== "" ? { zone: req.zone } : {}),
            ...(req.operations.length > 0 ? { operations: req.operations.map((op) => admin.operation(op)) } : {}),
            prices: priceMap(req.prices),
            rate: rateOf(req.rate, false) ?? undefined,
            ...(req.allowedFrom !== undefined && req.allowedFrom.addresses.length > 0 ? { allowedFrom: req.allowedFrom.addresses } : {}),
          });
          return { account: accountMessage(account), secret, repeated };
        }),
        whoAmI: guarded((_req, ctx) => ({ name: ctx.values.get(adminNameKey), actor: actor(ctx), address: ctx.values.get(clientIpKey) })),
        purgeCache: guarded(async (req, ctx) => {
          if (req.operation === "" && req.numIid === "" && !req.everything) {
            throw new AccountAdminError("name an operation or an item (num_iid) to purge, or set everything to drop the whole cache");
          }
          if (req.numIid !== "" && !/^[0-9]{1,20}$/.test(req.numIid)) throw new AccountAdminError("num_iid is digits only, at most 20");
          const chosen = req.operation === "" ? operations : [operationById.get(admin.operation(req.operation))!];
          let entries: number;
          try {
            entries = (await ports.answers?.purge(chosen, req.numIid === "" ? undefined : req.numIid)) ?? 0;
          } catch (e) {
            if (e instanceof GatewayError) throw new ConnectError(e.message, Code.Unavailable);
            throw e;
          }
          ports.onPurge?.({ by: actor(ctx), operation: req.operation, numIid: req.numIid, entries });
          return { entries: BigInt(entries) };
        }),
        getConnections: guarded(async (req) => {
          const server = options.connections;
          if (server === undefined) throw new ConnectError("this server does not count its connections", Code.Unimplemented);
          if (req.top < 0 || req.top > mostHolders) throw new AccountAdminError(`top is 1 to ${mostHolders}, or 0 for ${defaultHolders}; not ${req.top}`);
          const { counts } = server;
          const open = await counts.open();
          if (!Number.isFinite(open)) throw new ConnectError("the server could not count its connections; ask again", Code.Unavailable);
          return {
            node: options.node ?? "",
            open: BigInt(open),
            http2Sessions: BigInt(counts.http2Sessions()),
            http2Streams: BigInt(counts.http2Streams()),
            maxConnections: BigInt(server.maxConnections),
            maxConnectionsPerAddress: BigInt(server.maxConnectionsPerAddress),
            addresses: BigInt(counts.addresses()),
            holders: counts.holders(req.top || defaultHolders).map((h) => ({ address: h.address, connections: BigInt(h.connections), trustedProxy: h.uncapped })),
            refused: { connections: BigInt(counts.refused.connection), perAddress: BigInt(counts.refused.address), streams: BigInt(counts.refused.stream) },
            openFilesLimit: BigInt(server.openFiles?.limit ?? 0),
            maxConnectionsSet: BigInt(server.openFiles?.maxConnectionsSet ?? 0),
          };
        }),
        listAccounts: guarded(async (req) => {
          const status = req.status === AccountStatus.ACTIVE ? "active" : req.status === AccountStatus.STOPPED ? "stopped" : undefined;
          if (status === undefined && req.status !== AccountStatus.UNSPECIFIED) throw new AccountPageError(`status ${req.status} is not ACTIVE, STOPPED or unspecified`);
          const page = await admin.page({ query: req.query, status, pageSize: req.pageSize, pageToken: req.pageToken });
          return { accounts: page.accounts.map(accountMessage), nextPageToken: page.nextPageToken, totalSize: page.totalSize };
        }),
        getAccount: guarded(async (req) => {
          if (req.key !== "" && req.externalId !== "") throw new AccountAdminError("ask for an account by its key or by its external id, not both");
          return { account: accountMessage(req.externalId !== "" ? await admin.byExternalId(req.externalId) : await admin.get(req.key)) };
        }),
        stopAccount: guarded(async (req, ctx) => ({ account: accountMessage(await by(ctx).setStatus(req.key, "stopped")) })),
        resumeAccount: guarded(async (req, ctx) => ({ account: accountMessage(await by(ctx).setStatus(req.key, "active")) })),
        setPlan: guarded(async (req, ctx) => ({
          account: accountMessage(
            await by(ctx).setPlan(req.key, {
              ...(req.dailyMax !== undefined ? { dailyMax: Number(req.dailyMax) } : {}),
              ...(req.concurrency !== undefined ? { concurrency: req.concurrency } : {}),
              ...(req.expires !== undefined ? { expires: req.expires } : {}),
              ...(req.zone !== undefined ? { zone: req.zone } : {}),
              ...(req.rate !== undefined ? { rate: rateOf(req.rate, true)! } : {}),
              ...(req.allowedFrom !== undefined ? { allowedFrom: req.allowedFrom.addresses.length > 0 ? req.allowedFrom.addresses : null } : {}),
              ...(req.burst !== undefined ? { burst: req.burst } : {}),
            }),
          ),
        })),
        setOperation: guarded(async (req, ctx) => {
          const named: Partial<Record<OperationState, "enabled" | "stopped" | "removed">> = {
            [OperationState.ENABLED]: "enabled",
            [OperationState.STOPPED]: "stopped",
            [OperationState.REMOVED]: "removed",
          };
          const state = named[req.state];
          if (state === undefined) throw new AccountAdminError("state must be ENABLED, STOPPED or REMOVED");
          return { account: accountMessage(await by(ctx).setOperation(req.key, req.operation, state)) };
        }),
        topUp: guarded(async (req, ctx) => {
          const { account, repeated } = await by(ctx).topUp(req.key, parseMoney(req.amount), req.reference === "" ? undefined : req.reference);
          return { account: accountMessage(account), repeated };
        }),
        setPrice: guarded(async (req, ctx) => ({ account: accountMessage(await by(ctx).setPrice(req.key, req.operation, parseMoney(req.price))) })),
        setMaintenance: guarded(async (req, ctx) => {
          await switches.setMaintenance(admin.operation(req.operation) as OperationId, req.maintenance, { at: Date.now(), by: actor(ctx) });
          return { operations: await switches.maintenance() };
        }),
        getMaintenanceHistory: guarded(async () => ({
          changes: (await switches.maintenanceChanges()).map((c) => create(MaintenanceChangeSchema, { atMs: BigInt(c.at), operation: c.operation, maintenance: c.on, by: c.by })),
          operations: await switches.maintenance(),
        })),
        rotateSecret: guarded(async (req, ctx) => {
          const secret = await by(ctx).rotateSecret(req.key, req.keepOldSeconds * 1000);
          return { account: accountMessage(await admin.get(req.key)), secret };
        }),
        signCall: guarded(async (req) => {
          const signed = await admin.signCall(req.key, { method: req.method, path: req.path, params: req.params });
          return { key: req.key, timestamp: BigInt(signed.timestamp), nonce: signed.nonce, signature: signed.signature };
        }),
        getBalanceStatement: guarded(async (req) => {
          const statement = await admin.balanceStatement(req.key);
          return {
            account: accountMessage(statement.account),
            changes: statement.entries.map((e) =>
              create(BalanceChangeSchema, { ...balanceChangeFields(e), kind: changeKinds[e.kind] }),
            ),
            takenSinceLast: formatMoney(statement.takenSinceLast),
          };
        }),
        getAccountHistory: guarded(async (req) => {
          const account = await admin.get(req.key);
          const events = await admin.history(req.key);
          return {
            account: accountMessage(account),
            events: events.map((e) => create(AccountEventSchema, { atMs: BigInt(e.at), kind: eventKinds[e.kind], by: e.by, changes: e.changes.map((c) => ({ ...c })) })),
          };
        }),
        setAlerts: guarded(async (req, ctx) => {
          const a = req.alerts;
          const { account, secret } = await by(ctx).setAlerts(
            req.key,
            a === undefined
              ? null
              : {
                  url: a.url,
                  usagePercents: a.usagePercents,
                  ...(a.balanceBelow !== undefined ? { balanceBelow: parseMoney(a.balanceBelow) } : {}),
                  ...(a.expiryDays !== undefined ? { expiryDays: a.expiryDays } : {}),
                },
            { newSecret: req.newSecret, keepOldMs: req.keepOldSeconds * 1000 },
          );
          return { account: accountMessage(account), secret: secret ?? "" };
        }),
        testAlerts: guarded(async (req) => {
          const sent = await admin.testAlerts(req.key, ports.alertSender);
          return { id: sent.id, delivered: sent.delivered, status: sent.status ?? 0, error: sent.delivered ? "" : sent.error, elapsedMs: sent.ms };
        }),
        listAlerts: guarded(async (req) => {
          const limit = req.limit === 0 ? 50 : Math.min(req.limit, 500);
          return { alerts: (await admin.alerts(req.key, ports.alerts, limit)).map(alertMessage) };
        }),
        queryUsage: guarded(async (req) => {
          const report = await totalsPage(meter, {
            filter: { ...usageFilter(req), rows: Math.max(0, Math.min(req.rows, 10_000)), byAddress: req.byAddress },
            pageSize: req.pageSize,
            pageToken: req.pageToken,
          });
          const sums = report.sums;
          return { totals: report.totals.map(totalMessage), rows: report.rows.map(rowMessage), ...sums, amount: formatMoney(sums.amount), nextPageToken: report.nextPageToken };
        }),
        listCalls: guarded(async (req) => {
          const page = await callPage(meter, {
            filter: usageFilter(req),
            pageSize: req.pageSize,
            pageToken: req.pageToken,
          });
          return { calls: page.rows.map(rowMessage), nextPageToken: page.nextPageToken };
        }),
        followCalls: guarded(async (req) => {
          const account = await followedAccount(req.account);
          const page = await followCalls(meter, { cursor: req.cursor, fromNow: req.fromNow, pageSize: req.pageSize, account });
          return { calls: page.rows.map(rowMessage), cursor: page.cursor, caughtUp: page.caughtUp };
        }),
        /**
         * FollowCalls on one stream: reads on from the cursor while there is more, then waits for this
         * process's next commit (read 25 ms after the last read at the soonest) or, in shared mode, its poll
         * (other replicas' commits), never
         * holding a read open.
         * A message goes out for calls, first at once, and after a heartbeat's quiet; a slow reader holds the
         * stream (each message waits for the one before to be taken), not the gateway. It ends when the
         * caller does, when a draining server has caught up, or (unauthenticated) once its named admin is
         * revoked: looked at once a heartbeat, however busy the stream.
         */
        async *watchCalls(req, ctx) {
          const heartbeatMs = options.watchHeartbeatMs ?? 15_000;
          const bell = ports.ledgerCommits ?? new CommitBell();
          const name = ctx.values.get(adminNameKey);
          const drain = ports.readiness?.drainSignal;
          const wake = drain === undefined ? ctx.signal : AbortSignal.any([ctx.signal, drain]);
          // An HTTP/1.x caller that ends its side is sent a heartbeat at once, once: one that has closed its
          // socket meets it with a reset and the stream ends now, not at the next heartbeat (hang-up-check.ts).
          const callerEnded = ctx.values.get(callerEndedKey)();
          const wakeOrEnded = callerEnded === undefined ? wake : AbortSignal.any([wake, callerEnded]);
          let prompted = false;
          let cursor = req.cursor;
          // From now: the first read starts at the ledger's end; every read after, from the cursor it gave.
          let fromNow = req.fromNow;
          let sent = false;
          // Times on performance.now(): a wall clock stepping back would stop heartbeats and the token's checks for the step.
          let lastSent = -Infinity;
          let lastChecked = performance.now();
          let lastRead = -Infinity;
          try {
            const account = await followedAccount(req.account);
            while (!ctx.signal.aborted) {
              // A named admin's token, looked at again once a heartbeat, busy or quiet: a revoked one ends the stream.
              if (name !== "" && performance.now() - lastChecked >= heartbeatMs) {
                lastChecked = performance.now();
                if ((await ports.admins?.list())?.find((a) => a.name === name)?.revokedAt !== undefined) throw new ConnectError(`the admin token of ${name} was revoked`, Code.Unauthenticated);
              }
              // Noted before the read: a commit during the read or while the message is taken is not waited for.
              const seen = bell.rung;
              lastRead = performance.now();
              const page = await followCalls(meter, { cursor, fromNow, pageSize: req.pageSize, account });
              fromNow = false;
              const ended = callerEnded?.aborted === true && !prompted;
              const quiet = performance.now() - lastSent >= heartbeatMs || ended;
              if (page.rows.length > 0 || !sent || quiet) {
                yield { calls: page.rows.map(rowMessage), cursor: page.cursor };
                sent = true;
                lastSent = performance.now();
                if (ended) prompted = true;
              }
              cursor = page.cursor;
              if (!page.caughtUp) continue;
              if (ports.readiness?.draining) return;
              // Another process's commits are seen by reading again; where every commit rings the bell, nothing is read until one does.
              const poll = bell.everyCommit ? heartbeatMs : watchPollMs;
              await bell.wait(Math.max(0, Math.min(poll, lastSent + heartbeatMs - performance.now())), prompted ? wake : wakeOrEnded, seen);
              const gap = lastRead + watchReadGapMs - performance.now();
              if (gap > 0) await sleep(gap, undefined, { signal: prompted ? wake : wakeOrEnded }).catch(() => undefined);
            }
          } catch (e) {
            adminError(e);
          }
        },
      },
      // Only the fields it has (known-fields.ts): a misspelt one is refused, not taken as its default. The token is checked first.
      { ...knownJsonOnly, interceptors: [...(options.interceptors ?? []), requireAdminToken(options.token, options.lockout, options.telemetry, ports.admins), refuseUnknownFields] },
    );
}
