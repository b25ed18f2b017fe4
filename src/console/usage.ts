// Usage: per account or overall, over a range of days (and, if asked, from
// one address or network, or one call by its request id): calls per day by operation and by charge class,
// the amount spent and the cache-hit share, as charts (uPlot) with the tables
// beneath, and where the calls came from. Every figure is QueryUsage's.
import uPlot from "uplot";
import "uplot/dist/uPlot.min.css";
import type { ListCallsResponse, QueryUsageResponse, UsageRow } from "../gen/gateway/admin/v1/admin_pb.js";
import { Charge } from "../gen/gateway/catalogue/v1/status_pb.js";
import { Code, ConnectError } from "@connectrpc/connect";
import { fourDigits, inWords, isUnauthenticated } from "./api.ts";
import { field, h, notice } from "./dom.ts";
import type { Shell } from "./main.ts";
import { accountPicker } from "./account-picker.ts";
import { csvText } from "../render/csv.ts";
import { callCells, callColumns, callNumeric } from "./call-rows.ts";

const chargeNames: Record<number, string> = { [Charge.CHARGED]: "charged", [Charge.UNCHARGED]: "uncharged", [Charge.IGNORED]: "ignored" };
const palette = ["#1f5fbf", "#d97706", "#15803d", "#b42318", "#7c3aed", "#0e7490"];

/** YYYY-MM-DD of a Date, in the browser's zone. */
const isoDay = (d: Date) => `${d.getFullYear()}-${String(d.getMonth() + 1).padStart(2, "0")}-${String(d.getDate()).padStart(2, "0")}`;

/** Every day from `from` to `to`, inclusive (at most a year of them). */
function daysBetween(from: string, to: string): string[] {
  const out: string[] = [];
  const end = Date.parse(`${to}T00:00:00Z`);
  for (let t = Date.parse(`${from}T00:00:00Z`); t <= end && out.length < 366; t += 86_400_000) out.push(new Date(t).toISOString().slice(0, 10));
  return out;
}

/** One series per name, a value per day (0 where QueryUsage has none). */
function perDay(days: string[], report: QueryUsageResponse, name: (t: QueryUsageResponse["totals"][number]) => string, value: (t: QueryUsageResponse["totals"][number]) => number): Map<string, number[]> {
  const index = new Map(days.map((d, i) => [d, i]));
  const series = new Map<string, number[]>();
  for (const t of report.totals) {
    const i = index.get(t.day);
    if (i === undefined) continue;
    const n = name(t);
    let s = series.get(n);
    if (s === undefined) series.set(n, (s = days.map(() => 0)));
    s[i]! += value(t);
  }
  return series;
}

/** A uPlot chart of named series over the days, sized to its box and resized with it. */
function chart(title: string, days: string[], series: Map<string, (number | null)[]>, unit: string): HTMLElement {
  const box = h("figure", { class: "chart", "aria-label": title }, h("figcaption", {}, title));
  if (series.size === 0) {
    box.append(h("p", { class: "muted" }, "No calls in this range."));
    return box;
  }
  const xs = days.map((d) => Date.parse(`${d}T00:00:00Z`) / 1000);
  const names = [...series.keys()];
  const opts: uPlot.Options = {
    width: 600,
    height: 220,
    tzDate: (ts) => uPlot.tzDate(new Date(ts * 1000), "Etc/UTC"),
    scales: { x: { time: true } },
    axes: [{}, { label: unit, size: 60 }],
    series: [{ label: "day", value: (_u, v) => (v === null ? "" : new Date(v * 1000).toISOString().slice(0, 10)) }, ...names.map((n, i) => ({ label: n, stroke: palette[i % palette.length]!, width: 2, points: { show: true } }))],
  };
  const holder = h("div");
  box.append(holder);
  const plot = new uPlot(opts, [xs, ...names.map((n) => series.get(n)!)] as uPlot.AlignedData, holder);
  const fit = () => plot.setSize({ width: Math.max(280, Math.floor(holder.clientWidth || box.clientWidth || 600)), height: 220 });
  new ResizeObserver(fit).observe(box);
  queueMicrotask(fit);
  return box;
}

/** The files the page holds for its download links: let go when the figures they hold are replaced. */
let held: string[] = [];

/** A link that saves `csv` as a file named `name` (made in the page: nothing is asked of the gateway again). */
function download(label: string, name: string, csv: string): HTMLElement {
  const url = URL.createObjectURL(new Blob([csv], { type: "text/csv;charset=utf-8" }));
  held.push(url);
  return h("a", { class: "download", href: url, download: name }, label);
}

function table(caption: string, head: string[], rows: (string | Node)[][], numeric: number[] = [], extra?: HTMLElement): HTMLElement {
  return h(
    "div",
    { class: "list" },
    extra,
    h(
      "table",
      {},
      h("caption", {}, caption),
      h("thead", {}, h("tr", {}, ...head.map((t) => h("th", { scope: "col" }, t)))),
      h("tbody", {}, ...rows.map((r) => h("tr", {}, ...r.map((c, i) => h("td", numeric.includes(i) ? { class: "num" } : {}, c))))),
    ),
  );
}

