import { parseArgs } from "node:util";
import type { GatewayConfig } from "../config.ts";
import { AccountAdminError, printableName, type AccountEvent, type AccountPlan, type BalanceStatement } from "../core/account-admin.ts";
import type { Account } from "../core/accounts.ts";
import { formatDateTime } from "../core/clock.ts";
import { formatMoney, parseMoney, type Micros } from "../core/money.ts";
import { keptUntil, stillKept } from "../core/secret-grace.ts";
import { formatRate, parseRate, type CallRate } from "../core/call-rate.ts";
import { formatAllowedAddresses } from "../core/allowed-addresses.ts";
import { openRuntime, type Runtime } from "../runtime.ts";
import { alertData, alertTypes, formatAlertSettings, type AlertRecord, type AlertSettings } from "../core/alerts.ts";
import { cliActor } from "./cli-actor.ts";

/** An account as the CLI prints it: no secret, amounts as decimal text. */
export function describeAccount(a: Account) {
  return {
    key: a.key,
    name: a.name,
    ...(a.externalId !== undefined ? { externalId: a.externalId } : {}),
    status: a.status,
    operations: Object.fromEntries(a.operations),
    max: a.dailyMax,
    concurrency: a.concurrency,
    rate: formatRate(a.rate),
    allowedFrom: formatAllowedAddresses(a.allowedFrom),
    alerts: a.alerts === undefined ? null : formatAlertSettings(a.alerts),
    balance: a.balance === undefined ? null : formatMoney(a.balance),
    prices: Object.fromEntries([...a.prices].map(([op, p]) => [op, formatMoney(p)])),
    expires: a.expires,
    zone: a.zone,
  };
}

/** A balance statement as the CLI prints it (`--json`): amounts as decimal text, times in the account's zone. */
export function describeStatement(s: BalanceStatement) {
  const { account } = s;
  return {
    key: account.key,
    zone: account.zone,
    balance: account.balance === undefined ? null : formatMoney(account.balance),
    changes: s.entries.map((e) => ({
      at: formatDateTime(e.at, account.zone),
      kind: e.kind,
      amount: formatMoney(e.amount),
      balance: e.balance === undefined ? null : formatMoney(e.balance),
      takenBefore: formatMoney(e.takenBefore),
      ...(e.reference !== "" ? { reference: e.reference } : {}),
    })),
    takenSinceLast: formatMoney(s.takenSinceLast),
  };
}

/** An account's history as the CLI prints it (`--json`): times in the account's zone. */
export function describeHistory(account: Account, events: readonly AccountEvent[]) {
  return {
    key: account.key,
    zone: account.zone,
    events: events.map((e) => ({ at: formatDateTime(e.at, account.zone), kind: e.kind, by: e.by, changes: e.changes })),
  };
}

/** An alert as the CLI prints it: times as ISO text. */
export function describeAlert(a: AlertRecord) {
  const iso = (ms: number | undefined) => (ms === undefined ? null : new Date(ms).toISOString());
  return {
    id: `alert-${a.id}`,
    type: alertTypes[a.kind],
    created: new Date(a.at).toISOString(),
    // As the alert's body has it.
    data: alertData(a),
    attempts: a.attempts,
    delivered: iso(a.deliveredAt),
    nextAttempt: iso(a.nextAt),
    lastError: a.lastError,
  };
}

const signed = (m: Micros) => (m < 0n ? formatMoney(m) : `+${formatMoney(m)}`);

/** `--flag 90s|30m|24h|7d` as milliseconds. */
function duration(flag: string, value: string): number {
  const m = /^([0-9]{1,6})(s|m|h|d)$/.exec(value);
  if (m === null) throw new AccountAdminError(`--${flag} takes a duration such as 90s, 30m, 24h or 7d, not ${JSON.stringify(value)}`);
  return Number(m[1]) * { s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000 }[m[2] as "s" | "m" | "h" | "d"];
}

function wholeNumber(flag: string, value: string | undefined): number | undefined {
  if (value === undefined) return undefined;
  if (!/^[0-9]{1,15}$/.test(value)) throw new AccountAdminError(`--${flag} takes a whole number, not ${JSON.stringify(value)}`);
  return Number(value);
}

