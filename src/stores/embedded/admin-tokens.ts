import type { DatabaseSync, StatementSync } from "node:sqlite";
import type { AdminTokenStore, NamedAdmin } from "../../core/admin-tokens.ts";
import { adminFromRow, type AdminRow } from "../admin-token-row.ts";
import type { ChangeWatch } from "./change-watch.ts";
import { writeTransaction } from "./sqlite-database.ts";

const columns = "name, created_at, created_by, revoked_at, revoked_by";

/**
 * Named admins in the embedded store. Lookups by token are served from
 * memory, dropped when another process (the CLI) commits, so a token the CLI
 * adds or revokes applies within the change watch's interval.
 */
export class SqliteAdminTokens implements AdminTokenStore {
  private readonly db: DatabaseSync;
  private readonly watch: ChangeWatch;
  private readonly cached = new Map<string, NamedAdmin | undefined>();
  private seenVersion = -1;
  private readonly byHash: StatementSync;
  private readonly insert: StatementSync;
  private readonly revokeRow: StatementSync;
  private readonly byName: StatementSync;
  private readonly all: StatementSync;

  constructor(db: DatabaseSync, watch: ChangeWatch) {
    this.db = db;
    this.watch = watch;
    this.byHash = db.prepare(`SELECT ${columns} FROM admin_tokens WHERE token_hash = ?`);
    this.insert = db.prepare(`INSERT INTO admin_tokens (name, token_hash, created_at, created_by) VALUES (?, ?, ?, ?) ON CONFLICT (name) DO NOTHING`);
    this.revokeRow = db.prepare("UPDATE admin_tokens SET revoked_at = ?, revoked_by = ? WHERE name = ? AND revoked_at IS NULL");
    this.byName = db.prepare(`SELECT ${columns} FROM admin_tokens WHERE name = ?`);
    this.all = db.prepare(`SELECT ${columns} FROM admin_tokens ORDER BY created_at, name`);
  }

  byTokenHash(hash: string): NamedAdmin | undefined {
    const version = this.watch.current();
    if (version !== this.seenVersion) {
      this.cached.clear();
      this.seenVersion = version;
    }
    if (this.cached.has(hash)) return this.cached.get(hash);
    const row = this.byHash.get(hash) as AdminRow | undefined;
    const admin = row === undefined ? undefined : adminFromRow(row);
    // Wrong tokens are remembered too (bounded), so a flood of one costs no query each.
    if (this.cached.size >= 10_000) this.cached.clear();
    this.cached.set(hash, admin);
    return admin;
  }

  async add(admin: NamedAdmin, tokenHash: string): Promise<boolean> {
    const added = Number(this.insert.run(admin.name, tokenHash, admin.createdAt, admin.createdBy).changes) === 1;
    this.cached.clear();
    return added;
  }

  async revoke(name: string, at: number, by: string): Promise<NamedAdmin | undefined> {
    const row = writeTransaction(this.db, () => {
      this.revokeRow.run(at, by, name);
      return this.byName.get(name) as AdminRow | undefined;
    });
    this.cached.clear();
    return row === undefined ? undefined : adminFromRow(row);
  }

  async list(): Promise<NamedAdmin[]> {
    return (this.all.all() as unknown as AdminRow[]).map(adminFromRow);
  }
}
