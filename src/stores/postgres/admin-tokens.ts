import type pg from "pg";
import type { AdminTokenStore, NamedAdmin } from "../../core/admin-tokens.ts";
import { adminFromRow, type AdminRow } from "../admin-token-row.ts";
import type { MaybeAsync } from "../../core/maybe-async.ts";
import { readWithin } from "../../core/clock.ts";
import { accountFreshMs } from "./account-store.ts";
import { callStatement } from "./postgres-database.ts";

const columns = "name, created_at::text AS created_at, created_by, revoked_at::text AS revoked_at, revoked_by";

/**
 * Named admins in the shared store. A replica trusts what it read of a token
 * for at most `accountFreshMs`, as it does an account: a token added or
 * revoked anywhere applies everywhere within a second.
 */
export class PostgresAdminTokens implements AdminTokenStore {
  private readonly pool: pg.Pool;
  private readonly now: () => number;
  private readonly cached = new Map<string, { admin: NamedAdmin | undefined; at: number }>();

  constructor(pool: pg.Pool, now: () => number = Date.now) {
    this.pool = pool;
    this.now = now;
  }

  byTokenHash(hash: string): MaybeAsync<NamedAdmin | undefined> {
    const known = this.cached.get(hash);
    const now = this.now();
    if (known !== undefined && readWithin(known.at, now, accountFreshMs)) return known.admin;
    return this.pool.query<AdminRow>(callStatement(`SELECT ${columns} FROM admin_tokens WHERE token_hash = $1`, [hash])).then((r) => {
      const admin = r.rows[0] === undefined ? undefined : adminFromRow(r.rows[0]);
      if (this.cached.size >= 10_000) this.cached.clear();
      this.cached.set(hash, { admin, at: now });
      return admin;
    });
  }

  async add(admin: NamedAdmin, tokenHash: string): Promise<boolean> {
    const r = await this.pool.query("INSERT INTO admin_tokens (name, token_hash, created_at, created_by) VALUES ($1, $2, $3, $4) ON CONFLICT (name) DO NOTHING", [
      admin.name,
      tokenHash,
      String(admin.createdAt),
      admin.createdBy,
    ]);
    this.cached.clear();
    return r.rowCount === 1;
  }

  async revoke(name: string, at: number, by: string): Promise<NamedAdmin | undefined> {
    await this.pool.query("UPDATE admin_tokens SET revoked_at = $2, revoked_by = $3 WHERE name = $1 AND revoked_at IS NULL", [name, String(at), by]);
    this.cached.clear();
    const r = await this.pool.query<AdminRow>(`SELECT ${columns} FROM admin_tokens WHERE name = $1`, [name]);
    return r.rows[0] === undefined ? undefined : adminFromRow(r.rows[0]);
  }

  async list(): Promise<NamedAdmin[]> {
    return (await this.pool.query<AdminRow>(`SELECT ${columns} FROM admin_tokens ORDER BY admin_tokens.created_at, name`)).rows.map(adminFromRow);
  }
}