/** `--rate 10/s|600/min|none` (and `--burst N`) as a rate; undefined when not given. */
function rateFlags(rate: string | undefined, burst: number | undefined): CallRate | null | undefined {
  if (rate === undefined) return undefined;
  try {
    return parseRate(rate, burst) ?? null;
  } catch (e) {
    throw new AccountAdminError(`--rate: ${(e as Error).message}`);
  }
}

/** `--price OPERATION=PRICE` (repeatable) as a price map. */
function prices(runtime: Runtime, values: string[] | undefined): AccountPlan["prices"] | undefined {
  if (values === undefined) return undefined;
  return new Map(
    values.map((v) => {
      const [op, price] = v.split("=");
      if (op === undefined || price === undefined) throw new AccountAdminError("--price takes OPERATION=PRICE, e.g. <catalogue>/<api_name>=0.05");
      return [runtime.admin.operation(op), parseMoney(price)];
    }),
  );
}

const planFlags = {
  max: { type: "string" },
  concurrency: { type: "string" },
  rate: { type: "string" },
  burst: { type: "string" },
  "allow-from": { type: "string" },
  expires: { type: "string" },
  zone: { type: "string" },
} as const;

export async function accountsCommand(config: GatewayConfig, argv: string[]): Promise<number> {
  const [sub, ...rest] = argv;
  const runtime = await openRuntime(config);
  const admin = runtime.admin.as(cliActor());
  const print = (a: Account, json: boolean) =>
    console.log(json ? JSON.stringify(describeAccount(a)) : `${a.key}: ${JSON.stringify(describeAccount(a))}`);
  try {
    switch (sub) {
      case "create": {
        const { values } = parseArgs({
          args: rest,
          options: {
            ...planFlags,
            json: { type: "boolean", default: false },
            name: { type: "string" },
            "external-id": { type: "string" },
            balance: { type: "string" },
            operations: { type: "string" },
            price: { type: "string", multiple: true },
          },
        });
        const max = wholeNumber("max", values.max);
        const concurrency = wholeNumber("concurrency", values.concurrency);
        const priceMap = prices(runtime, values.price);
        const burst = wholeNumber("burst", values.burst);
        if (burst !== undefined && values.rate === undefined) throw new AccountAdminError("--burst needs a --rate");
        const rate = rateFlags(values.rate, burst);
        const { account, secret, repeated } = await admin.create({
          ...(values["external-id"] !== undefined ? { externalId: values["external-id"] } : {}),
          ...(rate ? { rate } : {}),
          // `--allow-from 10.0.0.0/8,203.0.113.7` or `any`, read as the AdminService reads its list.
          ...(values["allow-from"] !== undefined ? { allowedFrom: [values["allow-from"]] } : {}),
          ...(values.name !== undefined ? { name: values.name } : {}),
          ...(max !== undefined ? { dailyMax: max } : {}),
          ...(concurrency !== undefined ? { concurrency } : {}),
          ...(values.balance !== undefined ? { balance: parseMoney(values.balance) } : {}),
          ...(values.expires !== undefined ? { expires: values.expires } : {}),
          ...(values.zone !== undefined ? { zone: values.zone } : {}),
          ...(values.operations !== undefined ? { operations: values.operations.split(",").filter(Boolean).map((op) => runtime.admin.operation(op)) } : {}),
          ...(priceMap !== undefined ? { prices: priceMap } : {}),
        });
        if (values.json) {
          console.log(JSON.stringify({ ...describeAccount(account), secret, ...(repeated ? { repeated } : {}) }));
        } else if (repeated) {
          // Made before by the same request: its secret was shown then, and is not kept.
          console.log(`key:    ${account.key}\n(made before for the external id ${account.externalId}, with these settings: its secret was shown then; accounts rotate-secret makes a new one)`);
          console.log(JSON.stringify(describeAccount(account)));
        } else {
          console.log(`key:    ${account.key}\nsecret: ${secret}\n(the secret is shown once; only its hash is stored)`);
          console.log(JSON.stringify(describeAccount(account)));
        }
        return 0;
      }
      case "list": {
        const { values } = parseArgs({ args: rest, options: { json: { type: "boolean", default: false }, query: { type: "string" }, status: { type: "string" }, limit: { type: "string" } } });
        if (values.status !== undefined && values.status !== "active" && values.status !== "stopped") throw new AccountAdminError("--status must be active or stopped");
        const limit = wholeNumber("limit", values.limit);
        if (limit === 0) throw new AccountAdminError("--limit must be 1 or more");
        // The AdminService's listing (ListAccounts): the store filters; --limit takes the first page of that many.
        const page = await admin.page({ query: values.query, status: values.status, pageSize: limit ?? 0, maxWhole: Infinity });
        const accounts = page.accounts.map(describeAccount);
        if (values.json) console.log(JSON.stringify(accounts));
        else for (const a of accounts) console.log(`${a.key}  ${a.status.padEnd(7)}  max ${a.max}  balance ${a.balance ?? "-"}  expires ${a.expires}  ${printableName(a.name)}`);
        if (page.accounts.length < page.totalSize) console.error(`${page.accounts.length} of ${page.totalSize} accounts shown (--limit ${limit})`);
        return 0;
      }
      case "stop":
      case "resume": {
        const [key] = rest;
        if (key === undefined) throw new AccountAdminError(`usage: gateway accounts ${sub} KEY`);
        print(await admin.setStatus(key, sub === "stop" ? "stopped" : "active"), false);
        return 0;
      }
      case "enable-api":
      case "disable-api":
      case "remove-api": {
        const [key, operation] = rest;
        if (key === undefined || operation === undefined) throw new AccountAdminError(`usage: gateway accounts ${sub} KEY OPERATION`);
        const state = sub === "enable-api" ? "enabled" : sub === "disable-api" ? "stopped" : "removed";
        print(await admin.setOperation(key, operation, state), false);
        return 0;
      }
      case "set-plan": {
        const { values, positionals } = parseArgs({ args: rest, allowPositionals: true, options: planFlags });
        const [key] = positionals;
        if (key === undefined) throw new AccountAdminError("usage: gateway accounts set-plan KEY [--max N] [--concurrency N] [--rate N/s|N/min|N/h|none] [--burst N] [--allow-from ADDRESSES|any] [--expires YYYY-MM-DD] [--zone Z]");
        const max = wholeNumber("max", values.max);
        const concurrency = wholeNumber("concurrency", values.concurrency);
        const burst = wholeNumber("burst", values.burst);
        const rate = rateFlags(values.rate, burst);
        print(
          await admin.setPlan(key, {
            ...(rate !== undefined ? { rate } : burst !== undefined ? { burst } : {}),
            ...(values["allow-from"] !== undefined ? { allowedFrom: [values["allow-from"]] } : {}),
            ...(max !== undefined ? { dailyMax: max } : {}),
            ...(concurrency !== undefined ? { concurrency } : {}),
            ...(values.expires !== undefined ? { expires: values.expires } : {}),
            ...(values.zone !== undefined ? { zone: values.zone } : {}),
          }),
          false,
        );
        return 0;
      }
      case "rotate-secret": {
        const { values, positionals } = parseArgs({ args: rest, allowPositionals: true, options: { json: { type: "boolean", default: false }, "keep-old": { type: "string" } } });
        const [key] = positionals;
        if (key === undefined) throw new AccountAdminError("usage: gateway accounts rotate-secret KEY [--keep-old DURATION] [--json]");
        const secret = await admin.rotateSecret(key, values["keep-old"] === undefined ? 0 : duration("keep-old", values["keep-old"]));
        const account = await admin.get(key);
        const kept = stillKept(account.previousSecrets, Date.now());
        // The secret this rotation replaced comes first; earlier ones still kept keep their own times.
        const until = kept[0]?.until;
        if (values.json) console.log(JSON.stringify({ key, secret, oldSecretUntil: until === undefined ? null : new Date(until).toISOString() }));
        else {
          const earlier = kept.length > 1 ? `, and ${kept.length - 1} replaced before it until their own times` : "";
          const old = until === undefined ? "the old secret no longer works" : `the old secret still works until ${formatDateTime(until, account.zone)} ${account.zone}${earlier}`;
          console.log(`key:    ${key}\nsecret: ${secret}\n(${old}; the new one is shown once)`);
        }
        return 0;
      }
      case "statement": {
        const { values, positionals } = parseArgs({ args: rest, allowPositionals: true, options: { json: { type: "boolean", default: false } } });
        const [key] = positionals;
        if (key === undefined) throw new AccountAdminError("usage: gateway accounts statement KEY [--json]");
        const statement = await admin.balanceStatement(key);
        if (values.json) {
          console.log(JSON.stringify(describeStatement(statement)));
          return 0;
        }
        const d = describeStatement(statement);
        console.log(`${d.key}: balance ${d.balance ?? "none (not billed by balance)"}; times in ${d.zone}`);
        if (d.changes.length === 0) console.log("no balance changes recorded");
        for (const [i, e] of statement.entries.entries()) {
          const c = d.changes[i]!;
          if (e.takenBefore !== 0n) console.log(`${"".padEnd(19)}  calls took ${c.takenBefore}`);
          console.log(`${c.at}  ${c.kind.padEnd(8)} ${signed(e.amount).padStart(14)}  balance ${c.balance ?? "none"}${e.reference !== "" ? `  ref ${e.reference}` : ""}`);
        }
        if (statement.account.balance !== undefined && d.changes.length > 0) console.log(`${"".padEnd(19)}  calls took ${d.takenSinceLast} since`);
        return 0;
      }
      case "history": {
        const { values, positionals } = parseArgs({ args: rest, allowPositionals: true, options: { json: { type: "boolean", default: false } } });
        const [key] = positionals;
        if (key === undefined) throw new AccountAdminError("usage: gateway accounts history KEY [--json]");
        const account = await admin.get(key);
        const d = describeHistory(account, await admin.history(key));
        if (values.json) {
          console.log(JSON.stringify(d));
          return 0;
        }
        console.log(`${d.key}: ${d.events.length} ${d.events.length === 1 ? "change" : "changes"} recorded; times in ${d.zone}`);
        for (const e of d.events) {
          console.log(`${e.at}  ${e.kind.padEnd(9)}  by ${e.by || "(not recorded)"}`);
          const moves = e.changes.map((c) => (e.kind === "created" || c.field === "secret" ? `${c.field}: ${c.after}` : `${c.field}: ${c.before || "(none)"} → ${c.after || "(none)"}`));
          console.log(`${"".padEnd(19)}  ${moves.join("; ")}`);
        }
        return 0;
      }
      case "top-up": {
        const { values, positionals } = parseArgs({ args: rest, allowPositionals: true, options: { reference: { type: "string" } } });
        const [key, amount] = positionals;
        if (key === undefined || amount === undefined) throw new AccountAdminError("usage: gateway accounts top-up KEY AMOUNT [--reference PAYMENT-ID]");
        const { account, repeated } = await admin.topUp(key, parseMoney(amount), values.reference);
        if (repeated) console.error(`already topped up by reference ${values.reference}; nothing added`);
        print(account, false);
        return 0;
      }
      case "alerts": {
        const { values, positionals } = parseArgs({
          args: rest,
          allowPositionals: true,
          options: {
            url: { type: "string" },
            at: { type: "string" },
            "balance-below": { type: "string" },
            "expiry-days": { type: "string" },
            "new-secret": { type: "boolean", default: false },
            "keep-old": { type: "string" },
            off: { type: "boolean", default: false },
            test: { type: "boolean", default: false },
            json: { type: "boolean", default: false },
          },
        });
        const [key] = positionals;
        const usage = "usage: gateway accounts alerts KEY [--url URL] [--at PERCENT,…|none] [--balance-below AMOUNT|none] [--expiry-days N|none] [--new-secret [--keep-old DURATION]] | --off | --test  [--json]";
        if (key === undefined) throw new AccountAdminError(usage);
        const changing = values.url !== undefined || values.at !== undefined || values["balance-below"] !== undefined || values["expiry-days"] !== undefined || values["new-secret"] || values["keep-old"] !== undefined;
        if (values.off && changing) throw new AccountAdminError(`--off takes no other flag; ${usage}`);
        if (values.test) {
          if (values.off || changing) throw new AccountAdminError(`--test takes no other flag; ${usage}`);
          const sent = await admin.testAlerts(key, runtime.alertSender);
          if (values.json) console.log(JSON.stringify(sent));
          else console.log(sent.delivered ? `${sent.id}: delivered (HTTP ${sent.status}, ${sent.ms} ms)` : `${sent.id}: not delivered: ${sent.error} (${sent.ms} ms)`);
          return sent.delivered ? 0 : 1;
        }
        let secret: string | undefined;
        let account = await admin.get(key);
        if (values.off) account = (await admin.setAlerts(key, null)).account;
        else if (changing) {
          const current = account.alerts;
          const url = values.url ?? current?.url;
          if (url === undefined) throw new AccountAdminError(`this account has no alerts yet: give --url; ${usage}`);
          const at = values.at ?? (current === undefined ? "80,100" : undefined);
          const below = values["balance-below"];
          const expiry = values["expiry-days"];
          const settings: AlertSettings = {
            url,
            usagePercents: at === undefined ? (current?.usagePercents ?? []) : at === "none" ? [] : at.split(",").map((p) => wholeNumber("at", p.trim().replace(/%$/, "")) ?? 0),
            ...(below === undefined ? (current?.balanceBelow !== undefined ? { balanceBelow: current.balanceBelow } : {}) : below === "none" ? {} : { balanceBelow: parseMoney(below) }),
            ...(expiry === undefined ? (current?.expiryDays !== undefined ? { expiryDays: current.expiryDays } : {}) : expiry === "none" ? {} : { expiryDays: wholeNumber("expiry-days", expiry) ?? 0 }),
          };
          const keepOldMs = values["keep-old"] === undefined ? 0 : duration("keep-old", values["keep-old"]);
          ({ account, secret } = await admin.setAlerts(key, settings, { newSecret: values["new-secret"], keepOldMs }));
        }
        const recent = await admin.alerts(key, runtime.alerts, 20);
        if (values.json) {
          const keptTill = keptUntil(account.previousAlertSecrets, Date.now());
          const kept = keptTill !== undefined ? { oldSecretUntil: new Date(keptTill).toISOString() } : {};
          console.log(JSON.stringify({ key, alerts: account.alerts === undefined ? null : formatAlertSettings(account.alerts), ...(secret !== undefined ? { secret } : {}), ...kept, recent: recent.map(describeAlert) }));
          return 0;
        }
        console.log(`${key}: ${account.alerts === undefined ? "no alerts" : `alerts to ${formatAlertSettings(account.alerts)}`}`);
        if (secret !== undefined) console.log(`alert secret: ${secret}\n(shown once: the receiver checks each alert's Gateway-Signature with it)`);
        const keptTill = keptUntil(account.previousAlertSecrets, Date.now());
        if (secret !== undefined && keptTill !== undefined) console.log(`the old alert secret signs too until ${new Date(keptTill).toISOString()} (a second v1 in Gateway-Signature)`);
        for (const a of recent.map(describeAlert)) {
          const d = a.data;
          const what = a.type === "usage.threshold" ? `${d.day} ${d.percent}% reached (${d.calls} of ${d.dailyMax})` : a.type === "balance.low" ? `balance ${d.balance} below ${d.below}` : `key's last day ${d.expires} (${d.daysLeft} days left)`;
          const state = a.delivered !== null ? `delivered ${a.delivered}` : a.nextAttempt !== null ? `attempt ${a.attempts + 1} at ${a.nextAttempt}${a.lastError ? ` (${a.lastError})` : ""}` : `given up after ${a.attempts} (${a.lastError})`;
          console.log(`${a.id.padEnd(10)} ${a.created}  ${what}; ${state}`);
        }
        return 0;
      }
      case "set-price": {
        const [key, operation, price] = rest;
        if (key === undefined || operation === undefined || price === undefined) throw new AccountAdminError("usage: gateway accounts set-price KEY OPERATION PRICE");
        print(await admin.setPrice(key, operation, parseMoney(price)), false);
        return 0;
      }
      default:
        console.error("usage: gateway accounts create|list|stop|resume|enable-api|disable-api|remove-api|set-plan|top-up|set-price|rotate-secret|statement|history|alerts …");
        return 2;
    }
  } finally {
    await runtime.close();
  }
}
