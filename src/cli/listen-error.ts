import { createServer } from "node:net";

/** A port the server could not listen on, told in one line; `exitCode` 2 where a setting must change, 1 where waiting may do (another process holds it). */
export class ListenError extends Error {
  override name = "ListenError";
  readonly exitCode: number;

  constructor(message: string, exitCode: number) {
    super(message);
    this.exitCode = exitCode;
  }
}

/** `e` (a failed listen) as the line that says why and what to set, where its code is one a setting explains; else `e`. */
export function listenError(e: unknown, host: string, port: number): unknown {
  const code = (e as NodeJS.ErrnoException).code;
  const where = `${host.includes(":") ? `[${host}]` : host}:${port}`;
  if (code === "EADDRINUSE") return new ListenError(`cannot listen on ${where}: another process listens there (EADDRINUSE); stop it, or set GATEWAY_PORT to another port`, 1);
  if (code === "EACCES") {
    return new ListenError(`cannot listen on ${where}: not permitted (EACCES); a port below 1024 needs root or CAP_NET_BIND_SERVICE (AmbientCapabilities= under systemd), or set GATEWAY_PORT to 1024 or above`, 2);
  }
  if (code === "EADDRNOTAVAIL") return new ListenError(`cannot listen on ${where}: no interface of this machine has that address (EADDRNOTAVAIL); set GATEWAY_HOST to one of its addresses, or 0.0.0.0`, 2);
  if (code === "ENOTFOUND" || code === "EAI_AGAIN") return new ListenError(`cannot listen on ${where}: GATEWAY_HOST does not resolve to an address (${code}); set it to an address or a name this machine resolves`, 2);
  return e;
}

/** Whether this process could listen on host:port now (it listens and closes at once): undefined, or the error `listenError` makes of it. */
export function listenProbe(host: string, port: number): Promise<unknown> {
  return new Promise((resolve) => {
    const server = createServer();
    server.once("error", (e) => resolve(listenError(e, host, port)));
    server.listen({ host, port, exclusive: true }, () => server.close(() => resolve(undefined)));
  });
}
