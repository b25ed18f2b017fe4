// The wrapper that gives a request connect-node refused its status block
// (src/transports/connect/refused-requests.ts), at handler level: the cases
// a real client cannot easily make connect-node produce. The real refusals,
// over every protocol and with real clients, are in rpc-transports.test.ts.
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, createContextValues } from "@connectrpc/connect";
import type { UniversalHandler, UniversalServerRequest, UniversalServerResponse } from "@connectrpc/connect/protocol";
import { errorFromJsonBytes, errorToJsonBytes } from "@connectrpc/connect/protocol-connect";
import zlib from "node:zlib";
import { describe, expect, it } from "vitest";
import { ErrorCode, StatusBlockSchema } from "../src/gen/gateway/catalogue/v1/status_pb.js";
import { callReachedKey } from "../src/transports/connect/context.ts";
import type { Gateway } from "../src/core/gateway.ts";
import type { Operation } from "../src/core/operation.ts";
import { refusedRequests, unreadRequestRefusal, type Refuse } from "../src/transports/connect/refused-requests.ts";

async function* once(bytes: Uint8Array): AsyncIterable<Uint8Array> {
  yield bytes;
}

async function bytesOf(res: UniversalServerResponse): Promise<Buffer> {
  const chunks: Uint8Array[] = [];
  for await (const c of res.body as AsyncIterable<Uint8Array>) chunks.push(c);
  return Buffer.concat(chunks);
}

/** A handler that answers every request with `error` as Connect error JSON, compressed with `encoding` when given. */
function answering(error: ConnectError, encoding?: "gzip" | "br"): UniversalHandler {
  const handler = async (): Promise<UniversalServerResponse> => {
    const json = errorToJsonBytes(error, undefined);
    const body = encoding === "gzip" ? zlib.gzipSync(json) : encoding === "br" ? zlib.brotliCompressSync(json) : json;
    const header = new Headers({ "content-type": "application/json", "content-length": String(body.byteLength) });
    if (encoding !== undefined) header.set("content-encoding", encoding);
    return { status: 400, header, body: once(body) };
  };
  return Object.assign(handler, { service: {}, method: { name: "ItemGet" }, requestPath: "/x/ItemGet", supportedContentType: () => true, protocolNames: ["connect"], allowedMethods: ["POST"] }) as unknown as UniversalHandler;
}

const request = (reached = false): UniversalServerRequest => {
  const contextValues = createContextValues();
  if (reached) contextValues.set(callReachedKey, true);
  return { httpVersion: "1.1", method: "POST", url: "http://x/x/ItemGet", header: new Headers({ "content-type": "application/json" }), body: once(new Uint8Array()), signal: new AbortController().signal, contextValues };
};

/** A refusal as unreadRequestRefusal gives one: the caller's code kept, a status block added. */
const refuse = (calls: ConnectError[]): Refuse => async (error) => {
  calls.push(error);
  const status = create(StatusBlockSchema, { errorCode: ErrorCode.PARAM_ERROR, reason: error.rawMessage, requestId: "gw-1.0000000000001" });
  return new ConnectError(`4003 ${error.rawMessage}`, error.code, undefined, [{ desc: StatusBlockSchema, value: status }]);
};

