// Live calls: every call as the ledger commits it, newest first, on one
// WatchCalls stream started from now (nothing of the ledger before is read).
// A pause ends the stream and keeps its cursor, so on resume the calls
// committed meanwhile come at once, none lost; a stream cut (a replica
// draining, the network) resumes from its cursor the same way, after a wait
// that grows while it keeps failing. Leaving the screen ends the stream.
// Choosing an account has the gateway send only its calls (WatchCalls'
// `account`): on a busy gateway a page of every call costs the replica a
// part of each call's work, and one of a quiet account almost nothing.
import { Code, ConnectError } from "@connectrpc/connect";
import type { UsageRow } from "../gen/gateway/admin/v1/admin_pb.js";
import { Charge } from "../gen/gateway/catalogue/v1/status_pb.js";
import { inWords } from "./api.ts";
import { callCells, callColumns, callNumeric } from "./call-rows.ts";
import { accountPicker } from "./account-picker.ts";
import { h, notice } from "./dom.ts";
import type { Shell } from "./main.ts";

/** Calls kept in the page, the newest: what a filter changed looks through. */
const kept = 1000;
/** Calls the table shows, the newest that match the filter. */
const shownRows = 200;
/** The longest wait before trying a failed stream again. */
const maxRetryMs = 15_000;

