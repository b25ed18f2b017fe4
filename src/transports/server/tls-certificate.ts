import { createHash, X509Certificate } from "node:crypto";
import { readFileSync } from "node:fs";
import { readFile } from "node:fs/promises";
import tls from "node:tls";

/** A certificate (with any chain after it) and its private key, as PEM. */
export interface TlsCredentials {
  readonly cert: string | Buffer;
  readonly key: string | Buffer;
}

/** What a certificate says of itself: enough for an operator to tell which one is served, never anything of the key. */
export interface CertificateFacts {
  readonly subject: string;
  /** SHA-256 of the certificate's DER, as `openssl x509 -fingerprint -sha256` prints it. */
  readonly fingerprint: string;
  readonly notBefore: Date;
  readonly notAfter: Date;
}

/** Why a reload kept the certificate it had. */
export type ReloadOutcome = "reloaded" | "unchanged" | "refused";

/** Where a reload is told: the app's logger, and the metrics when the app has them. */
export interface TlsReloadWatchers {
  readonly log: { info(obj: object, msg: string): void; warn(obj: object, msg: string): void; error(obj: object, msg: string): void };
  readonly telemetry?: { tlsCertificate(facts: CertificateFacts): void; tlsReload(outcome: "reloaded" | "refused"): void };
}

/** The TLS files configured cannot serve: the start stops, with this one line. */
export class TlsFilesError extends Error {}

/** An OpenSSL or file error in words that quote no file contents (a key's bytes never appear); the collector's TLS files too (exporters/otlp-plan.ts). */
export function reasonOf(e: unknown): string {
  const err = e as { code?: string; reason?: string; message?: string };
  if (typeof err.code === "string" && err.code.startsWith("E") && !err.code.startsWith("ERR_")) return err.code; // ENOENT, EACCES…
  // A key under a passphrase: the gateway is given none (OpenSSL's "bad decrypt").
  if (err.reason === "bad decrypt" || /passphrase/i.test(err.message ?? "")) return "the key is encrypted with a passphrase; give the gateway an unencrypted key";
  if (typeof err.reason === "string" && err.reason !== "") return err.reason; // OpenSSL's: "key values mismatch"
  return err.code ?? "unreadable";
}

/**
 * Checks that a certificate and key can serve TLS together, as the server
 * would use them, and reads the certificate's facts; throws naming the
 * problem otherwise. The key's bytes appear in no error.
 */
export function checkCredentials(pair: TlsCredentials): CertificateFacts {
  let x509: X509Certificate;
  try {
    x509 = new X509Certificate(pair.cert);
  } catch (e) {
    throw new Error(`the certificate is not a PEM certificate (${reasonOf(e)})`);
  }
  try {
    tls.createSecureContext({ cert: pair.cert, key: pair.key });
  } catch (e) {
    throw new Error(`the certificate and key cannot serve TLS together (${reasonOf(e)})`);
  }
  return { subject: x509.subject.replaceAll("\n", ", "), fingerprint: x509.fingerprint256, notBefore: x509.validFromDate, notAfter: x509.validToDate };
}

/** A short digest of a pair's bytes: how a reload knows whether the files changed since it last looked. */
function digestOf(cert: Buffer, key: Buffer): string {
  return createHash("sha256").update(cert).update("\0").update(key).digest("hex");
}

/**
 * The TLS certificate and key files of a serving gateway, read again while
 * it runs: on SIGHUP (`serve`), and every `checkEveryMs` when their bytes
 * have changed, as a renewal writes them (certbot, cert-manager's secret
 * volume, a copy by hand). A new pair is checked first and served only if
 * it works: new connections get it, open ones keep the one they shook hands
 * with. A pair that does not work (a key that is not the certificate's, a
 * file half written or missing) is refused, logged once per change of the
 * files, and the certificate before keeps being served; nothing a reload
 * finds stops the gateway.
 */
export class TlsCertificateFiles {
  private pair: { readonly cert: Buffer; readonly key: Buffer };
  private current: CertificateFacts;
  /** The digest of the files as last read, served or refused: unchanged files are not checked (or logged) again. */
  private lastSeen: string;
  /** The digest of the pair served. */
  private served: string;
  private server: tls.Server | undefined;
  private watchers: TlsReloadWatchers | undefined;
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<ReloadOutcome> | undefined;

  readonly paths: { readonly cert: string; readonly key: string };
  readonly checkEveryMs: number;

  private constructor(paths: { readonly cert: string; readonly key: string }, checkEveryMs: number, cert: Buffer, key: Buffer) {
    this.paths = paths;
    this.checkEveryMs = checkEveryMs;
    this.current = checkCredentials({ cert, key });
    this.pair = { cert, key };
    this.lastSeen = this.served = digestOf(cert, key);
  }

