// Writes the demo catalogue as NDJSON import records to standard output:
//   npm run -s demo:ndjson > demo.ndjson && npx gateway import demo.ndjson
import { demoRecords } from "../src/catalogue/demo-dataset.ts";

for (const record of demoRecords()) process.stdout.write(`${JSON.stringify(record)}\n`);