export async function liveView(main: HTMLElement, shell: Shell): Promise<void> {
  const leaving = shell.leaving();
  const recent: UsageRow[] = [];
  const totals = { calls: 0, refused: 0, charged: 0, hits: 0 };
  /** When messages came and how many calls each brought: the rate over the last 10 s. */
  const arrivals: { readonly at: number; readonly calls: number }[] = [];

  const picker = await accountPicker(shell, { name: "account", all: "All accounts" });
  const account = picker.select;
  const refusedOnly = h("input", { type: "checkbox", name: "refused" });
  const pause = h("button", { type: "button", class: "secondary" }, "Pause");
  const clear = h("button", { type: "button", class: "secondary" }, "Clear");
  const state = h("div", { "aria-live": "polite" });
  const heard = h("p", { class: "muted", "data-testid": "live-heard" });
  const body = h("tbody");
  const caption = h("caption", {});
  const figure = (label: string, testid: string) => {
    const value = h("strong", {}, "0");
    return { box: h("div", { class: "figure", "data-testid": testid }, h("span", { class: "muted" }, label), value), value };
  };
  const figures = { calls: figure("Calls", "live-calls"), refused: figure("Refused", "live-refused"), charged: figure("Charged", "live-charged"), hits: figure("From the cache", "live-hits"), rate: figure("A second, last 10 s", "live-rate") };

  const matches = (r: UsageRow) => !refusedOnly.checked || r.errorCode !== 0;
  const rowOf = (r: UsageRow) =>
    h("tr", { "data-request-id": r.requestId, class: r.errorCode !== 0 ? "refused" : undefined }, ...callCells(r).map((c, i) => h("td", callNumeric.includes(i) ? { class: "num" } : {}, c)));
  const told = () => {
    const n = body.rows.length;
    caption.textContent = n === 0 ? (recent.length === 0 ? "No call since this page began following." : "No call of this filter among the latest.") : `The ${n} latest ${n === 1 ? "call" : "calls"}${refusedOnly.checked ? " of this filter" : ""}, newest first`;
  };
  /** The table again from the calls kept: after a filter changes. */
  const redraw = () => {
    body.replaceChildren(...recent.filter(matches).slice(-shownRows).reverse().map(rowOf));
    told();
  };
  const figuresNow = () => {
    const now = performance.now();
    const since = arrivals.findIndex((a) => a.at >= now - 10_000);
    arrivals.splice(0, since < 0 ? arrivals.length : since);
    figures.calls.value.textContent = totals.calls.toLocaleString();
    figures.refused.value.textContent = totals.refused.toLocaleString();
    figures.charged.value.textContent = totals.charged.toLocaleString();
    figures.hits.value.textContent = totals.calls === 0 ? "0" : `${totals.hits.toLocaleString()} (${Math.round((totals.hits / totals.calls) * 100)}%)`;
    figures.rate.value.textContent = (arrivals.reduce((n, a) => n + a.calls, 0) / 10).toFixed(1);
  };
  const add = (calls: readonly UsageRow[]) => {
    const now = performance.now();
    arrivals.push({ at: now, calls: calls.length });
    for (const r of calls) {
      totals.calls++;
      if (r.errorCode !== 0) totals.refused++;
      if (r.charge === Charge.CHARGED) totals.charged++;
      if (r.cacheHit) totals.hits++;
    }
    recent.push(...calls.slice(-kept));
    if (recent.length > kept) recent.splice(0, recent.length - kept);
    // A busy gateway sends up to a page of calls a message (1,000): only the rows that stay shown are made.
    const fresh = calls.filter(matches).slice(-shownRows).reverse();
    body.prepend(...fresh.map(rowOf));
    while (body.rows.length > shownRows) body.lastElementChild!.remove();
    figuresNow();
    told();
  };
  refusedOnly.addEventListener("change", redraw);
  const cleared = () => {
    recent.length = 0;
    arrivals.length = 0;
    Object.assign(totals, { calls: 0, refused: 0, charged: 0, hits: 0 });
    figuresNow();
    redraw();
  };
  clear.addEventListener("click", cleared);
  // Another account: the page starts again with its calls, from where the stream stood, the gateway sending only them.
  account.addEventListener("change", () => {
    cleared();
    restart = true;
    stream?.abort();
    wake?.();
  });
  // The rate falls to 0 while no call comes.
  const ticker = setInterval(figuresNow, 1000);
  leaving.addEventListener("abort", () => clearInterval(ticker), { once: true });

  let cursor = "";
  let paused = false;
  let restart = false;
  let stream: AbortController | undefined;
  let wake: (() => void) | undefined;
  /** Waits `ms`, or until woken (resume) or the screen is left. */
  const sleep = (ms: number) =>
    new Promise<void>((resolve) => {
      const done = () => {
        clearTimeout(timer);
        leaving.removeEventListener("abort", done);
        wake = undefined;
        resolve();
      };
      const timer = setTimeout(done, ms);
      wake = done;
      leaving.addEventListener("abort", done, { once: true });
    });
  const say = (kind: "ok" | "error", text: string) => state.replaceChildren(notice(kind, text));
  pause.addEventListener("click", () => {
    paused = !paused;
    pause.textContent = paused ? "Resume" : "Pause";
    if (paused) {
      stream?.abort();
      say("ok", `Paused at ${new Date().toLocaleTimeString()}: the calls committed meanwhile come when you resume.`);
    } else wake?.();
  });

  const follow = async () => {
    let failures = 0;
    while (!leaving.aborted) {
      if (paused) {
        await sleep(2 ** 30);
        continue;
      }
      stream = new AbortController();
      const signal = AbortSignal.any([leaving, stream.signal]);
      let following = false;
      try {
        // From now the first time (and after retention passed the cursor); from the last cursor after a pause or a cut.
        restart = false;
        const from = cursor === "" ? { fromNow: true } : { cursor };
        for await (const m of shell.client.watchCalls({ ...from, account: account.value }, { signal })) {
          cursor = m.cursor;
          failures = 0;
          heard.textContent = `Last heard from the gateway at ${new Date().toLocaleTimeString()} (it says it is there at least every 15 s).`;
          if (!following) {
            following = true;
            say("ok", "Following: each call appears as the ledger commits it.");
          }
          if (m.calls.length > 0) add(m.calls);
        }
        // Ended by the gateway (a replica draining): on again from the cursor, on whichever replica answers.
        failures++;
        say("ok", "The gateway ended the stream (a replica restarting); resuming from where it stopped…");
        await sleep(1000);
      } catch (e) {
        if (leaving.aborted) return;
        if (paused || restart) continue;
        const err = ConnectError.from(e);
        if (err.code === Code.Unauthenticated) return shell.signedOut(inWords(err));
        if (err.code === Code.OutOfRange) {
          cursor = "";
          say("error", "The calls after where this page stopped were folded past retention before it read them: following from now. The Usage screen has their totals.");
          continue;
        }
        failures++;
        const wait = Math.min(maxRetryMs, 1000 * 2 ** (failures - 1));
        say("error", `${inWords(err)} Trying again in ${wait / 1000} s, from where it stopped: no call is missed.`);
        await sleep(wait);
      }
    }
  };

  main.replaceChildren(
    h("h1", {}, "Live calls"),
    h(
      "p",
      { class: "muted" },
      "Every call of every replica as the ledger commits it, newest first, from the moment this page began following (WatchCalls from now). Pause holds the stream's place: the calls made meanwhile come on resume. The figures count every call seen here since the account was chosen, whatever the refusals filter; with an account chosen, the gateway sends only its calls.",
    ),
    h("div", { class: "figures" }, ...Object.values(figures).map((f) => f.box)),
    h("div", { class: "filters live-controls" }, ...picker.fields, h("label", { class: "check" }, refusedOnly, " Refusals only"), h("div", { class: "actions" }, pause, clear)),
    state,
    heard,
    h("div", { class: "list" }, h("table", { class: "live" }, caption, h("thead", {}, h("tr", {}, ...callColumns.map((t) => h("th", { scope: "col" }, t)))), body)),
  );
  say("ok", "Connecting…");
  told();
  void follow();
}
