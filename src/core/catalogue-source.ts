import type { ItemDetail } from "../gen/gateway/catalogue/v1/retail_pb.js";
import type { PeerViewedItem } from "../gen/gateway/catalogue/v1/wholesale_pb.js";

/** A record as a source holds it, with when it was stored. */
export interface Found<T> {
  readonly found: true;
  readonly value: T;
  /** Unix seconds when the record was stored. */
  readonly storedAt: number;
  /** 32 lowercase hex characters identifying the stored entry. */
  readonly token: string;
}

/** A real answer that has no data (code 2000), with the reason the caller reads. */
export interface NotFound {
  readonly found: false;
  readonly reason: string;
}

/**
 * Where product data comes from: the embedded catalogue or an upstream
 * provider. A source throws GatewayError for faults (network, timeout,
 * target server) and answers NotFound for a real "no result".
 */
export interface CatalogueSource {
  /** Reported as the `_ddf` marker. */
  readonly label: string;
  /** `promotion`: whether promotion prices are wanted (legacy `is_promotion=1`). */
  itemDetail(numIid: string, promotion: boolean, signal: AbortSignal): Promise<Found<ItemDetail> | NotFound>;
  peerViewed(numIid: string, sid: string, signal: AbortSignal): Promise<Found<PeerViewedItem[]> | NotFound>;
}
