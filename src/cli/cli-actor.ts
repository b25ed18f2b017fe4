import { hostname, userInfo } from "node:os";

/** Who the CLI's changes are recorded as made by: the user and host it runs as. */
export function cliActor(): string {
  let user: string;
  try {
    user = userInfo().username;
  } catch {
    user = `uid ${process.getuid?.() ?? "?"}`; // no passwd entry (some containers)
  }
  return `cli ${user}@${hostname()}`;
}
