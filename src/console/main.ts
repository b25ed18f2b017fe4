// The gateway's console: sign-in with an admin token, then accounts, usage,
// live calls, maintenance, connections and an explorer, one screen each
// (#/accounts, #/usage, #/live, …). Every call goes through Connect-Web (api.ts).
import "./console.css";
import { adminClient, inWords, isUnauthenticated, loadGatewayInfo, session, type AdminClient, type GatewayInfo, type OperationInfo } from "./api.ts";
import { accountsView } from "./accounts.ts";
import { explorerView } from "./explorer.ts";
import { maintenanceView } from "./maintenance.ts";
import { connectionsView } from "./connections.ts";
import { liveView } from "./live.ts";
import { usageView } from "./usage.ts";
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
        try {
          await adminClient(token.value).whoAmI({});
          session.signIn(token.value);
          void start();
        } catch (err) {
          status.replaceChildren(notice("error", inWords(err)));
        }
      },
    },
    h("h1", { id: "signin-title" }, "Gateway console"),
    h("p", {}, "Sign in with your admin token (gateway admins add NAME makes one) or the gateway's (GATEWAY_ADMIN_TOKEN; the demo prints one at start). It is kept in this tab's session storage only."),
    field("Admin token", token),
    h("button", { type: "submit" }, "Sign in"),
    status,
  );
  root.replaceChildren(h("main", { class: "signin" }, form));
  token.focus();
}

export interface Shell {
  readonly client: AdminClient;
  readonly operations: readonly OperationInfo[];
  readonly resultTypes: readonly string[];
  /** Goes back to the sign-in screen, saying why. */
  signedOut(message: string): void;
  /** Aborted once the screen shown now is left (another screen, signing out): what ends its streams. */
  leaving(): AbortSignal;
}

const screens = {
  accounts: { title: "Accounts", show: accountsView },
  usage: { title: "Usage", show: usageView },
  live: { title: "Live calls", show: liveView },
  maintenance: { title: "Maintenance", show: maintenanceView },
  connections: { title: "Connections", show: connectionsView },
  explorer: { title: "Explorer", show: explorerView },
} as const;
type Screen = keyof typeof screens;

const screenOf = (hash: string): Screen => {
  const name = hash.replace(/^#\/?/, "");
  return name in screens ? (name as Screen) : "accounts";
};

async function start(): Promise<void> {
  const token = session.token();
  if (token === null) return signInView();
  let info: GatewayInfo;
  try {
    info = await loadGatewayInfo();
  } catch (e) {
    root.replaceChildren(notice("error", `The console cannot read the gateway's description: ${(e as Error).message}`));
    return;
  }
  const onHash = () => void route();
  let screenShown = new AbortController();
  const shell: Shell = {
    client: adminClient(token),
    operations: info.operations,
    resultTypes: info.resultTypes,
    leaving: () => screenShown.signal,
    signedOut: (message) => {
      screenShown.abort();
      window.removeEventListener("hashchange", onHash);
      session.signOut();
      signInView(message);
    },
  };
  const links = Object.entries(screens).map(([name, s]) => h("a", { href: `#/${name}` }, s.title));
  const main = h("main", { id: "main", tabindex: -1 });
  // Who the token is, as the history will record its changes: asked once, shown beside "Sign out".
  const who = h("span", { class: "who", "data-testid": "signed-in-as" });
  root.replaceChildren(
    h("header", { class: "top" }, h("span", { class: "brand" }, "Gateway console"), h("nav", { "aria-label": "Sections" }, ...links), who, h("button", { type: "button", class: "link", onclick: () => shell.signedOut("Signed out.") }, "Sign out")),
    main,
  );
  void shell.client.whoAmI({}).then(
    (me) => {
      who.textContent = me.name !== "" ? `Signed in as ${me.name}` : "Signed in with the gateway's token";
      who.title = `Changes are recorded as made by ${me.actor}`;
    },
    () => undefined, // the screen's own call says what is wrong
  );
  async function route(): Promise<void> {
    const screen = screenOf(location.hash);
    screenShown.abort();
    screenShown = new AbortController();
    for (const a of links) {
      if (a.getAttribute("href") === `#/${screen}`) a.setAttribute("aria-current", "page");
      else a.removeAttribute("aria-current");
    }
    document.title = `${screens[screen].title} · Gateway console`;
    main.replaceChildren(notice("ok", "Loading…"));
    try {
      await screens[screen].show(main, shell);
    } catch (e) {
      if (isUnauthenticated(e)) shell.signedOut(inWords(e));
      else main.replaceChildren(notice("error", inWords(e)));
    }
  }
  window.addEventListener("hashchange", onHash);
  await route();
}

void start();
