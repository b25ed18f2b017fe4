import { Agent, request } from "undici";
import type { AlertPost, AlertSent } from "../core/alerts.ts";
import { alertHostAllowed, alertHostRefused } from "../core/alerts.ts";
import { alertBody, alertRetryAt, alertSecretsAt, alertSignature, type AlertAttempt, type AlertKind, type AlertOutbox, type DueAlert } from "../core/alerts.ts";

export interface AlertDeliveryOptions {
  /** How often due alerts are looked for. */
  readonly intervalMs: number;
  /** One POST's limit; a receiver that has not answered by then has failed this attempt. */
  readonly timeoutMs: number;
  /** Alerts taken at once (and so POSTs at once). */
  readonly batch: number;
  /** How often keys near their last day are looked for (AlertOutbox.recordExpiring). */
  readonly expiryEveryMs: number;
  /** Wall time (ms): alerts are recorded and retried by the store's clock, not a test's. */
  readonly now: () => number;
  /** Told of each attempt's end. */
  readonly onAttempt: (kind: AlertKind, outcome: "delivered" | "retried" | "given_up") => void;
  /** Told when the store cannot be asked for alerts; at most once a minute. */
  readonly onError: (e: unknown) => void;
}

export const defaultAlertDeliveryOptions: AlertDeliveryOptions = {
  intervalMs: 1000,
  timeoutMs: 5000,
  batch: 16,
  expiryEveryMs: 600_000,
  now: Date.now,
  onAttempt: () => {},
  onError: () => {},
};

/** Why an attempt failed, in words that never hold the URL (which may carry the receiver's token). */
function attemptError(e: unknown, timeoutMs: number): string {
  const err = e as { name?: string; code?: string; cause?: { code?: string } };
  if (err.name === "TimeoutError" || err.name === "AbortError") return `no answer within ${timeoutMs} ms`;
  const code = err.code ?? err.cause?.code;
  return typeof code === "string" && /^[A-Z_]+$/.test(code) ? `the connection failed (${code})` : "the connection failed";
}

/**
 * POSTs alerts, signed, each on a connection of its own (no keep-alive): a
 * POST on a kept connection that the receiver has closed meanwhile fails, and
 * is not sent again by the client. Redirects are not followed; an answer's
 * body is read up to 64 KiB and dropped.
 */
export class AlertSender implements AlertPost {
  private readonly timeoutMs: number;
  private readonly hosts: readonly string[];
  private readonly agent = new Agent({ pipelining: 0, connect: { timeout: 5000 } });

  /** `hosts`: where alerts may go (alertHostAllowed; GATEWAY_ALERT_HOSTS), checked again here for URLs set before the list. */
  constructor(timeoutMs: number, hosts: readonly string[] = []) {
    this.timeoutMs = timeoutMs;
    this.hosts = hosts;
  }

  async send(url: string, secrets: readonly string[], id: string, body: string, unixSeconds: number): Promise<AlertSent> {
    if (!alertHostAllowed(url, this.hosts)) return { delivered: false, status: undefined, error: alertHostRefused, ms: 0, final: true };
    const started = performance.now();
    const ms = () => Math.round(performance.now() - started);
    try {
      const res = await request(url, {
        method: "POST",
        dispatcher: this.agent,
        signal: AbortSignal.timeout(this.timeoutMs),
        headers: {
          "content-type": "application/json",
          "user-agent": "product-data-gateway-alerts",
          "gateway-alert-id": id,
          "gateway-signature": alertSignature(secrets, unixSeconds, body),
        },
        body,
      });
      // Without an error to handle: destroying the body instead had thrown an uncaught AbortError.
      await res.body.dump({ limit: 65_536 }).catch(() => {});
      const status = res.statusCode;
      return status >= 200 && status < 300 ? { delivered: true, status, ms: ms() } : { delivered: false, status, error: `answered HTTP ${status}`, ms: ms() };
    } catch (e) {
      return { delivered: false, status: undefined, error: attemptError(e, this.timeoutMs), ms: ms() };
    }
  }

  close(): Promise<void> {
    return this.agent.close().catch(() => {});
  }
}

