// Accounts: list with search and status; create (showing the secret once);
// stop and resume; enable, stop or add an operation; set the plan; top up;
// rotate the secret; set its usage alerts and read how they were delivered;
// read the account's history. Every action is an
// AdminService call whose error is shown in words beside it.
import { AccountEventKind, AccountStatus, OperationState, type Account, type SetAlertsResponse, type TestAlertsResponse, type TopUpResponse } from "../gen/gateway/admin/v1/admin_pb.js";
import { Code, ConnectError } from "@connectrpc/connect";
import { formatRate, parseRate } from "../core/call-rate.ts";
import { inWords, isUnauthenticated } from "./api.ts";
import { field, formValues, h, notice } from "./dom.ts";
import type { Shell } from "./main.ts";

/** How the history shows a setting that is not set: no rate limit is "(none)", no list of addresses "(any)" (anywhere). */
const unset = (field: string) => (field === "allowedFrom" ? "(any)" : "(none)");

const stateNames: Record<number, string> = { [OperationState.ENABLED]: "enabled", [OperationState.STOPPED]: "stopped" };

/** A secret to show once: whose, and what it is for (an account's secret, or the one its alerts are signed with). */
export interface ShownSecret {
  readonly key: string;
  readonly secret: string;
  readonly title?: string;
  readonly note?: string;
}

/** How long a new secret keeps the one it replaces working: not at all, an hour, a day or a week (seconds). */
function keepOldSelect(name: string): HTMLSelectElement {
  return h(
    "select",
    { name },
    h("option", { value: "0" }, "not at all"),
    h("option", { value: "3600" }, "1 hour"),
    h("option", { value: "86400" }, "1 day"),
    h("option", { value: "604800" }, "7 days"),
  );
}

/** A secret shown once, with a copy button; it is not kept anywhere after the panel is closed. */
function secretPanel({ key, secret, title = `New secret of ${key}`, note = "This secret is shown once. Store it now: the gateway keeps only a hash of it." }: ShownSecret): HTMLElement {
  const status = h("span", { "aria-live": "polite", class: "muted" });
  const panel = h(
    "section",
    { class: "card secret", "aria-label": title },
    h("h2", {}, title),
    h("p", {}, note),
    h("dl", {}, h("dt", {}, "Key"), h("dd", {}, h("code", { "data-testid": "new-key" }, key)), h("dt", {}, "Secret"), h("dd", {}, h("code", { "data-testid": "new-secret" }, secret))),
    h(
      "button",
      {
        type: "button",
        onclick: async () => {
          try {
            await navigator.clipboard.writeText(secret);
            status.textContent = "Copied.";
          } catch {
            status.textContent = "The browser refused the clipboard; select the secret and copy it.";
          }
        },
      },
      "Copy secret",
    ),
    " ",
    h("button", { type: "button", class: "secondary", onclick: () => panel.remove() }, "I have stored it"),
    " ",
    status,
  );
  return panel;
}

/**
 * The rate fields of a request, from the form's text (`10/s`, `600/min`,
 * empty or `none`) and burst (empty: the rate's calls): nothing for a new
 * account without a limit, `calls` 0 for a plan without one (which removes
 * any), or the rate. Text that names no rate is refused here, as the
 * server would refuse it.
 */
function rateRequest(text: string | undefined, burst: string | undefined, plan: boolean): { rate?: { calls: number; seconds: number; burst: number } } {
  const t = (text ?? "").trim();
  let rate;
  try {
    rate = parseRate(t === "" ? "none" : t, burst ? Number(burst) : undefined);
  } catch (e) {
    throw new ConnectError((e as Error).message, Code.InvalidArgument);
  }
  if (rate === undefined) return plan ? { rate: { calls: 0, seconds: 0, burst: 0 } } : {};
  return { rate };
}

