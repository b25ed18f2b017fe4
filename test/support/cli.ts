import { spawn } from "node:child_process";
import { join } from "node:path";

export const root = join(import.meta.dirname, "..", "..");

export interface CliResult {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** Runs `gateway <args>` the way `npx gateway` does: the project's Node on the bin script. */
export function runCli(args: string[], env: Record<string, string>, options: { npx?: boolean } = {}): Promise<CliResult> {
  const [cmd, argv] = options.npx ? ["npx", ["--no-install", "gateway", ...args]] : [process.execPath, [join(root, "bin", "gateway.js"), ...args]];
  return new Promise((resolve, reject) => {
    const child = spawn(cmd as string, argv as string[], {
      cwd: root,
      env: { ...process.env, PATH: `${join(root, "node_modules", ".bin")}:${process.env.PATH}`, ...env },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (d: Buffer) => (stdout += d.toString()));
    child.stderr.on("data", (d: Buffer) => (stderr += d.toString()));
    child.on("error", reject);
    child.on("close", (code) => resolve({ code, stdout, stderr }));
  });
}
