import { resolve } from "node:path";
import { parseArgs } from "node:util";
import type { GatewayConfig } from "../config.ts";
import { databasePath, sharedMode } from "../runtime.ts";
import { BackupRefusedError, backupStore, restoreStore, type StoreSummary } from "../stores/embedded/backup.ts";
import { lockDataDirectory } from "../stores/embedded/data-directory-lock.ts";

const sharedBackups =
  "shared mode keeps its data in PostgreSQL: back it up with PostgreSQL's own tools (pg_dump, or continuous archiving), which copy a consistent moment of every table; the Redis cache needs none";

/** The command's one FILE (absolute) and its --json; or, told on stderr, the exit code of a wrong call or of shared mode. */
function fileArgument(config: GatewayConfig, argv: string[], usage: string, nothing: string): { file: string; values: { json: boolean } } | number {
  const { values, positionals } = parseArgs({ args: argv, allowPositionals: true, options: { json: { type: "boolean", default: false } } });
  if (positionals.length !== 1) {
    console.error(usage);
    return 2;
  }
  if (sharedMode(config)) {
    console.error(`${nothing}: ${sharedBackups}`);
    return 2;
  }
  return { file: resolve(positionals[0]!), values };
}

function summaryLine(s: StoreSummary): string {
  return `${s.bytes} bytes, schema step ${s.schemaStep}, ${s.accounts} accounts, ${s.ledgerRows} ledger rows, ${s.catalogueRecords} catalogue records`;
}

/**
 * `gateway backup FILE`: a consistent copy of the embedded store, taken
 * while the gateway serves (src/stores/embedded/backup.ts).
 */
export function backupCommand(config: GatewayConfig, argv: string[]): number {
  const args = fileArgument(config, argv, "usage: gateway backup FILE [--json]   (a consistent copy of GATEWAY_DATA_DIR's store, taken while it serves)", "nothing backed up");
  if (typeof args === "number") return args;
  const { file: target, values } = args;
  try {
    const done = backupStore(databasePath(config), target);
    if (values.json) console.log(JSON.stringify({ from: databasePath(config), to: target, ...done }));
    else console.log(`backed up ${databasePath(config)} to ${target} in ${done.seconds.toFixed(2)} s: ${summaryLine(done)}; checked whole`);
    return 0;
  } catch (e) {
    if (!(e instanceof BackupRefusedError)) throw e;
    console.error(`nothing backed up: ${e.message}`);
    return 2;
  }
}

/**
 * `gateway restore FILE`: the embedded store replaced by a backup, while no
 * gateway serves it (the data directory's lock is held for the restore).
 */
export function restoreCommand(config: GatewayConfig, argv: string[]): number {
  const args = fileArgument(config, argv, "usage: gateway restore FILE [--json]   (GATEWAY_DATA_DIR's store replaced by a backup; stop the gateway first)", "nothing restored");
  if (typeof args === "number") return args;
  const { file: source, values } = args;
  // A gateway serving this directory refuses the lock (DataDirectoryInUseError: exit 2, naming it).
  const lock = lockDataDirectory(config.dataDir);
  try {
    const done = restoreStore(databasePath(config), source, new Date());
    if (values.json) console.log(JSON.stringify({ from: source, to: databasePath(config), ...done }));
    else {
      console.log(`restored ${source} to ${databasePath(config)}: ${summaryLine(done)}`);
      console.log(done.keptAs === undefined ? "there was no store before it" : `the store it replaced is kept, whole, as ${done.keptAs}`);
    }
    return 0;
  } catch (e) {
    if (!(e instanceof BackupRefusedError)) throw e;
    console.error(`nothing restored: ${e.message}`);
    return 2;
  } finally {
    lock.release();
  }
}
