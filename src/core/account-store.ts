import type { Account } from "./accounts.ts";
import type { MaybeAsync } from "./maybe-async.ts";

/**
 * Where accounts live. Asynchronous, because a store may be remote; the
 * embedded adapter (SQLite) answers from memory and its own file, and
 * `find`, on every call's path, at once (MaybeAsync).
 */
export interface AccountStore {
  find(key: string): MaybeAsync<Account | undefined>;
  list(): Promise<Account[]>;
  /** Stores a new account; its `balance` is not stored here but by the meter (Meter.adjustBalance). */
  insert(account: Account): Promise<void>;
  /** Changes anything but the balance, which is the meter's: top-ups and charged calls move it. */
  update(key: string, change: Partial<Omit<Account, "key" | "createdAt" | "balance">>): Promise<Account>;
}
