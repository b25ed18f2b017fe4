// Connections: what the replica that answered holds against its connection
// caps, what the caps refused since it started, and the client addresses
// holding the most, a trusted proxy marked. Every figure is GetConnections'.
// Each replica counts its own: behind a load balancer each refresh may be
// answered by another, and the page says which.
import { inWords, isUnauthenticated } from "./api.ts";
import { h, notice } from "./dom.ts";
import type { Shell } from "./main.ts";

/** How many addresses the page lists. */
const listed = 50;

export async function connectionsView(main: HTMLElement, shell: Shell): Promise<void> {
  const news = h("div", { "aria-live": "polite" });
  const body = h("div");

  const draw = async () => {
    const c = await shell.client.getConnections({ top: listed });
    const max = Number(c.maxConnections);
    const share = (n: bigint) => {
      const percent = (Number(n) / max) * 100;
      return n === 0n || max <= 0 ? "" : percent < 0.1 ? "under 0.1% of the cap" : `${percent.toFixed(1)}% of the cap`;
    };
    const figure = (label: string, value: string, testid: string, note?: string | Node) =>
      h("div", { class: "figure", "data-testid": testid }, h("span", { class: "muted" }, label), h("strong", {}, value), note ? h("small", { class: "muted" }, note) : undefined);
    const perAddress = c.maxConnectionsPerAddress === 0n ? "none" : c.maxConnectionsPerAddress.toLocaleString();
    const rows = c.holders.map((holder) =>
      h(
        "tr",
        { "data-address": holder.address },
        h("td", {}, h("code", {}, holder.address)),
        h("td", { class: "num" }, holder.connections.toLocaleString()),
        h("td", { class: "num" }, share(holder.connections)),
        h("td", {}, holder.trustedProxy ? "trusted proxy: carries its clients' connections, not held to the cap per address" : c.maxConnectionsPerAddress > 0n && holder.connections >= c.maxConnectionsPerAddress ? "at the cap per address: its next connection is refused" : ""),
      ),
    );
    const refused = { connections: c.refused?.connections ?? 0n, perAddress: c.refused?.perAddress ?? 0n, streams: c.refused?.streams ?? 0n };
    const refusedAll = refused.connections + refused.perAddress + refused.streams;
    body.replaceChildren(
      h("p", {}, "Answered by replica ", h("code", { "data-testid": "node" }, c.node), ` at ${new Date().toLocaleTimeString()}.`),
      h(
        "div",
        { class: "figures" },
        figure(
          "Open",
          `${c.open.toLocaleString()} of ${c.maxConnections.toLocaleString()}`,
          "open",
          c.maxConnectionsSet > 0n
            ? `${share(c.open) || "none"}; the cap is lowered from ${c.maxConnectionsSet.toLocaleString()} to fit the open-files limit (${c.openFilesLimit.toLocaleString()}): raise it to keep ${c.maxConnectionsSet.toLocaleString()}`
            : share(c.open),
        ),
        figure("HTTP/2 sessions", c.http2Sessions.toLocaleString(), "http2-sessions"),
        figure("HTTP/2 streams", `${c.http2Streams.toLocaleString()} of ${c.maxConnections.toLocaleString()}`, "http2-streams"),
        figure("Addresses", c.addresses.toLocaleString(), "addresses"),
        figure("Cap per address", perAddress, "per-address", h("code", {}, "GATEWAY_MAX_CONNECTIONS_PER_ADDRESS")),
        figure(
          "Refused since start",
          refusedAll === 0n ? "none" : refusedAll.toLocaleString(),
          "refused",
          `${refused.connections} at the cap, ${refused.perAddress} per address, ${refused.streams} streams`,
        ),
      ),
      h(
        "div",
        { class: "list" },
          h(
          "table",
          { class: "connections" },
          h("caption", {}, c.holders.length === 0 ? "No connection open" : c.addresses > BigInt(c.holders.length) ? `The ${c.holders.length} of ${c.addresses} addresses holding the most, most first` : "Every address holding a connection, most first"),
          h(
            "thead",
            {},
            h("tr", {}, h("th", { scope: "col" }, "Address"), h("th", { scope: "col", class: "num" }, "Connections"), h("th", { scope: "col", class: "num" }, "Share"), h("th", { scope: "col" }, "Note")),
          ),
          h("tbody", {}, ...rows),
        ),
      ),
    );
  };

  const refresh = async () => {
    news.replaceChildren();
    try {
      await draw();
    } catch (err) {
      if (isUnauthenticated(err)) return shell.signedOut(inWords(err));
      news.replaceChildren(notice("error", inWords(err)));
    }
  };

  main.replaceChildren(
    h("h1", {}, "Connections"),
    h(
      "p",
      { class: "muted" },
      "Client connections the replica holds against GATEWAY_MAX_CONNECTIONS (past it, a new connection is closed as it is accepted, and a new HTTP/2 stream refused), and the addresses holding the most. Each replica counts its own.",
    ),
    h("button", { type: "button", class: "secondary", onclick: () => void refresh() }, "Refresh"),
    news,
    body,
  );
  await draw();
}
