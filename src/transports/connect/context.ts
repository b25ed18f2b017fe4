import { createContextKey } from "@connectrpc/connect";
import type { AccessFields } from "../server/access-log.ts";

/** The caller's address, put into the handler context by the HTTP server. */
export const clientIpKey = createContextKey<string>("", { description: "caller's network address" });

/** The HTTP server's id of the request, the one its log lines carry. */
export const requestIdKey = createContextKey<string>("", { description: "the HTTP request's id in the logs" });

/** Set once a catalogue method's implementation runs: an error without it was connect-node's refusal of the request. */
export const callReachedKey = createContextKey<boolean>(false, { description: "the method's implementation ran" });

/** What the core tells the request's access line of the call (CallInput.logFields); undefined where no line is written. */
export const callLogKey = createContextKey<AccessFields | undefined>(undefined, { description: "what the core tells the access line of the call" });

/**
 * Whether the caller has gone, looked at now, beyond connect-node's signal
 * (caller-gone.ts): an HTTP/1.x caller that ended its side and reset, or an
 * HTTP/2 stream reset, which connect-node's signal hears of only as the
 * request closes, after reading the request has ended in an error of its own.
 */
export const callerGoneKey = createContextKey<() => boolean>(() => false, { description: "the caller has gone, looked at now" });

/** Whether the server has answered the request itself (a body the HTTP parser refused, client-errors.ts): the handler's answer is then dropped. */
export const answeredByServerKey = createContextKey<() => boolean>(() => false, { description: "the server answered the request itself" });

/**
 * For a streaming answer on HTTP/1.x, the signal that its caller ended its
 * side after the answer's head went (hang-up-check.ts callerEndedSignal):
 * a handler that can send a harmless message (a heartbeat) sends one at
 * once, so a caller that closed its socket is found by the reset it meets
 * rather than at the stream's next message. Undefined elsewhere (HTTP/2
 * tells a reset itself); asked for once by a streaming handler.
 */
export const callerEndedKey = createContextKey<() => AbortSignal | undefined>(() => undefined, { description: "the caller ended its side of an HTTP/1.x stream" });