function createForm(shell: Shell, done: (key: string, secret: string, repeated: boolean) => void): HTMLElement {
  const status = h("div", { "aria-live": "polite" });
  const ops = shell.operations.map((op) => ({ op, box: h("input", { type: "checkbox", name: `op:${op.id}`, checked: true }), price: h("input", { name: `price:${op.id}`, inputmode: "decimal", placeholder: "free" }) }));
  const form = h(
    "form",
    {
      class: "card",
      "aria-labelledby": "create-title",
      onsubmit: async (e: Event) => {
        e.preventDefault();
        const v = formValues(form);
        const prices: Record<string, string> = {};
        for (const { op } of ops) if (v[`price:${op.id}`]) prices[op.id] = v[`price:${op.id}`]!;
        try {
          const res = await shell.client.createAccount({
            name: v.name ?? "",
            externalId: v.externalId ?? "",
            ...(v.dailyMax ? { dailyMax: BigInt(v.dailyMax) } : {}),
            ...(v.concurrency ? { concurrency: Number(v.concurrency) } : {}),
            ...rateRequest(v.rate, v.burst, false),
            ...(v.balance ? { balance: v.balance } : {}),
            expires: v.expires ?? "",
            zone: v.zone ?? "",
            operations: ops.filter((o) => o.box.checked).map((o) => o.op.id),
            prices,
          });
          form.reset();
          status.replaceChildren();
          done(res.account!.key, res.secret, res.repeated);
        } catch (err) {
          if (isUnauthenticated(err)) return shell.signedOut(inWords(err));
          status.replaceChildren(notice("error", err instanceof RangeError || err instanceof SyntaxError ? `Not accepted: ${err.message}` : inWords(err)));
        }
      },
    },
    h("h2", { id: "create-title" }, "New account"),
    h(
      "div",
      { class: "grid" },
      field("Name", h("input", { name: "name", required: true, maxlength: 200 })),
      field("External id", h("input", { name: "externalId", maxlength: 128, pattern: "[!-~]+" }), "your own id for it (a customer id); sent again, it finds this account, not a new one"),
      field("Calls a day", h("input", { name: "dailyMax", inputmode: "numeric", pattern: "[0-9]+", placeholder: "10000" })),
      field("Calls at once", h("input", { name: "concurrency", inputmode: "numeric", pattern: "[0-9]+", placeholder: "20" })),
      field("Rate limit", h("input", { name: "rate", placeholder: "none" }), "calls per s, min or h: 10/s, 600/min"),
      field("Burst", h("input", { name: "burst", inputmode: "numeric", pattern: "[0-9]+" }), "at once after a quiet spell; empty: the rate's calls"),
      field("Prepaid balance", h("input", { name: "balance", inputmode: "decimal", placeholder: "not billed by balance" })),
      field("Last day", h("input", { name: "expires", type: "date" }), "empty: a year from today"),
      field("Time zone", h("input", { name: "zone", placeholder: "Asia/Shanghai" })),
    ),
    h(
      "fieldset",
      {},
      h("legend", {}, "Operations and prices per charged call"),
      ...ops.map(({ op, box, price }) => h("div", { class: "op-row" }, h("label", {}, box, ` ${op.id}`), field(`Price of ${op.id}`, price))),
    ),
    h("button", { type: "submit" }, "Create account"),
    status,
  );
  return form;
}

/** Accounts whose history is open: it stays open, and is read again, when the detail is drawn again after an action. */
const historyOpen = new Set<string>();

/** "TOP_UP" as "top-up". */
const kindName = (kind: AccountEventKind) => (AccountEventKind[kind] ?? "unknown").toLowerCase().replace(/_/g, "-");

/**
 * A section of an account's detail that is read only when opened, and stays
 * open (`opened`) while the detail is drawn again: its summary, then what
 * `read` makes of the AdminService's answer, or the error in words.
 */
