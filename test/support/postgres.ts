import { randomBytes } from "node:crypto";
import pg from "pg";

/** The PostgreSQL server the tests use (trust auth on loopback, as .ci/run sets it up). */
export const adminUrl = process.env.GATEWAY_TEST_POSTGRES_URL ?? "postgres://postgres@127.0.0.1:5432/postgres";

/** A database of the test file's own, dropped by `drop()`: files run in parallel without meeting. */
export async function freshDatabase(prefix: string): Promise<{ url: string; name: string; drop(): Promise<void> }> {
  const name = `gw_${prefix}_${randomBytes(5).toString("hex")}`;
  const admin = new pg.Client({ connectionString: adminUrl });
  await admin.connect();
  try {
    await admin.query(`CREATE DATABASE ${name}`);
  } finally {
    await admin.end();
  }
  const url = new URL(adminUrl);
  url.pathname = `/${name}`;
  return {
    url: url.href,
    name,
    async drop() {
      const c = new pg.Client({ connectionString: adminUrl });
      await c.connect();
      try {
        await c.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
      } finally {
        await c.end();
      }
    },
  };
}
