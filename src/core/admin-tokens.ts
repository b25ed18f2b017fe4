import { createHash } from "node:crypto";
import { AccountAdminError } from "./account-admin.ts";
import { newSecret } from "./accounts.ts";
import { readWithin, type Clock } from "./clock.ts";
import type { MaybeAsync } from "./maybe-async.ts";

/**
 * A named admin: a person (or a tool) with an admin token of their own, so
 * the AdminService and the console know who makes each change (an account's
 * history records it), and one person's access ends without changing
 * anyone else's. Names are never reused: a revoked admin stays listed, so a
 * name in a history always means the same holder.
 */
export interface NamedAdmin {
  readonly name: string;
  readonly createdAt: number;
  /** Who added it (`AccountChange.by`). */
  readonly createdBy: string;
  readonly revokedAt?: number | undefined;
  readonly revokedBy?: string | undefined;
}

/** Where named admins live; only a token's SHA-256 is kept, never the token. */
export interface AdminTokenStore {
  /** The admin whose token hashes to `hash`, revoked or not; at once where the store holds it in memory (MaybeAsync). */
  byTokenHash(hash: string): MaybeAsync<NamedAdmin | undefined>;
  /** Adds an admin with its token's hash; false, adding nothing, when the name is taken. */
  add(admin: NamedAdmin, tokenHash: string): Promise<boolean>;
  /** Revokes an admin's token (a revoked one stays revoked, as it was); undefined for a name no admin has. */
  revoke(name: string, at: number, by: string): Promise<NamedAdmin | undefined>;
  /** Every admin, the revoked too, oldest first. */
  list(): Promise<NamedAdmin[]>;
}

/** The hex SHA-256 of a token: tokens are random (about 238 bits), so an unsalted digest is as good as a salted one, and it can be looked up. */
export function tokenHash(token: string): string {
  return createHash("sha256").update(token).digest("hex");
}

const validName = /^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$/;

/** A token's prefix: a scanner that finds one in a log or a repository knows what it found. */
export const adminTokenPrefix = "gwa_";

/** How long whether any admin exists is trusted (asked only by a request that matched no token). */
const anyFreshMs = 1000;

/** Named admins over their store: adding one (its token shown once), revoking, listing, and telling who a presented token names. */
export class AdminTokens {
  private readonly store: AdminTokenStore;
  private readonly clock: Clock;
  /** Who changes made through this are recorded as made by. */
  readonly by: string;
  private anyKnown: { any: boolean; at: number } | undefined;

  constructor(store: AdminTokenStore, clock: Clock, by = "gateway") {
    this.store = store;
    this.clock = clock;
    this.by = by;
  }

  /** The same, recording its changes as made by `by`. */
  as(by: string): AdminTokens {
    return new AdminTokens(this.store, this.clock, by);
  }

  /** Adds an admin; its token is returned once, and only its hash is kept. */
  async add(name: string): Promise<{ admin: NamedAdmin; token: string }> {
    if (!validName.test(name)) throw new AccountAdminError(`an admin's name is 1 to 63 letters, digits, '.', '_' or '-', starting with a letter or digit, not ${JSON.stringify(name)}`);
    const token = `${adminTokenPrefix}${newSecret()}`;
    const admin: NamedAdmin = { name, createdAt: this.clock.now(), createdBy: this.by };
    if (!(await this.store.add(admin, tokenHash(token)))) throw new AccountAdminError(`there is already an admin named ${name} (names are never reused, a revoked one's included)`);
    this.anyKnown = undefined;
    return { admin, token };
  }

  /** Ends an admin's access: its token is refused from now on (by every replica within a second). */
  async revoke(name: string): Promise<NamedAdmin> {
    const admin = await this.store.revoke(name, this.clock.now(), this.by);
    if (admin === undefined) throw new AccountAdminError(`no admin is named ${name}`);
    return admin;
  }

  list(): Promise<NamedAdmin[]> {
    return this.store.list();
  }

  /** The admin a presented token names, revoked or not (the caller tells the two apart); undefined for a token of no admin. */
  identify(token: string): MaybeAsync<NamedAdmin | undefined> {
    if (!token.startsWith(adminTokenPrefix)) return undefined;
    return this.store.byTokenHash(tokenHash(token));
  }

  /** Whether any admin exists, revoked ones aside (read at most once a second). */
  async any(): Promise<boolean> {
    const now = this.clock.now();
    if (this.anyKnown !== undefined && readWithin(this.anyKnown.at, now, anyFreshMs)) return this.anyKnown.any;
    const any = (await this.store.list()).some((a) => a.revokedAt === undefined);
    this.anyKnown = { any, at: now };
    return any;
  }
}
