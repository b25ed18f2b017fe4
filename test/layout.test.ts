import { readdirSync, readFileSync } from "node:fs";
import { join, relative } from "node:path";
import { describe, expect, it } from "vitest";
import { operations } from "../src/operations/index.ts";

/**
 * The layout's rules, read off the source (STYLE.md): contract, core,
 * adapters, transports, each importing only what sits below it.
 */
const src = join(import.meta.dirname, "..", "src");

function sources(under: string): { path: string; text: string }[] {
  return readdirSync(join(src, under), { recursive: true, withFileTypes: true })
    .filter((e) => e.isFile() && e.name.endsWith(".ts"))
    .map((e) => join(e.parentPath, e.name))
    .map((p) => ({ path: relative(src, p), text: readFileSync(p, "utf8") }));
}

function imports(text: string): string[] {
  return [...text.matchAll(/^\s*(?:import|export)\b[^;]*?\bfrom\s+"([^"]+)"/gms)].map((m) => m[1]!);
}

function offending(under: string, forbidden: (specifier: string) => boolean): string[] {
  return sources(under).flatMap(({ path, text }) => imports(text).filter(forbidden).map((s) => `${path} imports ${s}`));
}

describe("the layout", () => {
  it("the contract depends on no RPC library: Connect codes are mapped at the transport edge", () => {
    expect(offending("contract", (s) => s.startsWith("@connectrpc/"))).toEqual([]);
  });

  it("the core imports neither the client helpers nor any transport or store", () => {
    expect(offending("core", (s) => /\/(client|transports|stores|sources|render|cli)\//.test(s) || s.startsWith("@connectrpc/") || s === "fastify")).toEqual([]);
  });

  it("the client helpers run in a browser: no Node built-ins, nothing of the server", () => {
    expect(offending("client", (s) => s.startsWith("node:") || /\/(core|transports|stores|sources|cli)\//.test(s))).toEqual([]);
  });

  it("no source file outside src/operations (and generated code) names an operation", () => {
    // An operation is named by its id, its legacy path or its RPC's full name; the descriptor table is the one place for them.
    const names = operations.flatMap((op) => [op.id, op.path, `${op.service.typeName}/${op.method.name}`, `${op.service.name}/${op.method.name}`]);
    const found = sources(".")
      .filter(({ path }) => !path.startsWith("operations/") && !path.startsWith("gen/"))
      .flatMap(({ path, text }) => names.filter((name) => text.includes(name)).map((name) => `${path} names ${name}`));
    expect(found).toEqual([]);
  });
});
