import { Code, ConnectError } from "@connectrpc/connect";
import zlib from "node:zlib";
import type { UniversalHandler, UniversalServerRequest, UniversalServerResponse } from "@connectrpc/connect/protocol";
import { codeToHttpStatus, errorFromJsonBytes, errorToJsonBytes } from "@connectrpc/connect/protocol-connect";
import { findTrailerError, setTrailerStatus } from "@connectrpc/connect/protocol-grpc";
import { trailerFlag, trailerParse } from "@connectrpc/connect/protocol-grpc-web";
import { fourDigits } from "../../contract/error-codes.ts";
import type { Gateway } from "../../core/gateway.ts";
import type { Operation } from "../../core/operation.ts";
import { ErrorCode, StatusBlockSchema } from "../../gen/gateway/catalogue/v1/status_pb.js";
import { answeredByServerKey, callLogKey, callReachedKey, clientIpKey, requestIdKey } from "./context.ts";
import { grpcWebTrailerFrame } from "./error-answer.ts";

/**
 * What connect-node answers for a request it refused before the method's
 * implementation ran (a body that does not decode or is too large, a
 * compression it does not speak, a malformed header), and what a catalogue
 * method answers instead: the error with the status block as its detail.
 * `Refuse` records the refusal and returns that error; undefined leaves the
 * answer as connect-node made it.
 */
export type Refuse = (error: ConnectError, req: UniversalServerRequest, transport: "connect" | "grpc" | "grpc-web") => Promise<ConnectError | undefined>;

// connect-es shares its protobuf serializer between clients and servers and
// codes a failed parse `internal`, right for a client reading a bad response
// but wrong for a server reading a caller's bad request: that is
// `invalid_argument`, as connect-es already answers for undecodable JSON.
const parseFailure = "parse binary:";

/**
 * connect-es's words for a message flagged compressed with no encoding
 * named: `internal`, as gRPC's protocol has it, but the caller's doing.
 */
const compressedWithoutEncoding = "received compressed envelope, but do not know how to decompress";

/** Whether an `internal` error is one connect-es gives a request it cannot read: the caller's fault, its code as the protocol prescribes. */
export function unreadableRequest(error: ConnectError): boolean {
  return error.code === Code.Internal && error.rawMessage === compressedWithoutEncoding;
}

/** The error as a server should answer it: connect-es's `internal` for a request whose bytes do not decode made `invalid_argument`. */
export function undecodableFixed(error: ConnectError): ConnectError {
  if (error.code !== Code.Internal || !error.rawMessage.startsWith(parseFailure)) return error;
  const fixed = new ConnectError(error.rawMessage, Code.InvalidArgument, error.metadata);
  fixed.details.push(...error.details);
  return fixed;
}

/** The error an answer ends with, as the caller will get it: undecodable requests made `invalid_argument`, then `refuse` asked for one without a status block. */
async function errorToSend(error: ConnectError, req: UniversalServerRequest, transport: "connect" | "grpc" | "grpc-web", refuse: Refuse | undefined): Promise<ConnectError | undefined> {
  const fixed = undecodableFixed(error);
  if (refuse !== undefined && error.code !== Code.Canceled && error.findDetails(StatusBlockSchema).length === 0) {
    const refused = await refuse(fixed, req, transport);
    if (refused !== undefined) return refused;
  }
  return fixed === error ? undefined : fixed;
}

async function* once(bytes: Uint8Array): AsyncIterable<Uint8Array> {
  yield bytes;
}

async function bytesOf(body: UniversalServerResponse["body"]): Promise<Uint8Array | undefined> {
  if (body instanceof Uint8Array) return body;
  if (body === undefined || typeof body !== "object" || body === null || !(Symbol.asyncIterator in body)) return undefined;
  const chunks: Uint8Array[] = [];
  for await (const c of body as AsyncIterable<Uint8Array>) chunks.push(c);
  return Buffer.concat(chunks);
}

