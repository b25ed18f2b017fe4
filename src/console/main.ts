// The gateway's console: sign-in with the admin token, then accounts. Every
// call goes through Connect-Web (api.ts).
import "./console.css";
import { adminClient, inWords, isUnauthenticated, loadOperations, session, type AdminClient, type OperationInfo } from "./api.ts";
import { accountsView } from "./accounts.ts";
import { h, field, notice } from "./dom.ts";

const root = document.getElementById("app")!;

function signInView(message?: string): void {
  const token = h("input", { type: "password", name: "token", autocomplete: "current-password", required: true });
  const status = h("div", { "aria-live": "polite" });
  if (message) status.append(notice("error", message));
  const form = h(
    "form",
    {
      class: "card narrow",
      "aria-labelledby": "signin-title",
      onsubmit: async (e: Event) => {
        e.preventDefault();
        status.replaceChildren(notice("ok", "Signing in…"));
        const client = adminClient(token.value);
        try {
          await client.listAccounts({});
          session.signIn(token.value);
          void start();
        } catch (err) {
          status.replaceChildren(notice("error", inWords(err)));
        }
      },
    },
    h("h1", { id: "signin-title" }, "Gateway console"),
    h("p", {}, "Sign in with the gateway's admin token (GATEWAY_ADMIN_TOKEN; the demo prints one at start). It is kept in this tab's session storage only."),
    field("Admin token", token),
    h("button", { type: "submit" }, "Sign in"),
    status,
  );
  root.replaceChildren(h("main", { class: "signin" }, form));
  token.focus();
}

interface Shell {
  readonly client: AdminClient;
  readonly operations: readonly OperationInfo[];
  /** Goes back to the sign-in screen, saying why. */
  signedOut(message: string): void;
}

async function start(): Promise<void> {
  const token = session.token();
  if (token === null) return signInView();
  let operations: OperationInfo[];
  try {
    operations = await loadOperations();
  } catch (e) {
    root.replaceChildren(notice("error", `The console cannot load its operation list: ${(e as Error).message}`));
    return;
  }
  const shell: Shell = {
    client: adminClient(token),
    operations,
    signedOut: (message) => {
      session.signOut();
      signInView(message);
    },
  };
  const main = h("main", { id: "main", tabindex: -1 });
  const header = h(
    "header",
    { class: "top" },
    h("span", { class: "brand" }, "Gateway console"),
    h("nav", { "aria-label": "Sections" }, h("a", { href: "#/accounts", "aria-current": "page" }, "Accounts")),
    h("button", { type: "button", class: "link", onclick: () => shell.signedOut("Signed out.") }, "Sign out"),
  );
  root.replaceChildren(header, main);
  try {
    await accountsView(main, shell);
  } catch (e) {
    if (isUnauthenticated(e)) shell.signedOut(inWords(e));
    else main.replaceChildren(notice("error", inWords(e)));
  }
}

export type { Shell };
void start();
