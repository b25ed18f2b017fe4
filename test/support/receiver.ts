// A receiver of the gateway's outgoing POSTs (usage alerts) on loopback: it keeps what it was sent and answers
// as `answer` says, a status or never, so a test can make it refuse or stall on purpose.
import { createServer, type Server } from "node:http";

export interface Delivery {
  readonly path: string;
  readonly headers: Record<string, string | string[] | undefined>;
  readonly body: string;
}

export interface Receiver {
  url: string;
  readonly got: Delivery[];
  /** How the n-th request (from 1) is answered: a status, or never. */
  answer: (n: number) => number | "never";
  readonly server: Server;
  /** Cuts every connection and stops listening. */
  close(): Promise<void>;
}

export async function receiver(): Promise<Receiver> {
  const r: Receiver = {
    url: "",
    got: [],
    answer: () => 204,
    server: createServer((req, res) => {
      let body = "";
      req.on("data", (c: Buffer) => (body += c.toString()));
      req.on("end", () => {
        r.got.push({ path: req.url ?? "", headers: req.headers, body });
        const status = r.answer(r.got.length);
        if (status === "never") return;
        res.statusCode = status;
        res.end();
      });
    }),
    close: () =>
      new Promise<void>((resolve) => {
        r.server.closeAllConnections();
        r.server.close(() => resolve());
      }),
  };
  await new Promise<void>((resolve) => r.server.listen(0, "127.0.0.1", resolve));
  r.url = `http://127.0.0.1:${(r.server.address() as { port: number }).port}`;
  return r;
}