/**
 * Delivers usage alerts: every `intervalMs` it claims the alerts due from the
 * store (every `expiryEveryMs` recording first the keys near their last day)
 * and POSTs each to its account's URL, signed (`Gateway-Signature`),
 * with its id (`Gateway-Alert-Id`, the body's `id`: the same on every
 * attempt, so a receiver can drop a repeat). A 2xx answer delivers it;
 * anything else (another status, a redirect, no answer) is tried again
 * after 10 s, doubling to at most an hour apart, 30 attempts in all (about 22 hours).
 */
export class AlertDeliveries {
  private readonly outbox: AlertOutbox;
  private readonly options: AlertDeliveryOptions;
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<number> | undefined;
  private stopped = false;
  private erredAt = -Infinity;
  private expiryAt = -Infinity;
  private readonly sender: AlertSender;
  /** Whether the sender is this deliverer's own, to close when it stops (not one it was handed). */
  private readonly ownSender: boolean;

  /** `sender`: what POSTs the alerts (the runtime's one, with the operator's hosts); by default one of its own, any host, `timeoutMs` a POST. */
  constructor(outbox: AlertOutbox, options: Partial<AlertDeliveryOptions> = {}, sender?: AlertSender) {
    this.outbox = outbox;
    this.options = { ...defaultAlertDeliveryOptions, ...options };
    this.sender = sender ?? new AlertSender(this.options.timeoutMs);
    this.ownSender = sender === undefined;
  }

  /** Looks at once (what waited through a restart goes out now), then every `intervalMs`, and again at once after a full batch. */
  start(): void {
    const tick = () => {
      if (this.stopped) return;
      void this.poll()
        .catch(() => 0)
        .then((n) => {
          if (!this.stopped) this.timer = setTimeout(tick, n >= this.options.batch ? 0 : this.options.intervalMs).unref();
        });
    };
    this.timer = setTimeout(tick, 0).unref();
  }

  /** Stops looking; an attempt in flight is finished (and recorded) first. */
  async stop(): Promise<void> {
    this.stopped = true;
    clearTimeout(this.timer);
    await this.running?.catch(() => 0);
    if (this.ownSender) await this.sender.close();
  }

  /** Claims the alerts due now and makes one attempt at each; resolves with how many it attempted. One poll at a time. */
  poll(): Promise<number> {
    this.running ??= this.pollOnce().finally(() => {
      this.running = undefined;
    });
    return this.running;
  }

  private async pollOnce(): Promise<number> {
    const { now, batch, timeoutMs, expiryEveryMs } = this.options;
    let due: DueAlert[];
    try {
      if (now() - this.expiryAt >= expiryEveryMs) {
        this.expiryAt = now();
        await this.outbox.recordExpiring(now());
      }
      // A claim outlasts an attempt, so no other replica starts the same one meanwhile.
      due = await this.outbox.claimDue(now(), batch, timeoutMs * 2 + 5000);
    } catch (e) {
      this.report(e);
      return 0;
    }
    await Promise.all(due.map((a) => this.attempt(a)));
    return due.length;
  }

  private async attempt(alert: DueAlert): Promise<void> {
    // A URL the alerts were turned off for, or one whose host the gateway may not send to, is given up at once.
    const outcome: AlertAttempt & { readonly final?: boolean } =
      alert.url === "" || alert.secret === "" ? { delivered: false, error: "the account's alerts were turned off", final: true } : await this.post(alert);
    const at = this.options.now();
    const retryAt = outcome.delivered || outcome.final === true ? undefined : alertRetryAt(alert.attempts, at);
    try {
      await this.outbox.settle(alert.id, outcome, at, retryAt);
    } catch (e) {
      // The claim lapses and the alert is tried again: at least once.
      this.report(e);
      return;
    }
    this.options.onAttempt(alert.kind, outcome.delivered ? "delivered" : retryAt === undefined ? "given_up" : "retried");
  }

  private async post(alert: DueAlert): Promise<AlertAttempt & { readonly final?: boolean }> {
    const now = this.options.now();
    const sent = await this.sender.send(alert.url, alertSecretsAt(alert.secret, alert.previousSecrets, now), `alert-${alert.id}`, alertBody(alert), Math.floor(now / 1000));
    return sent.delivered ? { delivered: true } : { delivered: false, error: sent.error, ...(sent.final ? { final: true } : {}) };
  }

  private report(e: unknown): void {
    const now = this.options.now();
    if (now - this.erredAt < 60_000) return;
    this.erredAt = now;
    this.options.onError(e);
  }
}
