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
        // Without FORCE while sessions are still closing: a pool's end() resolves before its
        // clients' sockets are closed, and FORCE then cuts one mid-close. Its "terminating
        // connection" error then reaches a client the pool no longer listens to, and it becomes the
        // test process's uncaught exception (test/replicas.test.ts, 1 run in about 10). The
        // sessions of killed replicas go within moments; FORCE only for what is left after 2 s.
        for (let i = 0; i < 40; i++) {
          try {
            await c.query(`DROP DATABASE IF EXISTS ${name}`);
            return;
          } catch (e) {
            if ((e as { code?: string }).code !== "55006" /* object_in_use: other sessions */) throw e;
            await new Promise((r) => setTimeout(r, 50));
          }
        }
        await c.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
      } finally {
        await c.end();
      }
    },
  };
}

/** While set, a watched statement's answer waits for `until` once it is in (`answered` is told then). */
export interface Hold {
  readonly until: Promise<void>;
  readonly answered: () => void;
}

/**
 * Watches the statements sent through `pool` whose text contains `fragment`
 * (a real pool, against the real server): counts them, and holds back their
 * answers while a hold is set. Every other statement passes untouched.
 */
export function watchQueries(pool: pg.Pool, fragment: string): { count: () => number; hold: (hold?: Hold) => void } {
  let count = 0;
  let held: Hold | undefined;
  const query = pool.query.bind(pool) as (...args: unknown[]) => Promise<unknown>;
  (pool as unknown as { query: (...args: unknown[]) => Promise<unknown> }).query = async (...args: unknown[]) => {
    // A statement is its text, or a config that holds it (`callStatement`'s, with its bound).
    const text = typeof args[0] === "object" && args[0] !== null ? (args[0] as { text?: unknown }).text : args[0];
    if (!String(text).includes(fragment)) return query(...args);
    count++;
    const wait = held;
    const answer = await query(...args);
    if (wait !== undefined) {
      wait.answered();
      await wait.until;
    }
    return answer;
  };
  return { count: () => count, hold: (hold) => (held = hold) };
}
