import { parseArgs } from "node:util";
import { ConfigError, loadConfig } from "../config.ts";
import { AccountAdminError } from "../core/account-admin.ts";
import { accountsCommand } from "./accounts-command.ts";
import { adminsCommand } from "./admins-command.ts";
import { backupCommand, restoreCommand } from "./backup-command.ts";
import { checkCommand } from "./check-command.ts";
import { importCommand } from "./import-command.ts";
import { migrateCommand } from "./migrate-command.ts";
import { feedCommand, maintenanceCommand, usageCommand } from "./operator-commands.ts";
import { MoneyError } from "../core/money.ts";
import { ListenError } from "./listen-error.ts";
import { serveCommand } from "./serve-command.ts";
import { DataDirectoryInUseError, DataDirectoryUnusableError } from "../stores/embedded/data-directory-lock.ts";
import { TlsFilesError } from "../transports/server/tls-certificate.ts";

const usage = `usage: gateway <command> [options]

commands:
  serve [--demo]                     start the gateway (--demo: seed the demo catalogue and print a demo account)
  check [--json]                     what serve would start with, read and never written: settings, TLS files, the stores
                                     and their schema, accounts, exposure (exit 1 with a failure)
  accounts create [--json] [--name N] [--max N] [--concurrency N] [--rate 10/s|600/min|5000/h] [--burst N]
                  [--balance D] [--expires YYYY-MM-DD] [--zone Z] [--operations a,b] [--price OP=PRICE ...]
  accounts list [--json]
  accounts stop KEY | resume KEY
  accounts enable-api KEY OP | disable-api KEY OP | remove-api KEY OP
  accounts set-plan KEY [--max N] [--concurrency N] [--rate N/s|N/min|N/h|none] [--burst N]
                   [--expires YYYY-MM-DD] [--zone Z]
  accounts top-up KEY AMOUNT | set-price KEY OP PRICE
  accounts rotate-secret KEY [--keep-old 24h] [--json]
                                     a new secret (shown once); the old one stops working, or after --keep-old (at most 30d)
  accounts statement KEY [--json]    the balance accounted for: every top-up, and what calls took between them
  accounts history KEY [--json]      every change of the account: when, by whom, and what it moved
  maintenance on|off OP | list       put an operation under maintenance (4009 for everyone)
  maintenance history [--json]       every switch into or out of maintenance: when, which, by whom
  admins add NAME | list | revoke NAME [--json]
                                     named admins, each with an admin token of its own (shown once)
  usage [--account K] [--day D | --from D --to D] [--operation OP] [--code NNNN] [--rows N|all] [--json]
        [--address IP|NET] [--by-address] [--request-id ID] [--csv]
                                     the ledger's totals (and rows; all: every row, a page at a time): from one address or network, per address, one call
  feed [--cursor-file F] [--from-now] [--follow [--every S]] [--csv | --json]
                                     every call in the order the ledger committed it, from where F says the last run stopped
                                     (saved after each page); --from-now: with no cursor saved, from the newest call, not the
                                     oldest; --follow: on as calls commit, until SIGINT or SIGTERM
  import FILE.ndjson [--json]        load item records into the embedded catalogue
  migrate --to postgres://… [--json] copy the embedded data directory into an empty PostgreSQL database
  backup FILE [--json]               a consistent copy of the embedded store, taken while the gateway serves, checked whole
  restore FILE [--json]              the embedded store replaced by a backup (the gateway stopped); the one replaced is kept

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
    case "check":
      return checkCommand(config, rest);
    case "backup":
      return backupCommand(config, rest);
    case "restore":
      return restoreCommand(config, rest);
    case "accounts":
      return accountsCommand(config, rest);
    case "import":
      return importCommand(config, rest);
    case "maintenance":
      return maintenanceCommand(config, rest);
    case "admins":
      return adminsCommand(config, rest);
    case "usage":
      return usageCommand(config, rest);
    case "feed":
      return feedCommand(config, rest);
    case "migrate":
      return migrateCommand(config, rest);
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
    if (e instanceof ListenError) {
      console.error(e.message);
      process.exitCode = e.exitCode;
    } else if (e instanceof ConfigError || e instanceof AccountAdminError || e instanceof MoneyError || e instanceof DataDirectoryInUseError || e instanceof DataDirectoryUnusableError || e instanceof TlsFilesError || String((e as { code?: string }).code).startsWith("ERR_PARSE_ARGS")) {
      // One line: the bad value and what is accepted; never a stack.
      console.error((e as Error).message.split("\n").filter(Boolean).join(" "));
      process.exitCode = 2;
    } else {
      console.error(e);
      process.exitCode = 1;
    }
  },
);