describe("refusedRequests, on a Connect error connect-node made", () => {
  it("gives a compressed error (connect-node compresses from 1 KiB on) its status block, sent uncompressed", async () => {
    for (const encoding of ["gzip", "br"] as const) {
      const calls: ConnectError[] = [];
      const long = `cannot decode message: ${"x".repeat(2000)}`;
      const res = await refusedRequests(answering(new ConnectError(long, Code.InvalidArgument), encoding), refuse(calls))(request());
      expect(res.header?.get("content-encoding")).toBeNull();
      const body = await bytesOf(res);
      expect(res.header?.get("content-length")).toBe(String(body.length));
      const err = errorFromJsonBytes(body, undefined, new ConnectError("", Code.Unknown));
      expect(err.code).toBe(Code.InvalidArgument);
      expect(err.findDetails(StatusBlockSchema)[0]?.reason).toBe(long);
      expect(calls).toHaveLength(1);
    }
  });

  it("makes an undecodable protobuf body invalid_argument (connect-es says internal) before refusing it", async () => {
    const calls: ConnectError[] = [];
    const res = await refusedRequests(answering(new ConnectError("parse binary: premature EOF", Code.Internal)), refuse(calls))(request());
    expect(res.status).toBe(400);
    expect(calls[0]?.code).toBe(Code.InvalidArgument);
    expect(errorFromJsonBytes(await bytesOf(res), undefined, new ConnectError("", Code.Unknown)).findDetails(StatusBlockSchema)).toHaveLength(1);
  });

  it("leaves an error that already carries a status block, and a canceled call, as they are", async () => {
    const calls: ConnectError[] = [];
    const status = create(StatusBlockSchema, { errorCode: ErrorCode.ACCOUNT_NOT_FOUND });
    const withStatus = new ConnectError("4004 no such key", Code.Unauthenticated, undefined, [{ desc: StatusBlockSchema, value: status }]);
    const original = errorToJsonBytes(withStatus, undefined);
    expect(Buffer.from(await bytesOf(await refusedRequests(answering(withStatus), refuse(calls))(request())))).toEqual(Buffer.from(original));
    await bytesOf(await refusedRequests(answering(new ConnectError("gone", Code.Canceled)), refuse(calls))(request()));
    expect(calls).toHaveLength(0);
  });

  it("without a refusal (the AdminService, health, reflection), only makes undecodable bytes invalid_argument", async () => {
    const res = await refusedRequests(answering(new ConnectError("parse binary: premature EOF", Code.Internal)))(request());
    const err = errorFromJsonBytes(await bytesOf(res), undefined, new ConnectError("", Code.Unknown));
    expect(err.code).toBe(Code.InvalidArgument);
    expect(err.findDetails(StatusBlockSchema)).toHaveLength(0);
  });
});

describe("unreadRequestRefusal", () => {
  const operation = { catalogue: "retail" } as unknown as Operation;
  const fakeGateway = (calls: unknown[]) =>
    ({
      refuse: async (code: ErrorCode, apiType: string, reason: string) => {
        calls.push([code, apiType, reason]);
        return { kind: "error", operation: undefined, status: create(StatusBlockSchema, { errorCode: code, reason, apiType }) };
      },
    }) as unknown as Gateway;

  it("records a request connect-node refused as 4003 whatever its code, keeping the code", async () => {
    const calls: unknown[] = [];
    const refusal = unreadRequestRefusal(fakeGateway(calls), operation);
    const err = await refusal(new ConnectError("message size 9 is larger than configured readMaxBytes 8", Code.ResourceExhausted), request(), "grpc");
    expect(err?.code).toBe(Code.ResourceExhausted);
    expect(err?.rawMessage).toBe("4003 message size 9 is larger than configured readMaxBytes 8");
    expect(err?.findDetails(StatusBlockSchema)[0]?.apiType).toBe("retail");
    // gRPC's answer to a message flagged compressed without an encoding: the caller's fault, not the gateway's (4000).
    const flagged = await refusal(new ConnectError("received compressed envelope, but do not know how to decompress", Code.Internal), request(), "grpc");
    expect(flagged?.code).toBe(Code.Internal);
    expect(flagged?.findDetails(StatusBlockSchema)[0]?.errorCode).toBe(ErrorCode.PARAM_ERROR);
    expect(calls).toHaveLength(2);
  });

  it("leaves an error from a call that reached the method: the core or the interceptor answered it, and it is recorded or logged already", async () => {
    const calls: unknown[] = [];
    expect(await unreadRequestRefusal(fakeGateway(calls), operation)(new ConnectError("internal error; quote request id gw-1", Code.Internal), request(true), "connect")).toBeUndefined();
    expect(calls).toHaveLength(0);
  });

  it("leaves connect-node's answer when the refusal cannot be recorded: there is no status block to send", async () => {
    const failing = { refuse: async () => Promise.reject(new Error("disk full")) } as unknown as Gateway;
    expect(await unreadRequestRefusal(failing, operation)(new ConnectError("bad", Code.InvalidArgument), request(), "connect")).toBeUndefined();
  });
});
