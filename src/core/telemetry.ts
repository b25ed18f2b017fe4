import type { ErrorCode } from "../gen/gateway/catalogue/v1/status_pb.js";
import type { Limit } from "./gateway-error.ts";
import type { LedgerCommitOutcome, Transport } from "./meter.ts";
import type { AlertKind } from "./alerts.ts";

/** What became of a call's look into the response cache. */
export type CacheResult = "hit" | "miss" | "stale" | "coalesced";

/** Why a call's caller stopped waiting for it: its deadline passed, or it hung up (closed, reset or cancelled). */
export type StoppedWaiting = "deadline" | "hung_up";

/** Where a call was when its caller stopped waiting: before it reached its source (nothing bought), or before its answer was ready. */
export type AbandonStage = "before_source" | "before_answer";

/** What the store said of a call's idempotency key (src/core/idempotency.ts): taken for it, a replay of a charged call, held by a copy in flight, kept for another request. */
export type KeyOutcome = "taken" | "replayed" | "in_flight" | "other_request";

/** Why an authentication failed; never the key or secret itself. */
export type AuthFailure = "missing_key" | "unknown_key" | "bad_credentials" | "address_not_allowed" | "address_locked" | "admin_token";

/**
 * What the core and its adapters tell an operator's metrics. Each method is
 * called on the call's own path, so an implementation must be cheap and must
 * never throw; labels are operation ids, codes, transports and catalogue
 * names, never an account key.
 */
export interface Telemetry {
  callStarted(): void;
  /** Every call that reached an operation or was refused before one (operation ""). */
  callFinished(operation: string, code: ErrorCode, transport: Transport, seconds: number): void;
  /** A call answered 4017 and not charged because its caller stopped waiting (CallInput.deadline, CallInput.gone). */
  callAbandoned(operation: string, why: StoppedWaiting, stage: AbandonStage): void;
  /** A call a limit refused (4008, 4013 or 4016): which one. */
  callLimited(operation: string, limit: Limit): void;
  cacheEvent(operation: string, result: CacheResult): void;
  /** A call that sent an idempotency key: what became of the key. */
  idempotencyKey(operation: string, outcome: KeyOutcome): void;
  /**
   * One call to the upstream provider, retries included; outcome `ok`, `not_found`, `timeout`, `circuit_open`,
   * `refused` (the provider refused the gateway's own account, or held its calls back), `held` (not sent: the provider
   * had asked the gateway to wait, its Retry-After) or `error`; `sent`: the requests it wrote to a connection, which may have reached the provider (as the ledger's `upstream_requests`).
   */
  upstreamRequest(operation: string, outcome: string, seconds: number, sent: number): void;
  /**
   * A request to the upstream provider still unanswered when its caller was told 4017 (LateAnswer), by what became
   * of it: its answer came before the call's deadline (`landed`), a fault or nothing came (`failed`), or it was
   * cut at once, with no room to wait for it (`abandoned`).
   */
  upstreamLate(operation: string, outcome: "landed" | "failed" | "abandoned"): void;
  /** One answer of the upstream provider refusing the gateway's own account (`code`: its 4004–4016), retries each counted. */
  upstreamRefused(operation: string, code: string): void;
  circuitChanged(catalogue: string, open: boolean): void;
  /** Spans of the gateway's own taken by the collector (`exported`), refused by it in a partial success (`rejected`), or lost (`dropped`: a full queue, a collector that refused the batch or did not answer). */
  spans(outcome: "exported" | "rejected" | "dropped", n: number): void;
  /** One attempt to deliver a usage alert (alerts.ts): delivered, to be tried again, or given up. */
  alertAttempt(kind: AlertKind, outcome: "delivered" | "retried" | "given_up"): void;
  /** One group commit of the usage ledger. */
  ledgerCommitted(seconds: number, rows: number): void;
  /** A ledger commit sent and not answered, by what became of it (`LedgerCommitOutcome`), and the calls it held. */
  ledgerCommitUnanswered(outcome: LedgerCommitOutcome, calls: number): void;
  authFailed(reason: AuthFailure): void;
}

/** Telemetry that records nothing: the default, and what tests of the core use. */
export const noTelemetry: Telemetry = {
  callStarted() {},
  callFinished() {},
  callAbandoned() {},
  callLimited() {},
  cacheEvent() {},
  idempotencyKey() {},
  upstreamRequest() {},
  upstreamLate() {},
  upstreamRefused() {},
  circuitChanged() {},
  spans() {},
  alertAttempt() {},
  ledgerCommitted() {},
  ledgerCommitUnanswered() {},
  authFailed() {},
};
