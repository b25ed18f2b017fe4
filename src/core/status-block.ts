import type { StatusBlock } from "../gen/gateway/catalogue/v1/status_pb.js";

/**
 * A StatusBlock with every field at its zero value (`success` and `language`
 * unset), written as one object literal. `create(StatusBlockSchema)` adds its
 * 22 fields one keyed store at a time, which leaves V8 a dictionary-mode
 * object: every call paid for it in creating the block and again in each
 * read and write of its fields. The same message to protobuf-es (the
 * status-block test compares it with `create`'s field by field).
 */
export function newStatusBlock(): StatusBlock {
  return {
    $typeName: "gateway.catalogue.v1.StatusBlock",
    error: "",
    reason: "",
    errorCode: 0,
    success: undefined,
    cache: false,
    apiInfo: "",
    executionTime: 0,
    serverTime: "",
    callArgs: {},
    apiType: "",
    requestId: "",
    translateLanguage: "",
    translateEngine: "",
    serverMemory: "",
    clientIp: "",
    ddf: "",
    lastId: "",
    secache: "",
    secacheTime: 0n,
    secacheDate: "",
    translateStatus: "",
    translateTime: 0,
    language: undefined,
  };
}
