// A shared-mode gateway's connections to PostgreSQL when they fail part way: a loopback TCP proxy in front of the
// real server, whose connections open at a switch can be cut as their next answer comes (a reset after the server
// acted on what it was sent).
import net from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { inTransaction, openPostgres } from "../src/stores/postgres/postgres-database.ts";
import { freshDatabase } from "./support/postgres.ts";

type Mode = "open";

interface Pair {
  readonly client: net.Socket;
  readonly server: net.Socket | undefined;
  /** What happens to this connection's traffic: set when it opened, and for every open one on each switch. */
  mode: Mode | "cut";
}

let db: Awaited<ReturnType<typeof freshDatabase>>;
let proxiedUrl: string;
let proxy: net.Server;
const pairs = new Set<Pair>();

function openProxy(): Promise<number> {
  proxy = net.createServer((client) => {
    client.on("error", () => {});
    const server = net.connect(5432, "127.0.0.1");
    server.on("error", () => {});
    const pair: Pair = { client, server, mode: "open" };
    pairs.add(pair);
    client.on("data", (d) => server.write(d));
    server.on("data", (d) => {
      if (pair.mode === "open") client.write(d);
      else (client.destroy(), server.destroy());
    });
    const close = () => (pairs.delete(pair), client.destroy(), server.destroy());
    client.on("close", close);
    server.on("close", close);
  });
  return new Promise((resolve) => proxy.listen(0, "127.0.0.1", () => resolve((proxy.address() as net.AddressInfo).port)));
}

/** Switches the connections open now to `existing`. */
function switchTo(existing: Mode | "cut"): void {
  for (const p of pairs) if (p.server !== undefined) p.mode = existing;
}

beforeAll(async () => {
  db = await freshDatabase("silence");
  const url = new URL(db.url);
  url.port = String(await openProxy());
  proxiedUrl = url.href;
});

afterAll(async () => {
  for (const p of pairs) (p.client.destroy(), p.server?.destroy());
  await new Promise((r) => proxy?.close(r));
  await db?.drop();
});

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe("a shared-mode gateway whose PostgreSQL stops answering", () => {
  it("fails a transaction whose connection is cut, without ending the process that ran it", async () => {
    // In this process: node-postgres emits a checked-out client's lost connection as an event that, unheard, ends it.
    const pool = openPostgres(proxiedUrl, { max: 1 });
    try {
      const running = inTransaction(pool, (c) => c.query("SELECT pg_sleep(0.5)"));
      await sleep(100);
      switchTo("cut");
      await expect(running).rejects.toThrow(/Connection terminated/);
      // The pool goes on, on a new connection.
      expect((await pool.query<{ n: number }>("SELECT 1 AS n")).rows[0]!.n).toBe(1);
    } finally {
      await pool.end();
    }
  });
});
