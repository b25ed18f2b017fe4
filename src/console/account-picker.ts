// An account chooser for the explorer and the usage page: a select of the accounts the gateway lists
// (ListAccounts, a page of them, not every account), and a search that asks it for others.
import type { Account } from "../gen/gateway/admin/v1/admin_pb.js";
import { field, h } from "./dom.ts";
import type { Shell } from "./main.ts";

/** Accounts the select offers at a time: the first made, or those a search finds. */
const offered = 100;

export interface AccountPicker {
  /** The account chosen (its key); "" for `all`. */
  readonly select: HTMLSelectElement;
  /** Its fields: "Account", the select; "Find by name or key", a search that refills it, saying when it offers only some. */
  readonly fields: readonly HTMLElement[];
}

const label = (a: Account) => `${a.name || "(no name)"} · ${a.key}${a.status === 2 ? " (stopped)" : ""}`;

/**
 * The select starts with the first accounts made (and `preset`, found by its
 * key wherever it is); a search fills it with those whose name or key holds
 * the text. Only the latest search's answer fills it, whichever comes last.
 */
export async function accountPicker(shell: Shell, options: { readonly name: string; readonly all?: string; readonly preset?: string | undefined; readonly required?: boolean }): Promise<AccountPicker> {
  const select = h("select", { name: options.name, required: options.required });
  const search = h("input", { type: "search", name: `${options.name}-search`, placeholder: "name or key", autocomplete: "off" });
  const hint = h("small", { class: "muted" });
  let asked = 0;
  const fill = async (query: string, preset?: string) => {
    const n = ++asked;
    const page = await shell.client.listAccounts({ query, pageSize: offered });
    let accounts = page.accounts;
    if (preset && !accounts.some((a) => a.key === preset)) {
      const found = (await shell.client.listAccounts({ query: preset, pageSize: offered })).accounts.find((a) => a.key === preset);
      if (found) accounts = [found, ...accounts];
    }
    if (n !== asked) return;
    select.replaceChildren(...(options.all !== undefined ? [h("option", { value: "" }, options.all)] : []), ...accounts.map((a) => h("option", { value: a.key, selected: a.key === preset }, label(a))));
    hint.textContent =
      page.totalSize > page.accounts.length
        ? `${page.accounts.length} of ${page.totalSize} ${query === "" ? "" : "matching "}accounts offered: search to find others.`
        : query !== "" && page.totalSize === 0
          ? "No account holds that."
          : "";
  };
  await fill("", options.preset);
  let typing: ReturnType<typeof setTimeout> | undefined;
  search.addEventListener("input", () => {
    clearTimeout(typing);
    typing = setTimeout(() => void fill(search.value.trim()), 150);
  });
  const find = field("Find by name or key", search);
  find.append(hint);
  return { select, fields: [field("Account", select), find] };
}