/** Calls a page of the usage view's "Latest calls" holds. */
const callsPage = 50;

/**
 * The newest calls of the filter, a page at a time: "Older calls" reads the next page (ListCalls, from where the last
 * ended) and adds it below, and the CSV link holds every call shown. `current`: whether this reading is still the one
 * shown (a page answered after the form was sent again is dropped).
 */
function callsTable(first: ListCallsResponse, filter: { account: string; from: string; to: string; clientIp: string; requestId: string }, name: string, current: () => boolean, shell: Shell): HTMLElement {
  const shown: UsageRow[] = [...first.calls];
  let token = first.nextPageToken;
  const csv = () =>
    csvText(
      ["request_id", "time", "day", "account", "operation", "code", "charge", "price", "cache_hit", "latency_us", "transport", "client_ip", "upstream_requests"],
      shown.map((r) => [r.requestId, new Date(Number(r.atMs)).toISOString(), r.day, r.account, r.operation, fourDigits(r.errorCode), chargeNames[r.charge] ?? "", r.price, r.cacheHit, r.latencyUs, r.transport, r.clientIp, r.upstreamRequests]),
    );
  const link = download("Download these calls (CSV)", name, csv());
  const box = table("Latest calls", callColumns, shown.map(callCells), callNumeric, link);
  const body = box.querySelector("tbody")!;
  const state = h("p", { class: "muted", "data-testid": "calls-shown" });
  const more = h("button", { type: "button" }, "Older calls");
  const told = () => {
    state.textContent = `${shown.length} ${shown.length === 1 ? "call" : "calls"} shown${token === "" ? ", every one of this filter" : ""}.`;
    more.hidden = token === "";
  };
  more.addEventListener("click", async () => {
    more.disabled = true;
    try {
      const page = await shell.client.listCalls({ ...filter, pageSize: callsPage, pageToken: token });
      if (!current()) return;
      shown.push(...page.calls);
      token = page.nextPageToken;
      body.append(...page.calls.map((r) => h("tr", {}, ...callCells(r).map((c, i) => h("td", callNumeric.includes(i) ? { class: "num" } : {}, c)))));
      URL.revokeObjectURL(link.getAttribute("href")!);
      const url = URL.createObjectURL(new Blob([csv()], { type: "text/csv;charset=utf-8" }));
      held.push(url);
      link.setAttribute("href", url);
      told();
    } catch (err) {
      if (isUnauthenticated(err)) return shell.signedOut(inWords(err));
      state.replaceChildren(notice("error", inWords(err)));
    } finally {
      more.disabled = false;
    }
  });
  told();
  box.append(state, more);
  return box;
}

