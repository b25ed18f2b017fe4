import { parseArgs } from "node:util";
import type { GatewayConfig } from "../config.ts";
import { databasePath } from "../runtime.ts";
import { lockDataDirectory } from "../stores/embedded/data-directory-lock.ts";
import { openDatabase } from "../stores/embedded/sqlite-database.ts";
import { CopyRefusedError, copyEmbeddedStore } from "../stores/postgres/copy-embedded.ts";
import { openPostgres } from "../stores/postgres/postgres-database.ts";

/** Where a PostgreSQL URL points, without its credentials. */
function describe(url: URL): string {
  return `${url.hostname}:${url.port || "5432"}${url.pathname}`;
}

/**
 * `gateway migrate --to postgres://…`: copies the embedded data directory
 * (GATEWAY_DATA_DIR) into an empty PostgreSQL database, checked table by
 * table. The data directory is held for the copy, so no gateway serves from
 * it meanwhile and the copy is a consistent moment.
 */
export async function migrateCommand(config: GatewayConfig, argv: string[]): Promise<number> {
  const { values } = parseArgs({ args: argv, options: { to: { type: "string" }, json: { type: "boolean", default: false } } });
  let url: URL;
  try {
    url = new URL(values.to ?? "");
    if (url.protocol !== "postgres:" && url.protocol !== "postgresql:") throw new Error();
  } catch {
    console.error("usage: gateway migrate --to postgres://USER@HOST:PORT/DATABASE [--json]   (copies GATEWAY_DATA_DIR into an empty database)");
    return 2;
  }
  const lock = lockDataDirectory(config.dataDir);
  const db = openDatabase(databasePath(config));
  const pool = openPostgres(url.href, { max: 1 });
  try {
    const tables = await copyEmbeddedStore(db, pool);
    if (values.json) {
      console.log(JSON.stringify({ from: config.dataDir, to: describe(url), tables }));
    } else {
      console.log(`copied ${config.dataDir} into ${describe(url)}:`);
      for (const t of tables) console.log(`  ${t.table.padEnd(20)} ${String(t.postgres).padStart(9)} rows (embedded ${t.embedded})`);
      console.log("checked: every table's row count, the balances, amounts added to them, charged calls, ledger and folded amounts, refused calls");
    }
    return 0;
  } catch (e) {
    if (e instanceof CopyRefusedError) {
      console.error(`nothing copied: ${e.message}`);
      return 2;
    }
    // A connection error names the server, never the URL (it may hold a password).
    const code = (e as { code?: string }).code;
    console.error(`nothing copied: ${describe(url)}: ${(e as Error).message}${code ? ` (${code})` : ""}`);
    return 1;
  } finally {
    await pool.end();
    db.close();
    lock.release();
  }
}