/** An error body as connect-node compressed it (from 1 KiB on, as the caller accepts), or undefined for an encoding it does not use. */
function decompressed(bytes: Uint8Array, encoding: string | null): Uint8Array | undefined {
  if (encoding === null || encoding === "identity") return bytes;
  if (encoding === "gzip") return zlib.gunzipSync(bytes);
  if (encoding === "br") return zlib.brotliDecompressSync(bytes);
  return undefined;
}

/** Connect unary: an error is a non-200 answer with a JSON body (small; compressed only from 1 KiB on). A changed error is sent uncompressed. */
async function fixConnect(res: UniversalServerResponse, req: UniversalServerRequest, refuse: Refuse | undefined): Promise<UniversalServerResponse> {
  const bytes = await bytesOf(res.body);
  if (bytes === undefined) return res;
  const header = new Headers(res.header);
  const json = decompressed(bytes, header.get("content-encoding"));
  const answer = json === undefined ? undefined : await errorToSend(errorFromJsonBytes(json, undefined, new ConnectError("", Code.Unknown)), req, "connect", refuse);
  if (answer === undefined) return { ...res, header, body: once(bytes) };
  const body = errorToJsonBytes(answer, undefined);
  header.delete("content-encoding");
  header.set("content-length", String(body.byteLength));
  return { ...res, status: codeToHttpStatus(answer.code), header, body: once(body) };
}

/** gRPC: an error that came before any message is in the trailer once the handler returns. */
async function fixGrpc(res: UniversalServerResponse, req: UniversalServerRequest, refuse: Refuse | undefined): Promise<UniversalServerResponse> {
  const error = findTrailerError(res.trailer!);
  if (error === undefined) return res;
  const answer = await errorToSend(error, req, "grpc", refuse);
  if (answer === undefined) return res;
  const trailer = new Headers(res.trailer);
  trailer.delete("grpc-status-details-bin");
  return { ...res, trailer: setTrailerStatus(trailer, answer) };
}

/** gRPC-Web: the status is in a trailer frame at the end of the body (flag 0x80, a 4-byte length, then HTTP/1-style header lines). */
async function* fixGrpcWeb(body: AsyncIterable<Uint8Array>, req: UniversalServerRequest, refuse: Refuse | undefined): AsyncIterable<Uint8Array> {
  for await (const chunk of body) {
    const isTrailer = chunk.length >= 5 && chunk[0] === trailerFlag && Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength).readUInt32BE(1) === chunk.length - 5;
    const error = isTrailer ? findTrailerError(trailerParse(chunk.subarray(5))) : undefined;
    const answer = error === undefined ? undefined : await errorToSend(error, req, "grpc-web", refuse);
    if (answer === undefined) {
      yield chunk;
      continue;
    }
    const trailer = trailerParse(chunk.subarray(5));
    trailer.delete("grpc-status-details-bin");
    yield grpcWebTrailerFrame(setTrailerStatus(trailer, answer));
  }
}

async function fix(res: UniversalServerResponse, req: UniversalServerRequest, refuse: Refuse | undefined): Promise<UniversalServerResponse> {
  const contentType = res.header?.get("content-type") ?? "";
  if (res.status !== 200 && contentType.startsWith("application/json")) return fixConnect(res, req, refuse);
  if (contentType.startsWith("application/grpc-web")) {
    return res.body !== undefined && typeof res.body === "object" && Symbol.asyncIterator in res.body ? { ...res, body: fixGrpcWeb(res.body as AsyncIterable<Uint8Array>, req, refuse) } : res;
  }
  if (contentType.startsWith("application/grpc") && res.trailer?.has("grpc-status")) return fixGrpc(res, req, refuse);
  return res;
}

/** The longest delay Node's timers take (2^31 - 1 ms, 24.8 days); a longer one fires at once, with a warning on stderr. */
const maxTimerMs = 2 ** 31 - 1;
const grpcTimeoutUnitMs: Readonly<Record<string, number>> = { H: 3_600_000, M: 60_000, S: 1000, m: 1, u: 0.001, n: 0.000001 };

