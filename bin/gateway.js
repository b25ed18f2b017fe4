#!/usr/bin/env node
// Runs the TypeScript sources directly: Node 24 strips the types (no build step).
// Started by an older Node (the system's, say `node bin/gateway.js`), it hands
// itself over to the Node 24 the project pins (the `node` dependency).
// `serve` runs with V8 heap limits from the memory budget (GATEWAY_MEMORY_MB,
// src/memory-budget.ts), V8's allocation-site pretenuring off and glibc's
// malloc arenas capped (MALLOC_ARENA_MAX): without flags or a cap of its own,
// it re-executes itself with them, as the same process (process.execve: same
// pid, same signals).
import { spawn } from "node:child_process";
import { createRequire } from "node:module";

const major = Number(process.versions.node.split(".")[0]);
if (major >= 24) {
  if (process.argv[2] === "serve" && typeof process.execve === "function") {
    const { memoryMbOf, memoryPlan, servingEnv, servingFlags } = await import("../src/memory-budget.ts");
    const memoryMb = memoryMbOf(process.env);
    // A budget that does not read is left to the configuration, which names the problem.
    if (memoryMb !== undefined) {
      const flags = servingFlags(memoryPlan(memoryMb), process.execArgv, process.env.NODE_OPTIONS);
      const env = servingEnv(process.env);
      // Once re-executed, both are there, so it runs on.
      if (flags.length > 0 || env !== process.env) {
        process.execve(process.execPath, [process.execPath, ...flags, ...process.execArgv, import.meta.filename, ...process.argv.slice(2)], env);
      }
    }
  }
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
