import { parseArgs } from "node:util";
import { ConfigError, loadConfig } from "../config.ts";
import { AccountAdminError } from "../core/account-admin.ts";
import { accountsCommand } from "./accounts-command.ts";
import { importCommand } from "./import-command.ts";
import { serveCommand } from "./serve-command.ts";

const usage = `usage: gateway <command> [options]

commands:
  serve [--demo]                     start the gateway (--demo: seed the demo catalogue and print a demo account)
  accounts create [--json] [--name N] [--max N] [--expires YYYY-MM-DD] [--zone Z] [--operations a,b]
  accounts list [--json]
  accounts stop KEY | resume KEY
  accounts enable-api KEY OP | disable-api KEY OP | remove-api KEY OP
  import FILE.ndjson [--json]        load item records into the embedded catalogue

Settings come from GATEWAY_* environment variables (see README.md).`;

async function main(argv: string[]): Promise<number> {
  const [command, ...rest] = argv;
  if (command === undefined || command === "help" || command === "--help" || command === "-h") {
    console.log(usage);
    return command === undefined ? 2 : 0;
  }
  const config = loadConfig();
  switch (command) {
    case "serve": {
      const { values } = parseArgs({ args: rest, options: { demo: { type: "boolean", default: false } } });
      return serveCommand(config, { demo: values.demo });
    }
    case "accounts":
      return accountsCommand(config, rest);
    case "import":
      return importCommand(config, rest);
    default:
      console.error(`unknown command ${command}\n\n${usage}`);
      return 2;
  }
}

main(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code;
  },
  (e: unknown) => {
    if (e instanceof ConfigError || e instanceof AccountAdminError || (e as { code?: string }).code === "ERR_PARSE_ARGS_UNKNOWN_OPTION") {
      console.error((e as Error).message);
      process.exitCode = 2;
    } else {
      console.error(e);
      process.exitCode = 1;
    }
  },
);
