import { SingleBar } from "cli-progress";
import { statSync } from "node:fs";
import { parseArgs } from "node:util";
import { importFile } from "../catalogue/file-import.ts";
import type { GatewayConfig } from "../config.ts";
import { openRuntime } from "../runtime.ts";

export async function importCommand(config: GatewayConfig, argv: string[]): Promise<number> {
  const { values, positionals } = parseArgs({ args: argv, allowPositionals: true, options: { json: { type: "boolean", default: false }, workers: { type: "string" } } });
  const [file] = positionals;
  if (file === undefined) {
    console.error("usage: gateway import FILE.ndjson [--json] [--workers N]");
    return 2;
  }
  const workers = values.workers === undefined ? undefined : Number(values.workers);
  if (workers !== undefined && !(Number.isInteger(workers) && workers >= 0 && workers <= 64)) {
    console.error("--workers must be a whole number from 0 to 64");
    return 2;
  }
  const bytes = statSync(file).size;
  const runtime = await openRuntime(config);
  // A progress bar only for a person at a terminal; pipes and CI get the summary alone.
  const bar = process.stderr.isTTY && !values.json ? new SingleBar({ format: "importing [{bar}] {percentage}% | {lines} lines", stream: process.stderr }) : undefined;
  bar?.start(Math.max(1, bytes), 0, { lines: 0 });
  try {
    const report = await importFile(runtime.catalogue, file, {
      storedAt: Math.floor(Date.now() / 1000),
      workers,
      onProgress: (done) => bar?.update(Math.min(done.bytes, bytes), { lines: done.lines }),
    });
    bar?.stop();
    if (values.json) {
      console.log(JSON.stringify(report));
    } else {
      for (const s of report.skipped) console.error(`line ${s.line}: ${s.message} (skipped)`);
      console.log(`imported ${report.imported} records, skipped ${report.skipped.length}`);
    }
    return report.skipped.length > 0 ? 1 : 0;
  } finally {
    await runtime.close();
  }
}
