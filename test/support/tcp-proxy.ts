import net from "node:net";

/**
 * What a store in front of which the proxy stands does, for the connections open and those to come:
 *   open    passes everything;
 *   frozen  holds what either side sends, and new connections, unconnected (a server that froze, a link that lost
 *           its packets for a while: nothing closes, nothing answers), and delivers it all, in order, once open again,
 *           as TCP does for a server that wakes up or a link that heals;
 *   closed  cuts every connection, and refuses new ones (a server that went away).
 */
export type ProxyMode = "open" | "frozen" | "closed";

export interface TcpProxy {
  /** The loopback port it listens on, the same in every mode. */
  readonly port: number;
  readonly mode: ProxyMode;
  /** Switches every connection, open and to come. */
  set(mode: ProxyMode): Promise<void>;
  /** Closes it for good. */
  close(): Promise<void>;
}

interface Pair {
  readonly client: net.Socket;
  readonly server: net.Socket;
  /** What each side sent while frozen, to be delivered once open. */
  readonly held: { readonly to: net.Socket; readonly data: Buffer }[];
}

/** A loopback TCP proxy to `targetPort` on 127.0.0.1, open at first: a store that the test makes fail. */
export async function tcpProxy(targetPort: number): Promise<TcpProxy> {
  const pairs = new Set<Pair>();
  let mode: ProxyMode = "open";
  let port = 0;
  let server: net.Server | undefined;

  /** Connections that came while frozen, connected once open. */
  const waiting = new Set<net.Socket>();

  const connect = (client: net.Socket) => {
    const upstream = net.connect(targetPort, "127.0.0.1");
    upstream.on("error", () => {});
    const pair: Pair = { client, server: upstream, held: [] };
    pairs.add(pair);
    const pass = (to: net.Socket) => (d: Buffer) => {
      if (mode === "open") to.write(d);
      else pair.held.push({ to, data: d });
    };
    client.on("data", pass(upstream));
    upstream.on("data", pass(client));
    const close = () => (pairs.delete(pair), client.destroy(), upstream.destroy());
    client.on("close", close);
    upstream.on("close", close);
    client.resume();
  };

  const accept = (client: net.Socket) => {
    client.on("error", () => {});
    if (mode === "open") return connect(client);
    client.pause(); // what it sends waits in the socket until it is connected
    waiting.add(client);
    client.on("close", () => waiting.delete(client));
  };

  const listen = () =>
    new Promise<void>((resolve, reject) => {
      server = net.createServer(accept);
      server.once("error", reject);
      server.listen(port, "127.0.0.1", () => {
        port = (server!.address() as net.AddressInfo).port;
        resolve();
      });
    });

  const stop = async () => {
    const closed = new Promise((r) => server?.close(r) ?? r(undefined));
    for (const p of pairs) (p.client.destroy(), p.server?.destroy());
    for (const c of waiting) c.destroy();
    pairs.clear();
    waiting.clear();
    server = undefined;
    await closed;
  };

  await listen();
  return {
    get port() {
      return port;
    },
    get mode() {
      return mode;
    },
    async set(next: ProxyMode) {
      const was = mode;
      mode = next;
      if (next === "closed" && was !== "closed") await stop();
      if (next !== "closed" && was === "closed") await listen();
      if (next === "open" && was === "frozen") {
        for (const p of pairs) for (const { to, data } of p.held.splice(0)) to.write(data);
        for (const c of [...waiting]) (waiting.delete(c), connect(c));
      }
    },
    close: stop,
  };
}
