// Baseline: a bare connect-node handler that returns the gateway's ItemGet
// answer as a fixed message, over HTTP/1.1 (Connect) and HTTP/2 (gRPC), with
// nothing else (the ceiling for the RPC path).
import { fromBinary } from "@bufbuild/protobuf";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import { readFileSync } from "node:fs";
import http from "node:http";
import http2 from "node:http2";
import { ItemGetResponseSchema, RetailService } from "../../src/gen/gateway/catalogue/v1/retail_pb.js";

const response = fromBinary(ItemGetResponseSchema, readFileSync(process.env.BENCH_MESSAGE_FILE!));
const handler = connectNodeAdapter({ routes: (router) => router.service(RetailService, { itemGet: () => response }) });
const h1 = http.createServer(handler);
const h2 = http2.createServer(handler);
await new Promise<void>((r) => h1.listen(0, "127.0.0.1", r));
await new Promise<void>((r) => h2.listen(0, "127.0.0.1", r));
process.stdout.write(`listening ${(h1.address() as { port: number }).port} ${(h2.address() as { port: number }).port}\n`);
