// Baseline: a bare node:http2 gRPC unary handler on the stream API, returning
// the gateway's ItemGet answer as fixed bytes: it reads the request frame,
// answers one length-prefixed message and `grpc-status: 0` in trailers, and
// does nothing else (the HTTP/2 transport's own ceiling on this machine).
import { readFileSync } from "node:fs";
import http2 from "node:http2";

const message = readFileSync(process.env.BENCH_MESSAGE_FILE!);
const frame = Buffer.alloc(5 + message.length);
frame.writeUInt32BE(message.length, 1);
message.copy(frame, 5);

const server = http2.createServer();
server.on("stream", (stream) => {
  stream.on("data", () => {});
  stream.on("end", () => {
    stream.respond({ ":status": 200, "content-type": "application/grpc+proto" }, { waitForTrailers: true });
    stream.once("wantTrailers", () => stream.sendTrailers({ "grpc-status": "0" }));
    stream.end(frame);
  });
  stream.on("error", () => {});
});
await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
process.stdout.write(`listening ${(server.address() as { port: number }).port}\n`);
