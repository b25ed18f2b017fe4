#!/usr/bin/env node
// Runs the TypeScript sources directly: Node 24 strips the types (no build step).
// Started by an older Node (the system's, say `node bin/gateway.js`), it hands
// itself over to the Node 24 the project pins (the `node` dependency).
import { spawn } from "node:child_process";
import { createRequire } from "node:module";

const major = Number(process.versions.node.split(".")[0]);
if (major >= 24) {
  await import("../src/cli/main.ts");
} else {
  let pinned;
  try {
    pinned = createRequire(import.meta.url).resolve("node/bin/node");
  } catch {
    console.error(`the gateway needs Node 24 or later (this is ${process.version}); run \`npm ci\` to install the pinned one`);
    process.exit(2);
  }
  const child = spawn(pinned, [...process.execArgv, import.meta.filename, ...process.argv.slice(2)], { stdio: "inherit" });
  for (const signal of ["SIGINT", "SIGTERM", "SIGHUP"]) process.on(signal, () => child.kill(signal));
  child.on("exit", (code, signal) => (signal ? process.kill(process.pid, signal) : process.exit(code ?? 1)));
}
