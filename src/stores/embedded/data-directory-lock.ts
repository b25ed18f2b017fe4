import { accessSync, constants, mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { hostname, userInfo } from "node:os";
import { join } from "node:path";
import { DatabaseSync } from "node:sqlite";

/** Another live process serves from this data directory. */
export class DataDirectoryInUseError extends Error {
  override name = "DataDirectoryInUseError";
}

/** A data directory this process cannot make, or cannot write in (permissions, a read-only file system). */
export class DataDirectoryUnusableError extends Error {
  override name = "DataDirectoryUnusableError";
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
  usableDataDirectory(dataDir);
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

/**
 * Makes the data directory where it is missing, and checks this process may
 * write in it: otherwise one line that says what to change, not a stack (the
 * first thing a new install meets, for `serve` and every command alike).
 */
export function usableDataDirectory(dataDir: string): void {
  try {
    mkdirSync(dataDir, { recursive: true });
    accessSync(dataDir, constants.W_OK);
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    const why =
      code === "EROFS"
        ? "it is on a read-only file system"
        : code === "EACCES" || code === "EPERM"
          ? "this user may not make or write it"
          : code === "ENOTDIR" || code === "EEXIST"
            ? "it, or a part of its path, is a file, not a directory"
            : (e as Error).message;
    throw new DataDirectoryUnusableError(
      `the data directory ${dataDir} (GATEWAY_DATA_DIR) cannot be used: ${why}${code === undefined ? "" : ` (${code})`}. ` +
        `Make it writable by the user the gateway runs as (${processUser()}), or set GATEWAY_DATA_DIR to a directory it can write.`,
      { cause: e },
    );
  }
}

/** The user this process runs as, by name, for what it tells of permissions. */
export function processUser(): string {
  try {
    return userInfo().username;
  } catch {
    return "this user";
  }
}