function lazySection(
  shell: Shell,
  options: { readonly className: string; readonly summary: string; readonly reading: string; readonly opened: Set<string>; readonly key: string; readonly read: () => Promise<HTMLElement> },
): HTMLElement {
  const { key, opened } = options;
  const body = h("div", {}, h("p", { class: "muted" }, options.reading));
  const details = h("details", { class: options.className, open: opened.has(key) }, h("summary", {}, options.summary), body);
  let read = false;
  const load = async () => {
    read = true;
    try {
      body.replaceChildren(await options.read());
    } catch (err) {
      if (isUnauthenticated(err)) return shell.signedOut(inWords(err));
      body.replaceChildren(notice("error", inWords(err)));
    }
  };
  details.addEventListener("toggle", () => {
    if (!details.open) return void opened.delete(key);
    opened.add(key);
    if (!read) void load();
  });
  if (details.open) void load();
  return details;
}

/** A table with its caption and column heads. */
function table(caption: string, heads: readonly string[], rows: readonly HTMLElement[]): HTMLElement {
  return h("table", {}, h("caption", {}, caption), h("thead", {}, h("tr", {}, ...heads.map((t) => h("th", { scope: "col" }, t)))), h("tbody", {}, ...rows));
}

/** The account's history (GetAccountHistory), read when opened: when, what, who, and each setting's move. */
function historySection(shell: Shell, key: string): HTMLElement {
  return lazySection(shell, {
    className: "history",
    summary: "History",
    reading: "Reading the history…",
    opened: historyOpen,
    key,
    read: async () => {
      const { events } = await shell.client.getAccountHistory({ key });
      const rows = [...events].reverse().map((e) => {
        const created = e.kind === AccountEventKind.CREATED;
        const moves = e.changes.map((c) =>
          h("li", {}, h("code", {}, c.field), created || c.field === "secret" ? `: ${c.after}` : `: ${c.before || unset(c.field)} → ${c.after || unset(c.field)}`),
        );
        return h("tr", {}, h("td", {}, new Date(Number(e.atMs)).toLocaleString()), h("td", {}, kindName(e.kind)), h("td", {}, e.by || "(not recorded)"), h("td", {}, h("ul", {}, ...moves)));
      });
      return table(`${events.length} ${events.length === 1 ? "change" : "changes"}, newest first`, ["When", "What", "By", "Changed"], rows);
    },
  });
}

/** Shares of the daily maximum as the alerts form has them (`80, 100`, `90%`, `none`); a word that is not a whole number is refused here. */
function percents(text: string): number[] {
  const words = text.split(/[\s,%]+/).filter((w) => w !== "");
  if (words.length === 1 && words[0] === "none") return [];
  for (const w of words) if (!/^[0-9]{1,4}$/.test(w)) throw new ConnectError(`an alert's share of the day is a whole percent, not ${JSON.stringify(w)}`, Code.InvalidArgument);
  return words.map(Number);
}

/** Days before the key's last day, as the alerts form has them; a word that is not a whole number is refused here. */
function days(text: string): number {
  const t = text.trim();
  if (!/^[0-9]{1,3}$/.test(t)) throw new ConnectError(`an expiry alert comes a whole number of days before the key's last day, not ${JSON.stringify(t)}`, Code.InvalidArgument);
  return Number(t);
}

const alertsOpen = new Set<string>();

/** The account's alerts (ListAlerts), read when opened: what each told, and how its delivery went. */
function alertsSection(shell: Shell, key: string): HTMLElement {
  return lazySection(shell, {
    className: "alerts",
    summary: "Alerts told",
    reading: "Reading the alerts…",
    opened: alertsOpen,
    key,
    read: async () => {
      const { alerts } = await shell.client.listAlerts({ key, limit: 50 });
      if (alerts.length === 0) return h("p", { class: "muted" }, "No alerts told yet.");
      const when = (ms: bigint) => new Date(Number(ms)).toLocaleString();
      const rows = alerts.map((a) => {
        const what =
          a.type === "usage.threshold"
            ? `${a.percent}% of ${a.dailyMax} reached on ${a.day} (${a.calls} calls)`
            : a.type === "balance.low"
              ? `balance ${a.balance}, below ${a.below}`
              : `the key's last day is ${a.day} (${a.daysLeft} ${a.daysLeft === 1 ? "day" : "days"} left)`;
        const delivery =
          a.deliveredAtMs !== undefined
            ? `delivered ${when(a.deliveredAtMs)}`
            : a.nextAttemptMs !== undefined
              ? `attempt ${a.attempts + 1} at ${when(a.nextAttemptMs)}${a.lastError ? ` (${a.lastError})` : ""}`
              : `given up after ${a.attempts} (${a.lastError})`;
        return h("tr", {}, h("td", {}, when(a.createdAtMs)), h("td", {}, h("code", {}, a.id)), h("td", {}, what), h("td", {}, delivery));
      });
      return table(`${alerts.length} ${alerts.length === 1 ? "alert" : "alerts"}, newest first`, ["When", "Id", "What", "Delivery"], rows);
    },
  });
}

