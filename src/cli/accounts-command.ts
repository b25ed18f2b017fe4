import { parseArgs } from "node:util";
import type { GatewayConfig } from "../config.ts";
import type { Account } from "../core/accounts.ts";
import { AccountAdminError } from "../core/account-admin.ts";
import { openRuntime } from "../runtime.ts";

function describe(a: Account) {
  return {
    key: a.key,
    name: a.name,
    status: a.status,
    operations: Object.fromEntries(a.operations),
    max: a.dailyMax,
    expires: a.expires,
    zone: a.zone,
  };
}

export async function accountsCommand(config: GatewayConfig, argv: string[]): Promise<number> {
  const [sub, ...rest] = argv;
  const runtime = openRuntime(config);
  try {
    switch (sub) {
      case "create": {
        const { values } = parseArgs({
          args: rest,
          options: {
            json: { type: "boolean", default: false },
            name: { type: "string" },
            max: { type: "string" },
            expires: { type: "string" },
            zone: { type: "string" },
            operations: { type: "string" },
          },
        });
        if (values.max !== undefined && !/^[0-9]+$/.test(values.max)) throw new AccountAdminError("--max takes a whole number");
        const { account, secret } = runtime.admin.create({
          ...(values.name !== undefined ? { name: values.name } : {}),
          ...(values.max !== undefined ? { dailyMax: Number(values.max) } : {}),
          ...(values.expires !== undefined ? { expires: values.expires } : {}),
          ...(values.zone !== undefined ? { zone: values.zone } : {}),
          ...(values.operations !== undefined ? { operations: values.operations.split(",").filter(Boolean) as never } : {}),
        });
        if (values.json) {
          console.log(JSON.stringify({ ...describe(account), secret }));
        } else {
          console.log(`key:    ${account.key}\nsecret: ${secret}\n(the secret is shown once; only its hash is stored)`);
          console.log(`max ${account.dailyMax}/day, expires ${account.expires}, operations ${[...account.operations.keys()].join(", ")}`);
        }
        return 0;
      }
      case "list": {
        const { values } = parseArgs({ args: rest, options: { json: { type: "boolean", default: false } } });
        const accounts = runtime.admin.list().map(describe);
        if (values.json) console.log(JSON.stringify(accounts));
        else for (const a of accounts) console.log(`${a.key}  ${a.status.padEnd(7)}  max ${a.max}  expires ${a.expires}  ${a.name}  ${JSON.stringify(a.operations)}`);
        return 0;
      }
      case "stop":
      case "resume": {
        const [key] = rest;
        if (key === undefined) throw new AccountAdminError(`usage: gateway accounts ${sub} KEY`);
        runtime.admin.setStatus(key, sub === "stop" ? "stopped" : "active");
        console.log(`${key}: ${sub === "stop" ? "stopped" : "active"}`);
        return 0;
      }
      case "enable-api":
      case "disable-api":
      case "remove-api": {
        const [key, operation] = rest;
        if (key === undefined || operation === undefined) throw new AccountAdminError(`usage: gateway accounts ${sub} KEY OPERATION`);
        const state = sub === "enable-api" ? "enabled" : sub === "disable-api" ? "stopped" : "removed";
        const account = runtime.admin.setOperation(key, operation, state);
        console.log(`${key}: ${JSON.stringify(Object.fromEntries(account.operations))}`);
        return 0;
      }
      default:
        console.error("usage: gateway accounts create|list|stop|resume|enable-api|disable-api|remove-api …");
        return 2;
    }
  } finally {
    runtime.close();
  }
}
