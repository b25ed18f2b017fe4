import { ErrorCode } from "../gen/gateway/catalogue/v1/status_pb.js";
import { GatewayError } from "./gateway-error.ts";
import type { Args, Operation } from "./operation.ts";
import type { TraceContext } from "./trace-context.ts";

/** A record as a source holds it, with when it was stored. */
export interface Found<T = unknown> {
  readonly found: true;
  readonly value: T;
  /** Unix seconds when the record was stored. */
  readonly storedAt: number;
  /** 32 lowercase hex characters identifying the stored entry. */
  readonly token: string;
}

/**
 * The requests a call's purchase sent to a paid provider, counted by the
 * source as it sends them (so a purchase that fails still counts what it
 * sent), for the call's ledger row (`LedgerRow.upstreamRequests`).
 */
export interface SentRequests {
  count: number;
}

/** A real answer that has no data (code 2000), with the reason the caller reads. */
export interface NotFound {
  readonly found: false;
  readonly reason: string;
}

/**
 * A source's timeout (4017) whose request is still open: the provider was
 * asked, may have billed it, and has not answered in the caller's time.
 * `landing` is its answer if one still comes (undefined for a fault, or
 * nothing by the source's own bound); the cache keeps it, so the item is
 * not bought again, and a call that asks for it meanwhile waits on it, for
 * at most `waitMs`, instead of buying it again.
 */
export class LateAnswer extends GatewayError {
  readonly landing: Promise<Found | NotFound | undefined>;
  readonly waitMs: number;

  constructor(reason: string, landing: Promise<Found | NotFound | undefined>, waitMs: number) {
    super(ErrorCode.TIMEOUT, reason);
    this.landing = landing;
    this.waitMs = waitMs;
  }
}

/**
 * Where product data comes from: the embedded catalogue or an upstream
 * provider. A source answers any operation from what the operation's
 * descriptor says; it throws GatewayError for faults (network, timeout,
 * target server; LateAnswer for a timeout whose answer may still come) and
 * answers NotFound for a real "no result".
 */
export interface CatalogueSource {
  /** Reported as the `_ddf` marker. */
  readonly label: string;
  /**
   * The gateway's own catalogue: an answer costs only a local read to make
   * again, so the cache keeps one from its second request on (see
   * doorkeeper.ts). An answer of a source that is not local (a paid
   * provider) is kept from the first: nothing is bought twice.
   */
  readonly local?: boolean;
  /**
   * `trace`: the context of the call that asked (TraceContext), for a source that calls another service.
   * `sent`: where a source that buys from a provider counts each request it sends for this fetch, retries included.
   */
  fetch(operation: Operation, args: Args, signal?: AbortSignal, trace?: TraceContext, sent?: SentRequests): Promise<Found | NotFound>;
}
