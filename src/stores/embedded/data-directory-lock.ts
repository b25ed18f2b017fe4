import { mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { hostname } from "node:os";
import { join } from "node:path";
import { DatabaseSync } from "node:sqlite";

/** Another live process serves from this data directory. */
export class DataDirectoryInUseError extends Error {
  override name = "DataDirectoryInUseError";
}

/**
 * Makes this process the one gateway serving from a data directory, for as
 * long as it runs. Two gateways on one embedded store each admit an
 * account's whole daily maximum, concurrency and balance, so the second is
 * refused at start. The lock is an exclusive SQLite lock on its own file
 * (`serve.lock`), held by the operating system for the process: it goes
 * with the process, SIGKILL included, and never needs cleaning up. The CLI
 * (accounts, import, usage) does not take it and works beside the server.
 */
export function lockDataDirectory(dataDir: string): { release(): void } {
  mkdirSync(dataDir, { recursive: true });
  const owner = join(dataDir, "serve.owner");
  const db = new DatabaseSync(join(dataDir, "serve.lock"));
  try {
    db.exec("PRAGMA busy_timeout = 0");
    db.exec("BEGIN EXCLUSIVE");
  } catch (e) {
    db.close();
    let holder = "another process";
    try {
      const o = JSON.parse(readFileSync(owner, "utf8")) as { pid: number; host: string; since: string };
      holder = `process ${o.pid} on ${o.host} (since ${o.since})`;
    } catch {
      // the holder has not written its name yet
    }
    throw new DataDirectoryInUseError(
      `${dataDir} is already served by ${holder}. One data directory serves one gateway process: two would each admit every account's whole daily maximum, concurrency and balance. ` +
        "Stop the other one, or give this one its own GATEWAY_DATA_DIR (a separate store with its own accounts); to run several replicas over one set of accounts, use shared mode (GATEWAY_DATABASE_URL and GATEWAY_REDIS_URL, README: Running several replicas).",
      { cause: e },
    );
  }
  writeFileSync(owner, JSON.stringify({ pid: process.pid, host: hostname(), since: new Date().toISOString() }));
  return {
    release: () => {
      rmSync(owner, { force: true });
      db.close();
    },
  };
}
