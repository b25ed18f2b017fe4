// Baseline: a bare Fastify route that returns the bytes of the gateway's
// legacy item_get answer (the ceiling for the legacy path).
import Fastify from "fastify";
import { readFileSync } from "node:fs";

const body = readFileSync(process.env.BENCH_BODY_FILE!);
const app = Fastify({ logger: false });
app.get("/retail/item_get/", (_req, reply) => reply.header("content-type", "application/json; charset=utf-8").send(body));
await app.listen({ host: "127.0.0.1", port: 0 });
process.stdout.write(`listening ${(app.server.address() as { port: number }).port}\n`);