/**
 * An account's detail. `refresh` lists the accounts again and says what was done; `begun` clears what the last
 * action said, so an action that says the same ("Set plan: done." twice) is not taken as done before it is.
 */
function accountDetail(shell: Shell, account: Account, refresh: (message?: string, secret?: ShownSecret) => Promise<void>, begun: () => void): HTMLElement {
  const status = h("div", { "aria-live": "polite" });
  // `said`: what the action did, where "done" would not say it (a top-up whose reference was used: nothing added).
  const act = (label: string, run: () => Promise<unknown>, after?: (result: unknown) => ShownSecret | undefined, said?: (result: unknown) => string | undefined) => async () => {
    begun();
    status.replaceChildren(notice("ok", `${label}…`));
    try {
      const result = await run();
      await refresh(`${label}: ${said?.(result) ?? "done."}`, after?.(result));
    } catch (err) {
      if (isUnauthenticated(err)) return shell.signedOut(inWords(err));
      status.replaceChildren(notice("error", inWords(err)));
    }
  };
  const key = account.key;
  const stopped = account.status === AccountStatus.STOPPED;
  const opRows = shell.operations.map((op) => {
    const state = account.operations[op.id];
    const label = state === undefined ? "not added" : (stateNames[state] ?? "unknown");
    const buttons =
      state === OperationState.ENABLED
        ? [h("button", { type: "button", class: "secondary", onclick: act(`Stop ${op.id}`, () => shell.client.setOperation({ key, operation: op.id, state: OperationState.STOPPED })) }, `Disable ${op.id}`)]
        : [h("button", { type: "button", class: "secondary", onclick: act(`Enable ${op.id}`, () => shell.client.setOperation({ key, operation: op.id, state: OperationState.ENABLED })) }, `Enable ${op.id}`)];
    return h("tr", {}, h("td", {}, op.id), h("td", {}, label), h("td", {}, account.prices[op.id] ?? "free"), h("td", {}, ...buttons));
  });
  const plan = h(
    "form",
    {
      class: "inline",
      "aria-label": `Plan of ${key}`,
      onsubmit: (e: Event) => {
        e.preventDefault();
        const v = formValues(plan);
        void act("Set plan", () =>
          shell.client.setPlan({
            key,
            ...(v.dailyMax ? { dailyMax: BigInt(v.dailyMax) } : {}),
            ...(v.concurrency ? { concurrency: Number(v.concurrency) } : {}),
            ...rateRequest(v.rate, v.burst, true),
            // As listed (none, or any: anywhere); the gateway checks each and records only a change.
            allowedFrom: { addresses: v.allowedFrom === "any" ? [] : (v.allowedFrom ?? "").split(/[\s,]+/).filter((s) => s !== "") },
            ...(v.expires ? { expires: v.expires } : {}),
            ...(v.zone ? { zone: v.zone } : {}),
          }),
        )();
      },
    },
    field("Calls a day", h("input", { name: "dailyMax", inputmode: "numeric", value: String(account.dailyMax) })),
    field("Calls at once", h("input", { name: "concurrency", inputmode: "numeric", value: String(account.concurrency) })),
    field("Rate limit", h("input", { name: "rate", value: account.rate ? formatRate({ ...account.rate, burst: account.rate.calls }) : "none" }), "10/s, 600/min, 5000/h or none"),
    field("Burst", h("input", { name: "burst", inputmode: "numeric", value: account.rate ? String(account.rate.burst) : "" })),
    field("Calls from", h("input", { name: "allowedFrom", value: account.allowedFrom ? account.allowedFrom.addresses.join(", ") : "any" }), "any, or addresses and networks: 203.0.113.7, 10.0.0.0/8"),
    field("Last day", h("input", { name: "expires", type: "date", value: account.expires })),
    field("Time zone", h("input", { name: "zone", value: account.zone })),
    h("button", { type: "submit" }, "Set plan"),
  );
  const topUp = h(
    "form",
    {
      class: "inline",
      "aria-label": `Top up ${key}`,
      onsubmit: (e: Event) => {
        e.preventDefault();
        const { amount = "", reference = "" } = formValues(topUp);
        const repeated = (r: unknown) => ((r as TopUpResponse).repeated ? `already made with reference ${reference}; nothing added.` : undefined);
        void act(`Top up ${amount}`, () => shell.client.topUp({ key, amount, reference: reference.trim() }), undefined, repeated)();
      },
    },
    field("Amount", h("input", { name: "amount", inputmode: "decimal", required: true })),
    field("Reference", h("input", { name: "reference", autocomplete: "off" }), "the payment it is for (optional): one top-up per reference"),
    h("button", { type: "submit" }, "Top up"),
  );
  const alertSecret = (r: unknown): ShownSecret | undefined => {
    const made = (r as SetAlertsResponse).secret;
    return made ? { key, secret: made, title: `Alert secret of ${key}`, note: "This alert secret is shown once. Give it to the receiver: it checks each alert's Gateway-Signature with it." } : undefined;
  };
  // How long a new alert secret keeps the one it replaces signing (SetAlerts' keepOldSeconds).
  const keepOldAlert = keepOldSelect("keepOldAlert");
  const oldAlertSecretUntil = account.alerts?.oldSecretUntilMs === undefined ? undefined : new Date(Number(account.alerts.oldSecretUntilMs));
  const alerts = h(
    "form",
    {
      class: "inline",
      "aria-label": `Alerts of ${key}`,
      onsubmit: (e: Event) => {
        e.preventDefault();
        const { url = "", at = "", below = "", expiry = "" } = formValues(alerts);
        void act(
          "Set alerts",
          () =>
            shell.client.setAlerts({
              key,
              alerts: { url: url.trim(), usagePercents: percents(at), ...(below.trim() !== "" ? { balanceBelow: below.trim() } : {}), ...(expiry.trim() !== "" ? { expiryDays: days(expiry) } : {}) },
            }),
          alertSecret,
        )();
      },
    },
    field("Alert URL", h("input", { name: "url", type: "url", value: account.alerts?.url ?? "", placeholder: "https://…" }), "told by a signed POST"),
    field("At % of the day", h("input", { name: "at", value: account.alerts ? account.alerts.usagePercents.join(", ") || "none" : "80, 100" }), "whole percents, or none"),
    field("Balance below", h("input", { name: "below", inputmode: "decimal", value: account.alerts?.balanceBelow ?? "" }), "an amount (optional)"),
    field("Days before expiry", h("input", { name: "expiry", inputmode: "numeric", value: account.alerts?.expiryDays === undefined ? "" : String(account.alerts.expiryDays) }), "the key's last day (optional)"),
    h("button", { type: "submit" }, "Set alerts"),
    account.alerts !== undefined &&
      h(
        "button",
        {
          type: "button",
          class: "secondary",
          onclick: act("Send a test alert", () => shell.client.testAlerts({ key }), undefined, (r) => {
            const t = r as TestAlertsResponse;
            return t.delivered ? `${t.id} delivered (HTTP ${t.status}, ${t.elapsedMs} ms).` : `${t.id} not delivered: ${t.error} (${t.elapsedMs} ms).`;
          }),
        },
        "Send a test alert",
      ),
    account.alerts !== undefined && h("button", { type: "button", class: "secondary", onclick: act("Turn alerts off", () => shell.client.setAlerts({ key })) }, "Turn alerts off"),
    account.alerts !== undefined && field("Keep the old alert secret", keepOldAlert),
    account.alerts !== undefined &&
      h(
        "button",
        {
          type: "button",
          class: "secondary",
          onclick: () => {
            const keepOldSeconds = Number(keepOldAlert.value);
            const old = keepOldSeconds === 0 ? "Alerts stop being signed with the current one at once." : `Alerts are signed with the current one too for ${keepOldAlert.selectedOptions[0]!.text}.`;
            if (!confirm(`Make a new alert secret for ${key}? ${old}`)) return;
            void act("New alert secret", () => shell.client.setAlerts({ key, alerts: account.alerts, newSecret: true, keepOldSeconds }), alertSecret)();
          },
        },
        "New alert secret",
      ),
    oldAlertSecretUntil !== undefined && h("p", { class: "muted", "data-testid": "old-alert-secret-until" }, `Alerts are signed with the replaced alert secret too until ${oldAlertSecretUntil.toLocaleString()}.`),
  );
  // How long a rotation keeps the secret it replaces working (RotateSecret's keepOldSeconds).
  const keepOld = keepOldSelect("keepOld");
  const oldSecretUntil = account.oldSecretUntilMs === undefined ? undefined : new Date(Number(account.oldSecretUntilMs));
  return h(
    "section",
    { class: "detail", "aria-label": `Account ${key}` },
    h(
      "div",
      { class: "actions" },
      stopped
        ? h("button", { type: "button", onclick: act("Resume", () => shell.client.resumeAccount({ key })) }, "Resume account")
        : h("button", { type: "button", class: "danger", onclick: act("Stop", () => shell.client.stopAccount({ key })) }, "Stop account"),
      field("Keep the old secret", keepOld),
      h(
        "button",
        {
          type: "button",
          class: "secondary",
          onclick: () => {
            const keepOldSeconds = Number(keepOld.value);
            const old = keepOldSeconds === 0 ? "The current secret stops working at once." : `The current secret keeps working for ${keepOld.selectedOptions[0]!.text}.`;
            if (!confirm(`Rotate the secret of ${key}? ${old}`)) return;
            void act("Rotate secret", () => shell.client.rotateSecret({ key, keepOldSeconds }), (r) => ({ key, secret: (r as { secret: string }).secret }))();
          },
        },
        "Rotate secret",
      ),
    ),
    oldSecretUntil !== undefined && h("p", { class: "muted", "data-testid": "old-secret-until" }, `The replaced secret still works until ${oldSecretUntil.toLocaleString()}.`),
    h("table", {}, h("caption", {}, "Operations"), h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "Operation"), h("th", { scope: "col" }, "State"), h("th", { scope: "col" }, "Price"), h("th", { scope: "col" }, "Change"))), h("tbody", {}, ...opRows)),
    plan,
    account.balance !== undefined ? topUp : h("p", { class: "muted" }, "Not billed by balance."),
    alerts,
    status,
    alertsSection(shell, key),
    historySection(shell, key),
  );
}

