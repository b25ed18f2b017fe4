import { spawn, type ChildProcess } from "node:child_process";
import { createServer, type AddressInfo } from "node:net";
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
 * `stdout`: a file descriptor its stdout goes to instead of a pipe the test
 * reads (`/dev/full`, say); it is then ready once `/readyz` answers on a
 * port picked for it.
 */
export async function startServe(env: Record<string, string>, options: { demo?: boolean; stdout?: number; openFiles?: number } = {}): Promise<ServeProcess> {
  let output = "";
  const port = options.stdout === undefined ? 0 : await freePort();
  const command = [process.execPath, `${root}/bin/gateway.js`, "serve", ...(options.demo === true ? ["--demo"] : [])];
  // With `openFiles`, started under that open-files limit, soft and hard (util-linux's prlimit execs the gateway: the same process).
  if (options.openFiles !== undefined) command.unshift("prlimit", `--nofile=${options.openFiles}:${options.openFiles}`, "--");
  const child = spawn(command[0]!, command.slice(1), {
    cwd: root,
    env: { ...process.env, ...env, GATEWAY_PORT: String(port) },
    stdio: ["ignore", options.stdout ?? "pipe", "pipe"],
  });
  child.stdout?.on("data", (d: Buffer) => (output += d.toString()));
  child.stderr!.on("data", (d: Buffer) => (output += d.toString()));
  const until = Date.now() + 30_000;
  const ready = async () => {
    if (options.stdout === undefined) return /listening on (http:\/\/\S+) /.test(output) && (options.demo !== true || output.includes("Admin API") || output.includes("Demo account"));
    return await fetch(`http://127.0.0.1:${port}/readyz`).then(
      () => true,
      () => false,
    );
  };
  while (!(await ready())) {
    if (Date.now() > until || child.exitCode !== null) throw new Error(`gateway serve did not start:\n${withoutSecrets(output)}`);
    await new Promise((r) => setTimeout(r, 50));
  }
  const base = options.stdout === undefined ? /listening on (http:\/\/\S+) /.exec(output)![1]! : `http://127.0.0.1:${port}`;
  return { child, base, output: () => output };
}

/** A loopback port nothing listens on now. */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address() as AddressInfo;
      server.close(() => resolve(port));
    });
  });
}

/**
 * A gateway's output with its secrets masked, for a test's failure message:
 * the demo banner prints the demo account's secret and the run's admin
 * token (in its ready-to-paste commands too), and test output is read by
 * people and kept by CI.
 */
export function withoutSecrets(text: string): string {
  return text
    .replace(/(secret[=:]\s*|x-api-secret:\s*|Bearer\s+|"secret"\s*:\s*")[A-Za-z0-9_\-.~]+/gi, "$1[redacted]")
    .replace(/(\(token for this run only[^)]*\):\s*)\S+/g, "$1[redacted]");
}