export async function usageView(main: HTMLElement, shell: Shell, preset: { account?: string } = {}): Promise<void> {
  const picker = await accountPicker(shell, { name: "account", all: "All accounts", preset: preset.account });
  // Days are each account's own (its zone's midnight), which may be a day ahead of this browser's: the range ends tomorrow.
  const last = new Date(Date.now() + 86_400_000);
  const account = picker.select;
  const from = h("input", { type: "date", name: "from", value: isoDay(new Date(last.getTime() - 14 * 86_400_000)), required: true });
  const to = h("input", { type: "date", name: "to", value: isoDay(last), required: true });
  const address = h("input", { type: "text", name: "client_ip", placeholder: "any", autocomplete: "off", spellcheck: false, size: 18 });
  const requestId = h("input", { type: "text", name: "request_id", placeholder: "any", autocomplete: "off", spellcheck: false, size: 22 });
  const out = h("div", { "aria-live": "polite" });
  // Each reading is numbered: only the last one asked for is shown, whatever order the answers come in
  // (the first reading, of all accounts, answered after a later one asked for one account, showed all).
  let asked = 0;

  const show = async () => {
    const reading = ++asked;
    if (from.value > to.value) return out.replaceChildren(notice("error", "The first day is after the last."));
    out.replaceChildren(notice("ok", "Reading usage…"));
    let report: QueryUsageResponse;
    let latest: ListCallsResponse;
    // One call asked for by its id is found whatever its day.
    const one = requestId.value.trim() !== "";
    const filter = { account: account.value, from: one ? "" : from.value, to: one ? "" : to.value, clientIp: address.value.trim(), requestId: requestId.value.trim() };
    // Per address where the range allows: a range with more totals by address than one answer may hold is refused
    // (resource_exhausted), and read again without addresses, so its figures and charts still show.
    let perAddress = true;
    const totals = shell.client.queryUsage({ ...filter, byAddress: true }).catch((err: unknown) => {
      if (ConnectError.from(err).code !== Code.ResourceExhausted) throw err;
      perAddress = false;
      return shell.client.queryUsage({ ...filter, byAddress: false });
    });
    try {
      // The totals, and the first page of the calls (ListCalls), from which "Older calls" reads on.
      [report, latest] = await Promise.all([totals, shell.client.listCalls({ ...filter, pageSize: callsPage })]);
    } catch (err) {
      if (reading !== asked) return;
      if (isUnauthenticated(err)) return shell.signedOut(inWords(err));
      return out.replaceChildren(notice("error", inWords(err)));
    }
    if (reading !== asked) return;
    for (const url of held) URL.revokeObjectURL(url);
    held = [];
    const days = daysBetween(from.value, to.value);
    const byOperation = perDay(days, report, (t) => t.operation || "(no operation)", (t) => Number(t.calls));
    const byCharge = perDay(days, report, (t) => chargeNames[t.charge] ?? "other", (t) => Number(t.calls));
    const amount = perDay(days, report, () => "amount spent", (t) => Number(t.amount));
    const calls = perDay(days, report, () => "calls", (t) => Number(t.calls)).get("calls");
    const hits = perDay(days, report, () => "hits", (t) => Number(t.cacheHits)).get("hits");
    const share = new Map<string, (number | null)[]>();
    if (calls !== undefined) share.set("cache-hit share %", calls.map((c, i) => (c === 0 ? null : Math.round((1000 * (hits?.[i] ?? 0)) / c) / 10)));
    // Per address: the totals come per day, account, operation, code and address; summed here over the rest.
    const byAddress = new Map<string, { calls: bigint; charged: bigint; accounts: Set<string> }>();
    for (const t of report.totals) {
      const a = byAddress.get(t.clientIp) ?? { calls: 0n, charged: 0n, accounts: new Set<string>() };
      a.calls += t.calls;
      if (t.charge === Charge.CHARGED) a.charged += t.calls;
      if (t.account !== "") a.accounts.add(t.account);
      byAddress.set(t.clientIp, a);
    }
    const addresses = [...byAddress].sort(([x, a], [y, b]) => (a.calls === b.calls ? (x < y ? -1 : 1) : a.calls > b.calls ? -1 : 1));
    const hitShare = report.calls === 0n ? "—" : `${((100 * Number(report.cacheHits)) / Number(report.calls)).toFixed(1)}%`;
    out.replaceChildren(
      h(
        "div",
        { class: "figures" },
        ...[
          ["Calls", String(report.calls)],
          ["Charged calls", String(report.chargedCalls)],
          ["Amount spent", report.amount],
          ["Cache-hit share", hitShare],
          ["Upstream requests", String(report.upstreamRequests)],
        ].map(([label, value]) => h("div", { class: "figure" }, h("span", { class: "muted" }, label!), h("strong", { "data-testid": `figure-${label!.toLowerCase().replace(/\W+/g, "-")}` }, value!))),
      ),
      h(
        "div",
        { class: "charts" },
        chart("Calls per day by operation", days, byOperation, "calls"),
        chart("Calls per day by charge", days, byCharge, "calls"),
        chart("Amount spent per day", days, amount, "amount"),
        chart("Cache-hit share per day", days, share, "%"),
      ),
      perAddress
        ? table(
            "Calls by address",
            ["Address", "Calls", "Charged calls", "Accounts"],
            addresses.map(([ip, a]) => [ip === "" ? "(not kept)" : ip, String(a.calls), String(a.charged), a.accounts.size === 0 ? "(none)" : [...a.accounts].sort().join(", ")]),
            [1, 2],
          )
        : h(
            "p",
            { class: "notice ok", role: "status", "data-testid": "too-many-addresses" },
            "This range has too many totals by address to list them in one answer: the figures and charts above are whole, and the totals below are without addresses. Choose an account, fewer days or an address to see who called.",
          ),
      table(
        perAddress ? "Totals by day, account, operation, code and address" : "Totals by day, account, operation and code",
        ["Day", "Account", "Operation", "Code", "Charge", "Address", "Calls", "Cache hits", "Upstream requests", "Amount"],
        report.totals.map((t) => [t.day, t.account || "(none)", t.operation || "(none)", fourDigits(t.errorCode), chargeNames[t.charge] ?? "", perAddress ? t.clientIp || "(not kept)" : "(any)", String(t.calls), String(t.cacheHits), String(t.upstreamRequests), t.amount]),
        [6, 7, 8, 9],
        download(
          "Download the totals (CSV)",
          `usage-totals-${from.value}-${to.value}.csv`,
          csvText(
            ["day", "account", "operation", "code", "charge", "client_ip", "calls", "cache_hits", "amount", "upstream_requests"],
            report.totals.map((t) => [t.day, t.account, t.operation, fourDigits(t.errorCode), chargeNames[t.charge] ?? "", t.clientIp, t.calls, t.cacheHits, t.amount, t.upstreamRequests]),
          ),
        ),
      ),
      callsTable(latest, filter, `usage-calls-${from.value}-${to.value}.csv`, () => reading === asked, shell),
    );
  };

  const form = h(
    "form",
    {
      class: "inline card",
      "aria-label": "Usage range",
      onsubmit: (e: Event) => {
        e.preventDefault();
        void show();
      },
    },
    ...picker.fields,
    field("From", from, "in each account's own days"),
    field("To", to),
    field("From address", address, "an address or network, e.g. 10.0.0.0/8"),
    field("Request id", requestId, "one call, any day, as its status block names it"),
    h("button", { type: "submit" }, "Show usage"),
  );
  main.replaceChildren(h("h1", {}, "Usage"), form, out);
  await show();
}