/** Accounts the table asks for at a time; "Show more" asks for the next as many. */
const accountsPageSize = 100;

export async function accountsView(main: HTMLElement, shell: Shell): Promise<void> {
  // The pages listed so far, under the search and status shown: the gateway filters and pages (ListAccounts).
  let accounts: Account[] = [];
  let total = 0;
  let nextPageToken = "";
  let asked = 0;
  let open: string | undefined;
  const search = h("input", { type: "search", name: "search", placeholder: "name or key" });
  const statusFilter = h("select", { name: "status" }, h("option", { value: "all" }, "All"), h("option", { value: "active" }, "Active"), h("option", { value: "stopped" }, "Stopped"));
  const news = h("div", { "aria-live": "polite" });
  const secrets = h("div");
  const list = h("div", { class: "list" });

  const render = () => {
    const rows = accounts.flatMap((a) => {
      const row = h(
        "tr",
        { "data-key": a.key },
        h(
          "td",
          {},
          h("button", { type: "button", class: "link", "aria-expanded": open === a.key ? "true" : "false", onclick: () => ((open = open === a.key ? undefined : a.key), render()) }, a.name || "(no name)"),
          ...(a.externalId !== "" ? [h("div", { class: "muted" }, `external id ${a.externalId}`)] : []),
        ),
        h("td", {}, h("code", {}, a.key)),
        h("td", {}, h("span", { class: `badge ${a.status === AccountStatus.ACTIVE ? "active" : "stopped"}` }, a.status === AccountStatus.ACTIVE ? "active" : "stopped")),
        h("td", { class: "num" }, String(a.dailyMax)),
        h("td", { class: "num" }, String(a.concurrency)),
        h("td", {}, a.rate ? formatRate(a.rate) : "—"),
        h("td", { class: "num" }, a.balance ?? "—"),
        h("td", {}, a.expires),
      );
      return open === a.key ? [row, h("tr", { class: "detail-row" }, h("td", { colspan: 8 }, accountDetail(shell, a, refresh, () => news.replaceChildren())))] : [row];
    });
    list.replaceChildren(
      h(
        "table",
        { class: "accounts" },
        h("caption", {}, `${accounts.length} of ${total} ${search.value.trim() !== "" || statusFilter.value !== "all" ? "matching " : ""}accounts`),
        h("thead", {}, h("tr", {}, ...["Name", "Key", "Status", "Calls a day", "At once", "Rate", "Balance", "Last day"].map((t) => h("th", { scope: "col" }, t)))),
        h("tbody", {}, ...rows),
      ),
      nextPageToken === "" ? "" : h("button", { type: "button", class: "secondary", onclick: () => void load(true).then((latest) => latest && render()) }, `Show ${Math.min(accountsPageSize, total - accounts.length)} more`),
    );
  };

  /**
   * Lists the first page again (as many accounts as are shown, so an action leaves the table as it was), or the
   * next. False when a later listing was asked for meanwhile: only the latest answer is shown, whichever comes last.
   */
  const load = async (more: boolean): Promise<boolean> => {
    const n = ++asked;
    const want = statusFilter.value;
    const r = await shell.client.listAccounts({
      query: search.value.trim(),
      status: want === "active" ? AccountStatus.ACTIVE : want === "stopped" ? AccountStatus.STOPPED : AccountStatus.UNSPECIFIED,
      pageSize: more ? accountsPageSize : Math.min(1000, Math.max(accountsPageSize, accounts.length)),
      pageToken: more ? nextPageToken : "",
    });
    if (n !== asked) return false;
    accounts = more ? [...accounts, ...r.accounts] : r.accounts;
    total = r.totalSize;
    nextPageToken = r.nextPageToken;
    return true;
  };

  const refresh = async (message?: string, secret?: ShownSecret) => {
    if (!(await load(false))) return;
    if (message) news.replaceChildren(notice("ok", message));
    if (secret) secrets.replaceChildren(secretPanel(secret));
    render();
  };

  // A new search starts from the first page, once typing pauses.
  let typing: ReturnType<typeof setTimeout> | undefined;
  search.addEventListener("input", () => {
    clearTimeout(typing);
    typing = setTimeout(() => void refresh(), 150);
  });
  statusFilter.addEventListener("change", () => void refresh());
  main.replaceChildren(
    h("h1", {}, "Accounts"),
    secrets,
    news,
    h("div", { class: "filters", role: "search" }, field("Search accounts", search), field("Status", statusFilter)),
    list,
    createForm(shell, (key, secret, repeated) => {
      open = key;
      // Made before by the same request (its external id): its secret was shown then and is not kept.
      if (repeated) void refresh(`Account ${key} was made before with this external id and these settings; its secret was shown then (Rotate secret makes a new one).`);
      else void refresh(`Account ${key} created.`, { key, secret });
    }),
  );
  await refresh();
}
