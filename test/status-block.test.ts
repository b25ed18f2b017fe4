import { create, equals, toBinary, toJson } from "@bufbuild/protobuf";
import { describe, expect, it } from "vitest";
import { newStatusBlock } from "../src/core/status-block.ts";
import { StatusBlockSchema } from "../src/gen/gateway/catalogue/v1/status_pb.js";

describe("newStatusBlock", () => {
  it("has every field of the proto's StatusBlock, each at the value create() gives it", () => {
    const ours = newStatusBlock() as unknown as Record<string, unknown>;
    const theirs = create(StatusBlockSchema) as unknown as Record<string, unknown>;
    expect(Object.keys(ours).sort()).toEqual(["$typeName", ...StatusBlockSchema.fields.map((f) => f.localName)].sort());
    for (const f of StatusBlockSchema.fields) expect(ours[f.localName], f.name).toStrictEqual(theirs[f.localName]);
    expect(ours.$typeName).toBe(theirs.$typeName);
    expect(equals(StatusBlockSchema, newStatusBlock(), create(StatusBlockSchema))).toBe(true);
    expect(toBinary(StatusBlockSchema, newStatusBlock())).toEqual(toBinary(StatusBlockSchema, create(StatusBlockSchema)));
    expect(toJson(StatusBlockSchema, newStatusBlock(), { alwaysEmitImplicit: true })).toEqual(toJson(StatusBlockSchema, create(StatusBlockSchema), { alwaysEmitImplicit: true }));
  });

  it("is a new object each time, its map too", () => {
    const a = newStatusBlock();
    a.callArgs.num_iid = "1";
    expect(newStatusBlock().callArgs).toEqual({});
  });
});
