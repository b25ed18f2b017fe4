import { parseArgs } from "node:util";
import type { GatewayConfig } from "../config.ts";
import { AccountAdminError } from "../core/account-admin.ts";
import type { NamedAdmin } from "../core/admin-tokens.ts";
import { formatDateTime } from "../core/clock.ts";
import { openRuntime } from "../runtime.ts";
import { cliActor } from "./cli-actor.ts";

/** A named admin as the CLI prints it (`--json`): never its token, which is shown once, when it is added. */
function describeAdmin(a: NamedAdmin, zone: string) {
  return {
    name: a.name,
    created: formatDateTime(a.createdAt, zone),
    createdBy: a.createdBy,
    revoked: a.revokedAt === undefined ? null : formatDateTime(a.revokedAt, zone),
    revokedBy: a.revokedBy ?? null,
  };
}

/** `gateway admins add NAME | list | revoke NAME`: named admins, each with an admin token of its own. */
export async function adminsCommand(config: GatewayConfig, argv: string[]): Promise<number> {
  const { values, positionals } = parseArgs({ args: argv, allowPositionals: true, options: { json: { type: "boolean", default: false } } });
  const [sub, name] = positionals;
  const runtime = await openRuntime(config);
  const admins = runtime.admins.as(cliActor());
  const zone = config.timeZone;
  try {
    switch (sub) {
      case "add": {
        if (name === undefined) throw new AccountAdminError("usage: gateway admins add NAME [--json]");
        const { admin, token } = await admins.add(name);
        if (values.json) console.log(JSON.stringify({ ...describeAdmin(admin, zone), token }));
        else console.log(`admin: ${admin.name}\ntoken: ${token}\n(the token is shown once; only its hash is stored. Send it as authorization: Bearer <token>)`);
        return 0;
      }
      case "revoke": {
        if (name === undefined) throw new AccountAdminError("usage: gateway admins revoke NAME");
        const admin = await admins.revoke(name);
        console.log(values.json ? JSON.stringify(describeAdmin(admin, zone)) : `${admin.name}: revoked ${formatDateTime(admin.revokedAt!, zone)} by ${admin.revokedBy}; its token is refused from now on`);
        return 0;
      }
      case "list": {
        const all = (await admins.list()).map((a) => describeAdmin(a, zone));
        if (values.json) console.log(JSON.stringify(all));
        else if (all.length === 0) console.log("no named admins (GATEWAY_ADMIN_TOKEN aside)");
        else for (const a of all) console.log(`${a.name.padEnd(20)}  added ${a.created} by ${a.createdBy}${a.revoked === null ? "" : `; revoked ${a.revoked} by ${a.revokedBy}`}`);
        return 0;
      }
      default:
        throw new AccountAdminError("usage: gateway admins add NAME | list | revoke NAME [--json]");
    }
  } finally {
    await runtime.close();
  }
}
