// A stand-in for the paid upstream provider that answers every call in a
// fixed 20 ms from the demo records, and counts the calls (GET /stats).
import http from "node:http";
import { demoRecords } from "../../src/catalogue/demo-dataset.ts";

const items = new Map<string, unknown>();
for (const r of demoRecords()) if (r.kind === "item_detail" && r.obtainable) items.set((r.item as { num_iid: string }).num_iid, r.item);
let calls = 0;
const server = http.createServer((req, res) => {
  const url = new URL(req.url ?? "/", "http://upstream");
  if (url.pathname === "/stats") return void res.end(JSON.stringify({ calls }));
  calls++;
  setTimeout(() => {
    const item = items.get(url.searchParams.get("num_iid") ?? "");
    res.writeHead(200, { "content-type": "application/json" });
    res.end(JSON.stringify(item ? { item, error: "", reason: "", error_code: "0000" } : { error: "item-not-found", reason: "no", error_code: "2000" }));
  }, 20);
});
server.keepAliveTimeout = 60_000;
await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
process.stdout.write(`listening ${(server.address() as { port: number }).port}\n`);
