import { parseArgs } from "node:util";
import type { GatewayConfig } from "../config.ts";
import { fourDigits } from "../contract/error-codes.ts";
import { AccountAdminError, usageAddress } from "../core/account-admin.ts";
import { csvLines, csvText } from "../render/csv.ts";
import { callPage, followCalls, maxCallPageSize, UsagePageError } from "../core/usage-pages.ts";
import { readFileSync, renameSync, writeFileSync } from "node:fs";
import type { LedgerRow, UsageQuery } from "../core/meter.ts";
import { formatMoney } from "../core/money.ts";
import type { ErrorCode } from "../gen/gateway/catalogue/v1/status_pb.js";
import { openRuntime } from "../runtime.ts";
import { formatDateTime, isCalendarDay } from "../core/clock.ts";
import { cliActor } from "./cli-actor.ts";

/** `gateway maintenance on|off OPERATION`, `gateway maintenance list` and `gateway maintenance history [--json]`. */
export async function maintenanceCommand(config: GatewayConfig, argv: string[]): Promise<number> {
  const { values, positionals } = parseArgs({ args: argv, allowPositionals: true, options: { json: { type: "boolean", default: false } } });
  const [sub, operation] = positionals;
  const runtime = await openRuntime(config);
  try {
    if (sub === "on" || sub === "off") {
      if (operation === undefined) throw new AccountAdminError(`usage: gateway maintenance ${sub} OPERATION`);
      await runtime.switches.setMaintenance(runtime.admin.operation(operation), sub === "on", { at: Date.now(), by: cliActor() });
    } else if (sub === "history") {
      const changes = (await runtime.switches.maintenanceChanges()).map((c) => ({ at: formatDateTime(c.at, config.timeZone), operation: c.operation, maintenance: c.on, by: c.by }));
      if (values.json) console.log(JSON.stringify(changes));
      else if (changes.length === 0) console.log("no maintenance switches recorded");
      else for (const c of changes) console.log(`${c.at}  ${c.maintenance ? "on " : "off"}  ${c.operation.padEnd(30)}  by ${c.by}`);
      return 0;
    } else if (sub !== "list") {
      throw new AccountAdminError("usage: gateway maintenance on|off OPERATION | list | history [--json]");
    }
    console.log(`under maintenance: ${(await runtime.switches.maintenance()).join(", ") || "nothing"}`);
    return 0;
  } finally {
    await runtime.close();
  }
}

