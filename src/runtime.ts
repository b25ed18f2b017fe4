import { join } from "node:path";
import { demoRecords } from "./catalogue/demo-dataset.ts";
import { importRecords } from "./catalogue/catalogue-import.ts";
import type { GatewayConfig } from "./config.ts";
import { AccountAdmin } from "./core/account-admin.ts";
import { systemClock, type Clock } from "./core/clock.ts";
import { Gateway } from "./core/gateway.ts";
import { SqliteAccountStore } from "./stores/embedded/account-store.ts";
import { EmbeddedCatalogue } from "./stores/embedded/catalogue-store.ts";
import { openDatabase } from "./stores/embedded/sqlite-database.ts";
import { SqliteMeter } from "./stores/embedded/sqlite-meter.ts";
import { SqliteOperatorSwitches } from "./stores/embedded/operator-switches.ts";

/** The gateway's parts, wired to the embedded store under the data directory. */
export interface Runtime {
  readonly gateway: Gateway;
  readonly accounts: SqliteAccountStore;
  readonly admin: AccountAdmin;
  readonly meter: SqliteMeter;
  readonly switches: SqliteOperatorSwitches;
  readonly catalogue: EmbeddedCatalogue;
  /** Commits every queued ledger row, then closes the store. */
  close(): void;
}

export interface RuntimeOptions {
  readonly clock?: Clock;
  readonly log?: { error(obj: unknown, msg: string): void };
}

export function databasePath(config: Pick<GatewayConfig, "dataDir">): string {
  return join(config.dataDir, "gateway.db");
}

export function openRuntime(config: GatewayConfig, options: RuntimeOptions = {}): Runtime {
  const clock = options.clock ?? systemClock;
  const db = openDatabase(databasePath(config));
  const accounts = new SqliteAccountStore(db);
  const catalogue = new EmbeddedCatalogue(db);
  const meter = new SqliteMeter(db, { commitIntervalMs: config.ledgerCommitMs });
  const switches = new SqliteOperatorSwitches(db);
  const gateway = new Gateway(
    { accounts, meter, switches, sources: new Map([["retail", catalogue], ["wholesale", catalogue]]), log: options.log },
    { timeZone: config.timeZone, zoneLabel: config.zoneLabel, nodeLabel: config.nodeLabel, clock, lastRequestId: meter.lastRequestId() },
  );
  return {
    gateway,
    accounts,
    admin: new AccountAdmin(accounts, clock),
    meter,
    switches,
    catalogue,
    close: () => {
      meter.flush();
      db.close();
    },
  };
}

/** Seeds the demo catalogue into an empty embedded store. Returns whether it did. */
export async function seedDemoCatalogue(runtime: Runtime, clock: Clock = systemClock): Promise<boolean> {
  const size = runtime.catalogue.size();
  if (size.retail + size.wholesale > 0) return false;
  const report = await importRecords(runtime.catalogue, demoRecords(), { storedAt: Math.floor(clock.now() / 1000) });
  if (report.skipped.length > 0) throw new Error(`the demo dataset has invalid records: ${JSON.stringify(report.skipped.slice(0, 3))}`);
  return true;
}

export const demoAccountName = "demo";

/** The demo account, created on first use; its secret is replaced on every start and returned. */
export function demoAccount(runtime: Runtime): { key: string; secret: string } {
  const existing = runtime.admin.list().find((a) => a.name === demoAccountName);
  if (existing === undefined) {
    const { account, secret } = runtime.admin.create({ name: demoAccountName });
    return { key: account.key, secret };
  }
  return { key: existing.key, secret: runtime.admin.rotateSecret(existing.key) };
}