  /** Reads and checks the pair at start: a pair that cannot serve stops the start, naming the problem and the files. */
  static open(paths: { readonly cert: string; readonly key: string }, options: { readonly checkEveryMs: number }): TlsCertificateFiles {
    const read = (what: string, path: string) => {
      try {
        return readFileSync(path);
      } catch (e) {
        throw new TlsFilesError(`the TLS ${what} file ${path} cannot be read (${reasonOf(e)})`);
      }
    };
    const cert = read("certificate", paths.cert);
    const key = read("key", paths.key);
    try {
      return new TlsCertificateFiles(paths, options.checkEveryMs, cert, key);
    } catch (e) {
      throw new TlsFilesError(`TLS: ${(e as Error).message} (GATEWAY_TLS_CERT ${paths.cert}, GATEWAY_TLS_KEY ${paths.key})`);
    }
  }

  /** The pair the server starts with. */
  get credentials(): TlsCredentials {
    return this.pair;
  }

  /** The certificate served now. */
  get facts(): CertificateFacts {
    return this.current;
  }

  /** Serves the pair on `server` from now on, and starts looking at the files every `checkEveryMs` (0: only when asked). */
  serve(server: tls.Server, watchers: TlsReloadWatchers): void {
    this.server = server;
    this.watchers = watchers;
    watchers.telemetry?.tlsCertificate(this.current);
    this.warnIfNotValid(this.current);
    if (this.checkEveryMs > 0) {
      this.timer = setInterval(() => void this.reload("files changed"), this.checkEveryMs);
      this.timer.unref();
    }
  }

  /** Stops looking at the files. */
  stop(): void {
    clearInterval(this.timer);
    this.timer = undefined;
  }

  /**
   * Reads the files again and serves them if they changed and work. `why`
   * is told in the log: a signal's reload is always told, even when the
   * files are unchanged; the periodic look only when they changed. One
   * reload at a time: a second asked meanwhile gets the first's outcome.
   */
  reload(why: "SIGHUP" | "files changed"): Promise<ReloadOutcome> {
    this.running ??= this.readAgain(why).finally(() => (this.running = undefined));
    return this.running;
  }

  private async readAgain(why: "SIGHUP" | "files changed"): Promise<ReloadOutcome> {
    const told = why === "SIGHUP";
    const log = this.watchers?.log;
    let cert: Buffer;
    let key: Buffer;
    try {
      [cert, key] = await Promise.all([readFile(this.paths.cert), readFile(this.paths.key)]);
    } catch (e) {
      // A renewal may be replacing the files right now: the next look reads them whole.
      const seen = `unreadable ${reasonOf(e)}`;
      if (told || seen !== this.lastSeen) log?.error({ reason: why, cert: this.paths.cert, key: this.paths.key, problem: reasonOf(e), serving: this.current.fingerprint }, "TLS certificate not reloaded: its files cannot be read; the one before is still served");
      if (seen !== this.lastSeen) this.watchers?.telemetry?.tlsReload("refused");
      this.lastSeen = seen;
      return "refused";
    }
    const digest = digestOf(cert, key);
    if (digest === this.served) {
      this.lastSeen = digest;
      if (told) log?.info({ reason: why, fingerprint: this.current.fingerprint, notAfter: this.current.notAfter.toISOString() }, "TLS certificate unchanged");
      return "unchanged";
    }
    const changed = digest !== this.lastSeen;
    this.lastSeen = digest;
    let facts: CertificateFacts;
    try {
      facts = checkCredentials({ cert, key });
      this.server?.setSecureContext({ cert, key });
    } catch (e) {
      if (told || changed) {
        log?.error({ reason: why, cert: this.paths.cert, key: this.paths.key, problem: (e as Error).message, serving: this.current.fingerprint }, "TLS certificate not reloaded; the one before is still served");
        this.watchers?.telemetry?.tlsReload("refused");
      }
      return "refused";
    }
    const before = this.current;
    this.pair = { cert, key };
    this.current = facts;
    this.served = digest;
    log?.info(
      { reason: why, subject: facts.subject, fingerprint: facts.fingerprint, notAfter: facts.notAfter.toISOString(), before: before.fingerprint },
      "TLS certificate reloaded: new connections get it, open ones keep theirs",
    );
    this.watchers?.telemetry?.tlsReload("reloaded");
    this.watchers?.telemetry?.tlsCertificate(facts);
    this.warnIfNotValid(facts);
    return "reloaded";
  }

  /** A certificate past its time (or before it) is served (a renewal may be on its way), and said loudly. */
  private warnIfNotValid(facts: CertificateFacts): void {
    const now = Date.now();
    if (facts.notAfter.getTime() <= now) this.watchers?.log.warn({ fingerprint: facts.fingerprint, notAfter: facts.notAfter.toISOString() }, "the TLS certificate served has expired: clients will refuse it");
    else if (facts.notBefore.getTime() > now) this.watchers?.log.warn({ fingerprint: facts.fingerprint, notBefore: facts.notBefore.toISOString() }, "the TLS certificate served is not valid yet: clients will refuse it");
  }
}
