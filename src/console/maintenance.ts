// Maintenance: each operation's state (serving, or under maintenance: 4009
// for every account), a switch for each, and every switch made, newest
// first, with who made it. Every figure is GetMaintenanceHistory's. Beneath,
// a purge of the response cache (PurgeCache): an item, an operation's items,
// or everything.
import { inWords, isUnauthenticated } from "./api.ts";
import { field, h, notice } from "./dom.ts";
import type { Shell } from "./main.ts";

export async function maintenanceView(main: HTMLElement, shell: Shell): Promise<void> {
  const news = h("div", { "aria-live": "polite" });
  const body = h("div");

  const switchTo = (operation: string, maintenance: boolean) => async () => {
    if (maintenance && !confirm(`Put ${operation} under maintenance? Every account's calls of it answer 4009 until it is ended.`)) return;
    // What the last switch said goes, and this one's is said once the table shows it: a notice is never ahead of the page.
    news.replaceChildren();
    try {
      await shell.client.setMaintenance({ operation, maintenance });
      await draw();
      news.replaceChildren(notice("ok", `${operation}: ${maintenance ? "under maintenance" : "serving again"}.`));
    } catch (err) {
      if (isUnauthenticated(err)) return shell.signedOut(inWords(err));
      news.replaceChildren(notice("error", inWords(err)));
    }
  };

  const draw = async () => {
    const { changes, operations } = await shell.client.getMaintenanceHistory({});
    const under = new Set(operations);
    const rows = shell.operations.map((op) => {
      const on = under.has(op.id);
      return h(
        "tr",
        { "data-operation": op.id },
        h("td", {}, op.id),
        h("td", {}, h("span", { class: `badge ${on ? "stopped" : "active"}` }, on ? "under maintenance" : "serving")),
        h(
          "td",
          {},
          on
            ? h("button", { type: "button", onclick: switchTo(op.id, false) }, `End maintenance of ${op.id}`)
            : h("button", { type: "button", class: "danger", onclick: switchTo(op.id, true) }, `Put ${op.id} under maintenance`),
        ),
      );
    });
    const history = [...changes].reverse().map((c) =>
      h("tr", {}, h("td", {}, new Date(Number(c.atMs)).toLocaleString()), h("td", {}, c.operation), h("td", {}, c.maintenance ? "on" : "off"), h("td", {}, c.by || "(not recorded)")),
    );
    body.replaceChildren(
      h(
        "table",
        { class: "maintenance" },
        h("caption", {}, "Operations"),
        h("thead", {}, h("tr", {}, ...["Operation", "State", "Switch"].map((t) => h("th", { scope: "col" }, t)))),
        h("tbody", {}, ...rows),
      ),
      h(
        "table",
        { class: "maintenance-history" },
        h("caption", {}, changes.length === 0 ? "No switch recorded yet" : `${changes.length} ${changes.length === 1 ? "switch" : "switches"}, newest first`),
        h("thead", {}, h("tr", {}, ...["When", "Operation", "Maintenance", "By"].map((t) => h("th", { scope: "col" }, t)))),
        h("tbody", {}, ...history),
      ),
    );
  };

  main.replaceChildren(
    h("h1", {}, "Maintenance"),
    h("p", { class: "muted" }, "An operation under maintenance answers 4009 to every account, on every path, until it is ended."),
    news,
    body,
    purgeForm(shell),
  );
  await draw();
}

/** The cache purge: an operation (or every one) and an item (or every one); everything only when both are left open. */
function purgeForm(shell: Shell): HTMLElement {
  const operation = h("select", { name: "operation" }, h("option", { value: "" }, "every operation"), ...shell.operations.map((op) => h("option", { value: op.id }, op.id)));
  const numIid = h("input", { name: "num_iid", inputmode: "numeric", maxlength: 20, pattern: "[0-9]*" });
  const said = h("div", { "aria-live": "polite" });
  const purge = async (e: Event) => {
    e.preventDefault();
    const what = `${numIid.value.trim() === "" ? "every item" : `item ${numIid.value.trim()}`} of ${operation.value === "" ? "every operation" : operation.value}`;
    const everything = operation.value === "" && numIid.value.trim() === "";
    if (!confirm(everything ? "Drop the whole response cache? Every next call asks the source, and a paid provider is paid again." : `Drop the cached answers of ${what}? Their next calls ask the source again.`)) return;
    said.replaceChildren();
    try {
      const { entries } = await shell.client.purgeCache({ operation: operation.value, numIid: numIid.value.trim(), everything });
      said.replaceChildren(notice("ok", `Dropped ${entries} cached ${entries === 1n ? "answer" : "answers"} (${everything ? "the whole cache" : what}).`));
    } catch (err) {
      if (isUnauthenticated(err)) return shell.signedOut(inWords(err));
      said.replaceChildren(notice("error", inWords(err)));
    }
  };
  return h(
    "form",
    { class: "purge", onsubmit: purge },
    h("h2", {}, "Purge the response cache"),
    h("p", { class: "muted" }, "When the provider corrects an item: its stored answers (every language and variant) go, and its next call asks the source. With neither an operation nor an item, the whole cache goes."),
    field("Operation", operation),
    field("Item (num_iid)", numIid, "empty: every item"),
    h("button", { type: "submit", class: "danger" }, "Purge"),
    said,
  );
}
