import { create } from "@bufbuild/protobuf";
import type { ConnectRouter, HandlerContext, Interceptor } from "@connectrpc/connect";
import { ErrorCode } from "../../gen/gateway/catalogue/v1/status_pb.js";
import type { Gateway } from "../../core/gateway.ts";
import { formatRate } from "../../core/call-rate.ts";
import { isCalendarDay } from "../../core/clock.ts";
import type { UsageTotal } from "../../core/meter.ts";
import { formatMoney } from "../../core/money.ts";
import { keptUntil } from "../../core/secret-grace.ts";
import { alertData, shownAlertUrl } from "../../core/alerts.ts";
import { alertFields, alertLineFields } from "./alert-fields.ts";
import { operations as allOperations } from "../../operations/index.ts";
import { balanceChangeFields, callFields, usageTotalFields } from "./usage-fields.ts";
import { UsagePageError, type TotalsPage } from "../../core/usage-pages.ts";
import { fourDigits } from "../../contract/error-codes.ts";
import {
  AccountService,
  AccountStatus,
  BalanceChangeKind,
  BalanceChangeSchema,
  CallSchema,
  GetMyBalanceStatementResponseSchema,
  GetMyAccountResponseSchema,
  ListMyCallsResponseSchema,
  FollowMyCallsResponseSchema,
  ListMyAlertsResponseSchema,
  MyAlertSchema,
  MyAlertsSchema,
  OperationState,
  QueryMyUsageResponseSchema,
  UsageTotalSchema,
} from "../../gen/gateway/account/v1/account_pb.js";
import { credentialFields, readCredentials } from "../credentials.ts";
import { callLogKey, clientIpKey, requestIdKey } from "./context.ts";
import { rpcTransportOf, statusError } from "./status-error.ts";
import { knownJsonOnly, refuseUnknownFields } from "./known-fields.ts";

const changeKinds = { opening: BalanceChangeKind.OPENING, "top-up": BalanceChangeKind.TOP_UP, carried: BalanceChangeKind.CARRIED, unbilled: BalanceChangeKind.UNBILLED } as const;

/**
 * The AccountService: a team reads its own account with its own key
 * (proto/gateway/account/v1/account.proto). Who the caller is, is decided
 * by the core as for a catalogue call (Gateway.identifyCaller); a refusal is
 * an error with the status block as detail, as a catalogue call's.
 * `interceptors`: the router's, which the service's own replace.
 */