/** `gateway usage`: the ledger's totals (and rows), filtered. */
export async function usageCommand(config: GatewayConfig, argv: string[]): Promise<number> {
  const { values } = parseArgs({
    args: argv,
    options: {
      account: { type: "string" },
      day: { type: "string" },
      from: { type: "string" },
      to: { type: "string" },
      operation: { type: "string" },
      code: { type: "string" },
      rows: { type: "string" },
      address: { type: "string" },
      "by-address": { type: "boolean", default: false },
      "request-id": { type: "string" },
      csv: { type: "boolean", default: false },
      json: { type: "boolean", default: false },
    },
  });
  for (const name of ["day", "from", "to"] as const) {
    const value = values[name];
    // A day out of the calendar matched nothing, and printed an empty report with exit 0, as if no call had been made.
    if (value !== undefined && !isCalendarDay(value)) throw new AccountAdminError(`--${name}: a day is YYYY-MM-DD, not ${JSON.stringify(value.slice(0, 32))}`);
  }
  const address = values.address === undefined ? undefined : usageAddress(values.address);
  if (values.csv && values.json) throw new AccountAdminError("--csv and --json: one or the other");
  if (values.code !== undefined && !/^\d{4}$/.test(values.code)) throw new AccountAdminError("--code takes a four-digit code such as 0000 or 4013");
  if (values.rows !== undefined && values.rows !== "all" && !/^\d{1,5}$/.test(values.rows)) throw new AccountAdminError("--rows takes a number up to 99999, or all");
  const every = values.rows === "all";
  // One call asked for by its id is shown as its row.
  const rowCount = every ? 0 : values.rows === undefined ? (values["request-id"] === undefined ? 0 : 1) : Number(values.rows);
  const runtime = await openRuntime(config);
  try {
    const filter: UsageQuery = {
      account: values.account,
      from: values.from ?? values.day,
      to: values.to ?? values.day,
      operation: values.operation === undefined ? undefined : runtime.admin.operation(values.operation),
      code: values.code === undefined ? undefined : (Number(values.code) as ErrorCode),
      address,
      requestId: values["request-id"],
    };
    const report = await runtime.meter.query({ ...filter, rows: rowCount, byAddress: values["by-address"] });
    const totals = report.totals.map((t) => ({ ...t, code: fourDigits(t.code), amount: formatMoney(t.amount) }));
    // The rows asked for: with --rows all, every row of the filter, read and written a page at a time (usage-pages.ts),
    // so a month's ledger goes out whole without being held whole.
    const meter = runtime.meter;
    async function* rowPages(): AsyncGenerator<readonly LedgerRow[]> {
      if (!every) {
        yield report.rows;
        return;
      }
      let pageToken = "";
      do {
        const page = await callPage(meter, { filter, pageSize: maxCallPageSize, pageToken });
        yield page.rows;
        pageToken = page.nextPageToken;
      } while (pageToken !== "" && !outputGone);
    }
    if (values.json) {
      await write(`{"totals":${JSON.stringify(totals)},"rows":[`);
      let first = true;
      for await (const rows of rowPages()) {
        if (rows.length === 0) continue;
        await write(`${first ? "" : ","}${rows.map(rowJson).join(",")}`);
        first = false;
      }
      await write("]}\n");
    } else if (values.csv) {
      // The rows when they are asked for, else the totals: one table a file, for a spreadsheet or a billing system.
      const by = values["by-address"];
      if (every || rowCount > 0) {
        await write(rowCsvHeader);
        for await (const rows of rowPages()) await write(rowCsv(rows));
      } else {
        await write(
          csvText(
            // Columns added later come last, so a reader that takes them by place goes on reading what it did.
            ["day", "account", "operation", "code", "charge", "calls", "amount", "cache_hits", ...(by ? ["client_ip"] : []), "upstream_requests"],
            totals.map((t) => [t.day, t.account ?? "", t.operation ?? "", t.code, t.charge, t.calls, t.amount, t.cacheHits, ...(by ? [t.clientIp ?? ""] : []), t.upstreamRequests]),
          ),
        );
      }
    } else {
      // An address is empty where the ledger kept none (calls from before it did, days folded past retention).
      const from = (ip: string | undefined) => (ip === undefined ? "" : `  from ${ip || "(not kept)"}`);
      const bought = (n: number) => (n === 0 ? "" : `  ${n} upstream request${n === 1 ? "" : "s"}`);
      for (const t of totals) console.log(`${t.day}  ${t.account ?? "-"}  ${t.operation ?? "-"}  ${t.code}  ${t.charge.padEnd(9)}  ${t.calls} calls  ${t.amount}${from(t.clientIp)}${bought(t.upstreamRequests)}`);
      for await (const rows of rowPages()) await write(rowText(rows));
    }
    return 0;
  } finally {
    await runtime.close();
  }
}

/** A ledger row as the CLI shows it: its code in four digits, its price in money. */
const shown = (r: LedgerRow) => ({ ...r, code: fourDigits(r.code), price: formatMoney(r.price) });
const rowJson = (r: LedgerRow) => JSON.stringify(shown(r));
const rowCsvHeader = csvText(["request_id", "time", "day", "account", "operation", "code", "charge", "price", "cache_hit", "latency_us", "transport", "client_ip", "upstream_requests"], []);
const rowCsv = (rows: readonly LedgerRow[]) =>
  csvLines(rows.map(shown).map((r) => [r.requestId, new Date(r.at).toISOString(), r.day, r.account ?? "", r.operation ?? "", r.code, r.charge, r.price, r.cacheHit, r.latencyMicros, r.transport, r.clientIp ?? "", r.upstreamRequests]));
const rowText = (rows: readonly LedgerRow[]) =>
  rows.map(shown).map((r) => `${r.requestId}  ${new Date(r.at).toISOString()}  ${r.account ?? "-"}  ${r.operation ?? "-"}  ${r.code}  ${r.charge}  ${r.price}  ${r.transport}  ${r.clientIp ?? "-"}\n`).join("");

