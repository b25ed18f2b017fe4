import type { Account } from "./accounts.ts";

/**
 * Where accounts live. Asynchronous, because a store may be remote; the
 * embedded adapter (SQLite) answers from memory and its own file.
 */
export interface AccountStore {
  find(key: string): Promise<Account | undefined>;
  list(): Promise<Account[]>;
  insert(account: Account): Promise<void>;
  /** Changes anything but the balance, which only moves by adjustBalance and by charged calls. */
  update(key: string, change: Partial<Omit<Account, "key" | "createdAt" | "balance">>): Promise<Account>;
  /** Adds to the balance (a top-up, or a negative correction), or makes the account unbilled by balance. */
  adjustBalance(key: string, change: bigint | "unbilled"): Promise<Account>;
}
