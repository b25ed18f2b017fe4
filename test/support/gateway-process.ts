import { spawn, type ChildProcess } from "node:child_process";
import { root } from "./cli.ts";

/** A `gateway serve` process of a test's own, and what it has printed so far. */
export interface ServeProcess {
  readonly child: ChildProcess;
  /** Where it listens: `http://127.0.0.1:<port>`. */
  readonly base: string;
  output(): string;
}

/**
 * Starts `gateway serve` (with `--demo` if asked) on a port of its own, with
 * `env` over the test process's, and resolves once it says where it listens
 * (and, with `--demo`, has printed the demo account or the admin token). It
 * throws with what it printed if it exits first or takes over 30 s.
 */
export async function startServe(env: Record<string, string>, options: { demo?: boolean } = {}): Promise<ServeProcess> {
  let output = "";
  const child = spawn(process.execPath, [`${root}/bin/gateway.js`, "serve", ...(options.demo === true ? ["--demo"] : [])], {
    cwd: root,
    env: { ...process.env, ...env, GATEWAY_PORT: "0" },
    stdio: ["ignore", "pipe", "pipe"],
  });
  child.stdout!.on("data", (d: Buffer) => (output += d.toString()));
  child.stderr!.on("data", (d: Buffer) => (output += d.toString()));
  const until = Date.now() + 30_000;
  while (!/listening on (http:\/\/\S+) /.test(output) || (options.demo === true && !output.includes("Admin API") && !output.includes("Demo account"))) {
    if (Date.now() > until || child.exitCode !== null) throw new Error(`gateway serve did not start:\n${output}`);
    await new Promise((r) => setTimeout(r, 50));
  }
  return { child, base: /listening on (http:\/\/\S+) /.exec(output)![1]!, output: () => output };
}
