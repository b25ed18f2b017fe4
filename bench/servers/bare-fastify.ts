// Baseline: bare Fastify GET routes that return fixed bytes. `/retail/item_get/`
// returns the gateway's legacy item_get answer (BENCH_BODY_FILE); with
// BENCH_BODIES (a JSON list of { route, file, contentType }), each route
// returns the bytes of the gateway's answer to one case, so every case is
// measured against a route serving the same bytes as it (see bench/run.ts).
import Fastify from "fastify";
import { readFileSync } from "node:fs";

const app = Fastify({ logger: false });
const route = (path: string, contentType: string, body: Buffer) => app.get(path, (_req, reply) => reply.header("content-type", contentType).send(body));
route("/retail/item_get/", "application/json; charset=utf-8", readFileSync(process.env.BENCH_BODY_FILE!));
if (process.env.BENCH_BODIES) {
  const bodies = JSON.parse(readFileSync(process.env.BENCH_BODIES, "utf8")) as { route: string; file: string; contentType: string }[];
  for (const b of bodies) route(b.route, b.contentType, readFileSync(b.file));
}
await app.listen({ host: "127.0.0.1", port: 0 });
process.stdout.write(`listening ${(app.server.address() as { port: number }).port}\n`);