/**
 * `gateway feed`: every call in the order the ledger committed it
 * (followCalls), from where the cursor file says the last run stopped, so
 * a billing system's cron job or pipe takes each call once. The cursor is
 * saved (written aside, then renamed over the file) after each page is
 * written out: a run killed between the two writes that page again on the
 * next run, so a reader that must count each call once keys on request_id.
 * With --follow it reads on as calls commit, until SIGINT or SIGTERM
 * (after the page it is writing) or its reader goes. With --from-now and
 * no cursor saved, it starts at the ledger's end (a live tail, or a biller
 * that starts from today rather than the ledger's first call); a saved
 * cursor is always read on from.
 */
export async function feedCommand(config: GatewayConfig, argv: string[]): Promise<number> {
  const { values } = parseArgs({
    args: argv,
    options: {
      "cursor-file": { type: "string" },
      follow: { type: "boolean", default: false },
      "from-now": { type: "boolean", default: false },
      every: { type: "string", default: "1" },
      csv: { type: "boolean", default: false },
      json: { type: "boolean", default: false },
    },
  });
  if (values.csv && values.json) throw new AccountAdminError("--csv and --json: one or the other");
  if (!/^(?:[1-9][0-9]{0,3}|0\.[1-9][0-9]?)$/.test(values.every)) throw new AccountAdminError("--every takes the seconds between reads when caught up, 0.1 to 9999");
  const pause = Math.round(Number(values.every) * 1000);
  const file = values["cursor-file"];
  let cursor = "";
  if (file !== undefined) {
    try {
      cursor = readFileSync(file, "utf8").trim();
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== "ENOENT") throw new AccountAdminError(`--cursor-file ${file}: ${(e as Error).message}`);
    }
  }
  // Saved aside, then renamed over the file: a run killed while saving leaves the cursor before, never half of one.
  const save = (c: string) => {
    if (file === undefined) return;
    try {
      writeFileSync(`${file}.tmp`, `${c}\n`);
      renameSync(`${file}.tmp`, file);
    } catch (e) {
      throw new AccountAdminError(`--cursor-file ${file}: cannot save the cursor (${(e as Error).message})`);
    }
  };
  // Before any call is written: a file that cannot be saved fails the run here, not after its first page.
  save(cursor);
  let stopping = false;
  const stop = () => (stopping = true);
  process.on("SIGINT", stop).on("SIGTERM", stop);
  const runtime = await openRuntime(config);
  try {
    if (values.csv) await write(rowCsvHeader);
    while (!stopping && !outputGone) {
      let page;
      try {
        page = await followCalls(runtime.meter, { cursor, fromNow: values["from-now"] && cursor === "", pageSize: maxCallPageSize });
      } catch (e) {
        if (e instanceof UsagePageError) throw new AccountAdminError(`${file === undefined ? "" : `--cursor-file ${file}: `}${e.message}`);
        throw e;
      }
      if (page.rows.length > 0) await write(values.json ? page.rows.map((r) => `${rowJson(r)}\n`).join("") : values.csv ? rowCsv(page.rows) : rowText(page.rows));
      if (outputGone) break;
      if (page.cursor !== cursor) save(page.cursor);
      cursor = page.cursor;
      if (!page.caughtUp) continue;
      if (!values.follow) break;
      for (let waited = 0; waited < pause && !stopping && !outputGone; waited += 100) await new Promise((r) => setTimeout(r, Math.min(100, pause - waited)));
    }
    return 0;
  } finally {
    process.off("SIGINT", stop).off("SIGTERM", stop);
    await runtime.close();
  }
}

/** Whether standard output's reader has gone (`usage … | head`): what is left is not written, nor read from the store. */
let outputGone = false;
let outputWatched = false;

/**
 * Writes to standard output, waiting while the reader is behind (a pipe to a
 * slow consumer), so a long listing is never held whole. A reader that goes
 * (EPIPE) ends the listing quietly, as `console.log` does, instead of an
 * unhandled error's stack.
 */
async function write(text: string): Promise<void> {
  if (!outputWatched) {
    outputWatched = true;
    process.stdout.on("error", (e: NodeJS.ErrnoException) => {
      if (e.code !== "EPIPE") throw e;
      outputGone = true;
    });
  }
  if (outputGone || text === "" || process.stdout.write(text)) return;
  await new Promise<void>((resolve) => {
    const done = () => {
      process.stdout.off("drain", done);
      process.stdout.off("error", done);
      resolve();
    };
    process.stdout.on("drain", done);
    process.stdout.on("error", done);
  });
}