export function accountRoutes(gateway: Gateway, options: { readonly interceptors?: readonly Interceptor[] } = {}): (router: ConnectRouter) => void {
  /** The caller's account, or the refusal thrown; `params` are what a signature of the call covers. */
  const caller = async (ctx: HandlerContext, params: Record<string, string | undefined>) => {
    const transport = rpcTransportOf(ctx.requestHeader.get("content-type"));
    const who = await gateway.identifyCaller({
      credentials: readCredentials({
        field: (name) => ctx.requestHeader.get(credentialFields[name].header) ?? undefined,
        authorization: ctx.requestHeader.get("authorization") ?? undefined,
        method: "RPC",
        path: `/${ctx.service.typeName}/${ctx.method.name}`,
        params: () => params,
      }),
      transport,
      clientIp: ctx.values.get(clientIpKey),
      requestId: ctx.values.get(requestIdKey) || undefined,
      logFields: ctx.values.get(callLogKey),
    });
    if (who.kind === "refused") throw statusError(who.status, { unauthenticated: who.unauthenticated, refusedBy: who.refusedBy, transport });
    return { ...who, transport };
  };
  type Caller = Awaited<ReturnType<typeof caller>>;
  /** What a team is told for a page it cannot be given: a token or cursor out of place is the spec's own 4015 (wrong page token), anything else a 4003. */
  const pageRefusal = (e: UsagePageError, who: Caller, ctx: HandlerContext) =>
    statusError(gateway.ownRefusal(e.of === "token" ? ErrorCode.WRONG_PAGE_TOKEN : ErrorCode.PARAM_ERROR, e.of === "folded" ? foldedForTeam : e.message, who, ctx.values.get(clientIpKey)), { transport: who.transport });

  return (router) =>
    router.service(AccountService, {
      async getMyAccount(_req, ctx) {
        const { account: a, requestId, now } = await caller(ctx, {});
        const { day: today, usage, balance, rate } = await gateway.ownStanding(a, now);
        const oldUntil = keptUntil(a.previousSecrets, now);
        return create(GetMyAccountResponseSchema, {
          key: a.key,
          name: a.name,
          status: a.status === "stopped" ? AccountStatus.STOPPED : today > a.expires ? AccountStatus.EXPIRED : AccountStatus.ACTIVE,
          expires: a.expires,
          zone: a.zone,
          day: today,
          today: BigInt(usage.today),
          dailyMax: BigInt(a.dailyMax),
          remainingToday: BigInt(Math.max(0, a.dailyMax - usage.today)),
          yesterday: BigInt(usage.yesterday),
          before: BigInt(usage.before),
          concurrency: a.concurrency,
          rate: a.rate === undefined ? "" : formatRate(a.rate),
          ...(balance !== undefined ? { balance: formatMoney(balance) } : {}),
          prices: Object.fromEntries([...a.prices].map(([op, price]) => [op, formatMoney(price)])),
          operations: Object.fromEntries([...a.operations].map(([op, state]) => [op, state === "enabled" ? OperationState.ENABLED : OperationState.STOPPED])),
          allowedFrom: [...(a.allowedFrom ?? [])],
          ...(oldUntil !== undefined ? { oldSecretUntilMs: BigInt(oldUntil) } : {}),
          clientIp: ctx.values.get(clientIpKey),
          requestId,
          ...(rate !== undefined ? { rateRemaining: rate.left, rateResetMs: BigInt(Math.ceil(rate.resetMs)) } : {}),
          ...(a.alerts !== undefined
            ? {
                alerts: create(MyAlertsSchema, { to: shownAlertUrl(a.alerts.url), ...alertLineFields(a.alerts) }),
              }
            : {}),
        });
      },

      async listMyCalls(req, ctx) {
        // A signature covers what the call asks, under the request's field names, each that is sent.
        const params: Record<string, string | undefined> = {};
        if (req.pageSize !== 0) params.page_size = String(req.pageSize);
        if (req.pageToken !== "") params.page_token = req.pageToken;
        if (req.from !== "") params.from = req.from;
        if (req.to !== "") params.to = req.to;
        if (req.operation !== "") params.operation = req.operation;
        if (req.errorCode !== undefined) params.error_code = fourDigits(req.errorCode);
        if (req.requestId !== "") params.request_id = req.requestId;
        const who = await caller(ctx, params);
        const refuse = (reason: string) =>
          statusError(gateway.ownRefusal(ErrorCode.PARAM_ERROR, reason, who, ctx.values.get(clientIpKey)), { transport: who.transport });
        checkUsageFilter(req, refuse);
        try {
          const page = await gateway.ownCalls(
            who.account,
            { from: req.from || undefined, to: req.to || undefined, operation: req.operation || undefined, code: req.errorCode, requestId: req.requestId || undefined },
            { pageSize: req.pageSize, pageToken: req.pageToken },
          );
          return create(ListMyCallsResponseSchema, { calls: page.rows.map((r) => create(CallSchema, callFields(r))), nextPageToken: page.nextPageToken });
        } catch (e) {
          throw e instanceof UsagePageError ? pageRefusal(e, who, ctx) : e;
        }
      },

      async followMyCalls(req, ctx) {
        // A signature covers what the call asks, under the request's field names, each that is sent.
        const params: Record<string, string | undefined> = {};
        if (req.cursor !== "") params.cursor = req.cursor;
        if (req.pageSize !== 0) params.page_size = String(req.pageSize);
        if (req.fromNow) params.from_now = "true";
        const who = await caller(ctx, params);
        try {
          const page = await gateway.ownFeed(who.account, { cursor: req.cursor, fromNow: req.fromNow, pageSize: req.pageSize });
          return create(FollowMyCallsResponseSchema, { calls: page.rows.map((r) => create(CallSchema, callFields(r))), cursor: page.cursor, caughtUp: page.caughtUp });
        } catch (e) {
          throw e instanceof UsagePageError ? pageRefusal(e, who, ctx) : e;
        }
      },

      async getMyBalanceStatement(_req, ctx) {
        const { account } = await caller(ctx, {});
        const statement = await gateway.ownStatement(account);
        return create(GetMyBalanceStatementResponseSchema, {
          ...(statement.balance !== undefined ? { balance: formatMoney(statement.balance) } : {}),
          changes: statement.entries.map((e) =>
            create(BalanceChangeSchema, { ...balanceChangeFields(e), kind: changeKinds[e.kind] }),
          ),
          takenSinceLast: formatMoney(statement.takenSinceLast),
        });
      },

      async listMyAlerts(req, ctx) {
        const { account } = await caller(ctx, req.limit === 0 ? {} : { limit: String(req.limit) });
        const alerts = await gateway.ownAlerts(account, req.limit === 0 ? 50 : Math.min(req.limit, 500));
        return create(ListMyAlertsResponseSchema, {
          alerts: alerts.map((r) =>
            create(MyAlertSchema, { ...alertFields(r), dataJson: JSON.stringify(alertData(r)) }),
          ),
        });
      },

      async queryMyUsage(req, ctx) {
        // A signature covers what the call asks, under the request's field names, each that is sent.
        const params: Record<string, string | undefined> = {};
        if (req.from !== "") params.from = req.from;
        if (req.to !== "") params.to = req.to;
        if (req.operation !== "") params.operation = req.operation;
        if (req.byAddress) params.by_address = "true";
        if (req.pageSize !== 0) params.page_size = String(req.pageSize);
        if (req.pageToken !== "") params.page_token = req.pageToken;
        const who = await caller(ctx, params);
        const a = who.account;
        // What cannot be asked is a 4003 with its status block, as a catalogue call's argument out of form.
        const refuse = (reason: string) =>
          statusError(gateway.ownRefusal(ErrorCode.PARAM_ERROR, reason, who, ctx.values.get(clientIpKey)), { transport: who.transport });
        checkUsageFilter(req, refuse);
        let report: TotalsPage;
        try {
          report = await gateway.ownUsage(a, { from: req.from || undefined, to: req.to || undefined, operation: req.operation || undefined, byAddress: req.byAddress }, { pageSize: req.pageSize, pageToken: req.pageToken });
        } catch (e) {
          throw e instanceof UsagePageError ? pageRefusal(e, who, ctx) : e;
        }
        // What the operator's calls to its provider were is the operator's, not the team's.
        const { upstreamRequests: _operators, ...sums } = report.sums;
        return create(QueryMyUsageResponseSchema, { totals: report.totals.map(totalMessage), ...sums, amount: formatMoney(sums.amount), nextPageToken: report.nextPageToken });
      },
    },
    // Only the fields it has (known-fields.ts): a misspelt filter is refused, not read as no filter.
    { ...knownJsonOnly, interceptors: [...(options.interceptors ?? []), refuseUnknownFields] });
}

/** A team's cursor that retention passed over (FollowMyCalls): what to do, in the team's own methods. */
const foldedForTeam =
  "calls after this cursor were folded past retention into per-day totals before they were read; follow again from the start (an empty cursor) and take the days folded from QueryMyUsage's totals";

function totalMessage(t: UsageTotal) {
  return create(UsageTotalSchema, usageTotalFields(t));
}

/** A team's usage filter that cannot be asked: a day not YYYY-MM-DD, an operation the gateway does not have (a 4003, thrown by `refuse`). */
function checkUsageFilter(req: { readonly from: string; readonly to: string; readonly operation: string }, refuse: (reason: string) => Error): void {
  for (const [name, value] of [["from", req.from], ["to", req.to]] as const) {
    if (value !== "" && !isCalendarDay(value)) throw refuse(`${name}: a day is YYYY-MM-DD, not ${JSON.stringify(value.slice(0, 32))}`);
  }
  if (req.operation !== "" && !allOperations.some((op) => op.id === req.operation)) {
    throw refuse(`operation: ${JSON.stringify(req.operation.slice(0, 64))} is not an operation of this gateway (${allOperations.map((op) => op.id).join(", ")})`);
  }
}
