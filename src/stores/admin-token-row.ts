import type { NamedAdmin } from "../core/admin-tokens.ts";

/**
 * A named admin as both SQL stores keep it (`admin_tokens`), without its
 * token's hash. Each driver hands the times in its own type (SQLite: number;
 * PostgreSQL: int8 read as text), so the reader takes either.
 */
export interface AdminRow {
  readonly name: string;
  readonly created_at: number | bigint | string;
  readonly created_by: string;
  readonly revoked_at: number | bigint | string | null;
  readonly revoked_by: string | null;
}

export function adminFromRow(r: AdminRow): NamedAdmin {
  return {
    name: r.name,
    createdAt: Number(r.created_at),
    createdBy: r.created_by,
    ...(r.revoked_at !== null ? { revokedAt: Number(r.revoked_at), revokedBy: r.revoked_by ?? "" } : {}),
  };
}
