import http from "node:http";
import type { AddressInfo } from "node:net";
import { demoRecords } from "../../src/catalogue/demo-dataset.ts";

/** What a scripted answer does. */
export type Behaviour =
  | { kind: "normal"; delayMs?: number; padBytes?: number }
  | { kind: "status"; status: number; body?: string; headers?: Record<string, string> }
  | { kind: "garbage" }
  | { kind: "code"; code: string; reason?: string; headers?: Record<string, string> }
  | { kind: "zero-without-item" }
  | { kind: "hang" }
  | { kind: "reset" };

export interface UpstreamRequest {
  readonly path: string;
  readonly query: URLSearchParams;
  readonly headers: http.IncomingHttpHeaders;
}

/**
 * A stand-in for the paid upstream provider: a real HTTP server on loopback
 * that answers the legacy protocol from the demo records, and misbehaves on
 * purpose when a test scripts it to.
 */
export class FakeUpstream {
  readonly requests: UpstreamRequest[] = [];
  /** Decides each answer; the default answers normally. */
  script: (req: UpstreamRequest) => Behaviour = () => ({ kind: "normal" });
  /** Connections the gateway (or anyone) closed, and body bytes the sockets took. */
  closedConnections = 0;
  bytesWritten = 0;
  private server!: http.Server;
  private readonly items = new Map<string, unknown>();
  private readonly peers = new Map<string, unknown[]>();

  constructor() {
    for (const r of demoRecords()) {
      // Keyed by the provider's catalogue name, as the gateway's default GATEWAY_UPSTREAM_CATALOGUES names them.
      const provider = (r.catalogue ?? "retail") === "retail" ? "taobao" : "1688";
      if (r.kind === "item_detail" && r.obtainable) this.items.set(`${provider}/${(r.item as { num_iid: string }).num_iid}`, r.item);
      if (r.kind === "peer_viewed") this.peers.set(`${String(r.num_iid)}/${String(r.sid)}`, r.item as unknown[]);
    }
  }

  get url(): string {
    return `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
  }

  async start(): Promise<this> {
    this.server = http.createServer((req, res) => this.answer(req, res));
    this.server.on("connection", (socket) => socket.on("close", () => this.closedConnections++));
    await new Promise<void>((r) => this.server.listen(0, "127.0.0.1", r));
    return this;
  }

  async stop(): Promise<void> {
    this.server.closeAllConnections();
    await new Promise((r) => this.server.close(r));
  }

  /** A valid answer with a `padding` string of about `bytes`, written as the socket takes it. */
  private async padded(body: Record<string, unknown>, bytes: number, res: http.ServerResponse): Promise<void> {
    res.writeHead(200, { "content-type": "application/json" });
    const head = JSON.stringify(body).slice(0, -1) + ',"padding":"';
    const chunk = "x".repeat(65536);
    const write = (text: string) =>
      new Promise<void>((resolve) => {
        if (res.destroyed) return resolve();
        this.bytesWritten += text.length;
        if (res.write(text)) return resolve();
        const done = () => {
          res.off("drain", done);
          res.off("close", done);
          resolve();
        };
        res.on("drain", done);
        res.on("close", done);
      });
    await write(head);
    for (let sent = 0; sent < bytes && !res.destroyed; sent += chunk.length) await write(chunk);
    if (!res.destroyed) res.end('"}');
  }

  private answer(req: http.IncomingMessage, res: http.ServerResponse): void {
    const url = new URL(req.url ?? "/", "http://upstream");
    const request = { path: url.pathname, query: url.searchParams, headers: req.headers };
    this.requests.push(request);
    const b = this.script(request);
    const json = (body: unknown, headers: Record<string, string> = {}) => {
      res.writeHead(200, { "content-type": "application/json", ...headers });
      res.end(JSON.stringify(body));
    };
    switch (b.kind) {
      case "reset":
        req.socket.destroy();
        return;
      case "hang":
        return;
      case "status":
        res.writeHead(b.status, { "content-type": "text/plain", ...b.headers });
        res.end(b.body ?? "upstream trouble");
        return;
      case "garbage":
        res.writeHead(200, { "content-type": "application/json" });
        res.end("<html>502 gateway</html>");
        return;
      case "code":
        json({ error: "err", reason: b.reason ?? `failed with ${b.code}`, error_code: b.code, success: 0 }, b.headers);
        return;
      case "zero-without-item":
        json({ error: "", reason: "", error_code: "0000" });
        return;
      case "normal": {
        const send = () => {
          const numIid = url.searchParams.get("num_iid") ?? "";
          const provider = url.pathname.split("/")[1];
          const item = url.pathname.endsWith("/item_get/") ? this.items.get(`${provider}/${numIid}`) : this.peers.get(`${numIid}/${url.searchParams.get("sid")}`);
          if (item === undefined || (Array.isArray(item) && item.length === 0)) json({ error: "item-not-found", reason: "no such item", error_code: "2000", success: 0 });
          else if (b.padBytes) void this.padded({ item, error: "", reason: "", error_code: "0000" }, b.padBytes, res);
          else json({ item, error: "", reason: "", error_code: "0000", cache: 0, api_info: "today:1 max:99" });
        };
        if (b.delayMs) setTimeout(send, b.delayMs);
        else send();
      }
    }
  }
}
