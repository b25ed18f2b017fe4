// The floor of a hit, for the ratios' sake: a bare node:http server that does
// only what issue 15 keeps a hit doing whatever else gets faster. Each GET is
// checked against a salted SHA-256 of its `secret` (BENCH_SECRET; as the
// gateway checks a plain call), admitted and recorded through the gateway's own ledger
// (SqliteMeter on a fresh embedded store: one row a call, group-committed,
// the answer leaving only once its row is committed), and answered with the
// fixed bytes of BENCH_BODY_FILE (case 1's). No routing, no cache, no
// rendering: the distance between this and the bare Fastify route is what
// no change to the rest of the gateway can win back.
import { timingSafeEqual } from "node:crypto";
import { createServer } from "node:http";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import type { Account } from "../../src/core/accounts.ts";
import { dayOf } from "../../src/core/clock.ts";
import { createRequestIdGenerator } from "../../src/core/request-id.ts";
import { sha256 } from "../../src/core/sha256.ts";
import { ErrorCode } from "../../src/gen/gateway/catalogue/v1/status_pb.js";
import { legacyParams } from "../../src/transports/legacy/legacy-params.ts";
import { SqliteMeter } from "../../src/stores/embedded/meter.ts";
import { openDatabase } from "../../src/stores/embedded/sqlite-database.ts";

const body = readFileSync(process.env.BENCH_BODY_FILE!);
// A directory of the bench's (it removes it): the store is new for every run.
const meter = new SqliteMeter(openDatabase(join(process.env.BENCH_DATA_DIR!, "gateway.db")));
const salt = "a0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5";
const expected = sha256(salt + process.env.BENCH_SECRET!);
const account = { key: "bench", concurrency: 1_000_000, dailyMax: 1e12, prices: new Map(), balance: undefined, zone: "Asia/Shanghai" } as unknown as Account;
const requestId = createRequestIdGenerator("floor");
const headers = { "content-type": "application/json; charset=utf-8", "content-length": String(body.length) };

const server = createServer((req, res) => {
  const started = performance.now();
  const now = Date.now();
  // The query read as the gateway reads it (legacy-params.ts).
  const secret = legacyParams(req.url ?? "/").get("secret") ?? "";
  // A wrong secret is still answered with the bytes: the floor measures the work, not a refusal path.
  const code = timingSafeEqual(expected, sha256(salt + secret)) ? ErrorCode.SUCCESS : ErrorCode.INVALID_CREDENTIALS;
  const day = dayOf(now, account.zone);
  // The embedded meter admits at once (MaybeAsync), as the gateway's call takes it.
  const admission = meter.admit(account, "retail/item_get", day);
  void meter
    .record(
      { requestId: requestId(), at: now, day, account: account.key, operation: "retail/item_get", code, charge: "charged", price: 0n, cacheHit: true, upstreamRequests: 0, latencyMicros: Math.round((performance.now() - started) * 1000), transport: "legacy" },
      admission,
    )
    .then(
      () => {
        res.writeHead(200, headers);
        res.end(body);
      },
      () => res.destroy(),
    );
});
await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
process.stdout.write(`listening ${(server.address() as { port: number }).port}\n`);
