import type { Answers } from "./answers.ts";
import http2 from "node:http2";

export interface LoadResult {
  requests: number;
  errors: number;
  rps: number;
  p50: number;
  p99: number;
  max: number;
  /** The server's own CPU time (user + system) per request, in microseconds, when its process was watched. */
  cpuUs?: number;
  /** What the gateway answered, by its own count, when it was asked (answers.ts). */
  answers?: Answers;
}

/**
 * A closed-loop gRPC load client on node:http2: `streams` requests in flight
 * at all times, spread over `sessions` connections, for `seconds`. The
 * request is one pre-encoded gRPC frame; an answer counts as an error unless
 * its grpc-status is 0.
 */
export async function grpcLoad(url: string, path: string, frame: Buffer, headers: Record<string, string>, opts: { sessions: number; streams: number; seconds: number }): Promise<LoadResult> {
  const sessions = Array.from({ length: opts.sessions }, () => http2.connect(url));
  await Promise.all(sessions.map((s) => new Promise((r) => s.once("connect", r))));
  const latencies: number[] = [];
  let errors = 0;
  const until = performance.now() + opts.seconds * 1000;
  const one = (session: http2.ClientHttp2Session) =>
    new Promise<void>((resolve) => {
      const started = performance.now();
      const stream = session.request({ ":method": "POST", ":path": path, "content-type": "application/grpc", te: "trailers", ...headers });
      let status = "";
      stream.on("trailers", (t) => (status = String(t["grpc-status"] ?? "")));
      stream.on("response", (h) => {
        if (h["grpc-status"] !== undefined) status = String(h["grpc-status"]);
      });
      stream.on("data", () => undefined);
      stream.on("close", () => {
        latencies.push(performance.now() - started);
        if (status !== "0") errors++;
        resolve();
      });
      stream.on("error", () => undefined);
      stream.end(frame);
    });
  const worker = async (i: number) => {
    const session = sessions[i % sessions.length]!;
    while (performance.now() < until) await one(session);
  };
  const started = performance.now();
  await Promise.all(Array.from({ length: opts.streams }, (_, i) => worker(i)));
  const elapsed = (performance.now() - started) / 1000;
  for (const s of sessions) s.close();
  latencies.sort((a, b) => a - b);
  const at = (q: number) => latencies[Math.min(latencies.length - 1, Math.floor(q * latencies.length))] ?? 0;
  return { requests: latencies.length, errors, rps: latencies.length / elapsed, p50: at(0.5), p99: at(0.99), max: latencies.at(-1) ?? 0 };
}