/** A deadline the caller may legally send (gRPC: up to 99999999 hours; Connect: ten digits of ms) past what a timer can hold, or not. */
function pastTimerRange(header: Headers): boolean {
  const grpc = header.get("grpc-timeout");
  const grpcParts = grpc === null ? null : /^(\d{1,8})([HMSmun])$/.exec(grpc);
  if (grpcParts !== null && Number(grpcParts[1]) * grpcTimeoutUnitMs[grpcParts[2]!]! > maxTimerMs) return true;
  const connect = header.get("connect-timeout-ms");
  return connect !== null && /^\d{1,10}$/.test(connect) && Number(connect) > maxTimerMs;
}

/**
 * The request with a deadline past 24.8 days taken as none. connect-node arms
 * a timer for a call's deadline, and Node fires one past its range at once:
 * a legal `grpc-timeout: 99999999H` or `connect-timeout-ms: 9999999999` ended
 * the call `deadline_exceeded` within a millisecond, and wrote a warning line
 * to stderr, one a call. The request timeout and the upstream deadline bound
 * every call long before such a deadline would.
 */
function withinTimerRange(req: UniversalServerRequest): UniversalServerRequest {
  if (!pastTimerRange(req.header)) return req;
  const header = new Headers(req.header);
  header.delete("grpc-timeout");
  header.delete("connect-timeout-ms");
  return { ...req, header };
}

/**
 * The handler, answering `invalid_argument` (not `internal`) when a request's
 * protobuf bytes do not decode, on every protocol; and with `refuse`, every
 * error connect-node made without a status block (a request refused before
 * the method ran) becomes the one `refuse` returns. A deadline past what a
 * timer holds is taken as none (withinTimerRange). A request the server
 * has answered itself meanwhile (answeredByServer) gets no second answer.
 */
export function refusedRequests(handler: UniversalHandler, refuse?: Refuse): UniversalHandler {
  const wrapped = async (req: UniversalServerRequest) => {
    const res = await handler(withinTimerRange(req));
    // Answered by the server already (a body the parser refused): `aborted` is connect-fastify's "nothing to write".
    if (req.contextValues?.get(answeredByServerKey)() === true) throw new ConnectError("the server answered this request itself", Code.Aborted);
    return await fix(res, req, refuse);
  };
  return Object.assign(wrapped, {
    service: handler.service,
    method: handler.method,
    requestPath: handler.requestPath,
    supportedContentType: handler.supportedContentType,
    protocolNames: handler.protocolNames,
    allowedMethods: handler.allowedMethods,
  });
}

/**
 * A request for an operation that connect-node refused before the call
 * reached the core, answered as the legacy path answers a request it cannot
 * read: recorded as a refusal (4003), and the status block sent as the
 * error's detail, its message starting with the four digits. Nothing of the
 * gateway's has run yet, so it is the request's fault whatever the code:
 * never a 4000, and never an error line in the log that a caller could fill.
 * The error keeps the code its protocol gives it (`resource_exhausted` for a
 * message over the size limit, `unimplemented` for a compression the server
 * does not speak, `internal` for a gRPC message flagged compressed without
 * an encoding, as gRPC's protocol has it). A refusal that cannot be recorded
 * leaves connect-node's answer as it is: there is no status block to send.
 */
export function unreadRequestRefusal(gateway: Gateway, operation: Operation): Refuse {
  return async (error, req, transport) => {
    const values = req.contextValues;
    if (values === undefined || values.get(callReachedKey)) return undefined;
    try {
      const refused = await gateway.refuse(ErrorCode.PARAM_ERROR, operation.catalogue, error.rawMessage, { clientIp: values.get(clientIpKey), transport, requestId: values.get(requestIdKey) || undefined, logFields: values.get(callLogKey) });
      return new ConnectError(`${fourDigits(ErrorCode.PARAM_ERROR)} ${refused.status.reason}`, error.code, undefined, [{ desc: StatusBlockSchema, value: refused.status }]);
    } catch {
      return undefined;
    }
  };
}
