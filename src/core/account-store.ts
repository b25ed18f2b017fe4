import type { AccountChange, AccountEdit } from "./account-history.ts";
import type { Account } from "./accounts.ts";
import type { MaybeAsync } from "./maybe-async.ts";

/** A new account's external id is another account's already (AccountStore.insert): nothing was stored. */
export class ExternalIdTaken extends Error {
  override name = "ExternalIdTaken";
  readonly externalId: string;
  constructor(externalId: string) {
    super("another account has this external id");
    this.externalId = externalId;
  }
}

/** Which accounts a store lists (AccountStore.listing). */
export interface AccountListing {
  /** Lowercase text a key, a name or an external id (lowercased, Unicode-wise) must hold; empty: any. */
  readonly text: string;
  readonly status: Account["status"] | undefined;
  /** Only accounts after this one in list()'s order; undefined: from the first. */
  readonly after: { readonly createdAt: number; readonly key: string } | undefined;
  /** At most this many; 0: every one. */
  readonly limit: number;
}

/**
 * Where accounts live. Asynchronous, because a store may be remote; the
 * embedded adapter (SQLite) answers from memory and its own file, and
 * `find`, on every call's path, at once (MaybeAsync).
 */
export interface AccountStore {
  find(key: string): MaybeAsync<Account | undefined>;
  /** Every account, in the order they were made, then by key (by code unit, whatever the store's collation). */
  list(): Promise<Account[]>;
  /**
   * The accounts a listing asks for, in list()'s order, filtered and cut by
   * the store itself (only the page's rows are read out and decoded), and
   * how many accounts match the filter in all.
   */
  listing(ask: AccountListing): Promise<{ readonly accounts: Account[]; readonly total: number }>;
  /** The account with this external id (Account.externalId), read as committed. */
  findByExternalId(externalId: string): Promise<Account | undefined>;
  /**
   * Stores a new account with the record of its creation, in one
   * transaction; its `balance` is not stored here but by the meter
   * (Meter.adjustBalance). Throws ExternalIdTaken, storing nothing, when
   * another account has its external id.
   */
  insert(account: Account, created: AccountChange): Promise<void>;
  /**
   * Changes an account's settings (anything but the balance, which is the
   * meter's): reads the account as committed, under a lock no other change
   * of it passes (from this process, the CLI or another replica), hands it to
   * `edit`, and writes the fields `edit` returns with its record, in one
   * transaction. So two changes made at once both hold, whatever either had
   * read before. `edit` may throw (the change is refused, nothing written) or
   * return undefined (nothing to change). Undefined when no account has the key.
   */
  change(key: string, edit: (current: Account) => AccountEdit | undefined): Promise<Account | undefined>;
  /** Every recorded change of the account's settings, oldest first. */
  history(key: string): Promise<AccountChange[]>;
}
