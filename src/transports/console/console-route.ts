import { createHash } from "node:crypto";
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import type { FastifyInstance, FastifyReply } from "fastify";
import { operations } from "../../operations/index.ts";
import { legacyFormats } from "../../render/legacy-formats.ts";

/** One file of the console as served: bytes, type and entity tag. */
interface Asset {
  readonly body: Buffer;
  readonly type: string;
  readonly etag: string;
}

const sources = join(import.meta.dirname, "../../console");

/**
 * Everything the console page loads comes from here ('self'); nothing from
 * another origin, so the page makes no outside request (fonts, CDNs), and an
 * injected script could not send anything elsewhere either.
 */
const contentSecurityPolicy = [
  "default-src 'self'",
  "script-src 'self'",
  "style-src 'self'",
  "img-src 'self' data:",
  "font-src 'self'",
  "connect-src 'self'",
  "base-uri 'none'",
  "form-action 'none'",
  "frame-ancestors 'none'",
].join("; ");

function asset(body: string | Uint8Array, type: string): Asset {
  const bytes = Buffer.from(body);
  return { body: bytes, type, etag: `"${createHash("sha256").update(bytes).digest("base64url").slice(0, 27)}"` };
}

/** What the page needs to know of this gateway: the operation table in the browser's terms, and the legacy result types. */
function gatewayJson(): string {
  return JSON.stringify({
    resultTypes: Object.keys(legacyFormats),
    operations: operations.map((op) => ({
      id: op.id,
      catalogue: op.catalogue,
      apiName: op.apiName,
      path: op.path,
      rpcPath: `/${op.service.typeName}/${op.method.name}`,
      service: op.service.typeName,
      method: op.method.name,
      args: op.args.map((a) => ({ name: a.name, required: a.required, accepts: a.accepts, maxLength: a.maxLength })),
    })),
  });
}

/**
 * The console, bundled once per process with esbuild, in memory: the page
 * (TypeScript in src/console/, talking to the gateway only through
 * Connect-Web and the generated code), its stylesheet, and `sign.js`, the
 * browser-safe signing helper as a plain module a page without a bundler can
 * import. Nothing built is written to disk or committed, and esbuild's
 * service process is stopped once the build is done.
 */
let built: Promise<Map<string, Asset>> | undefined;
export function consoleAssets(): Promise<Map<string, Asset>> {
  built ??= (async () => {
    const { build, stop } = await import("esbuild");
    let result;
    try {
      result = await build({
        entryPoints: { app: join(sources, "main.ts"), sign: join(sources, "sign.ts") },
        bundle: true,
        format: "esm",
        target: "es2022",
        minify: true,
        legalComments: "none",
        write: false,
        outdir: "/console",
        logLevel: "silent",
      });
    } finally {
      // esbuild builds in a child process of its own, which would otherwise live (and hold about
      // 25 MB) as long as the gateway does, for a build made once; a later build starts it again.
      await stop();
    }
    const files = new Map<string, Asset>();
    for (const f of result.outputFiles) {
      const name = f.path.slice(f.path.lastIndexOf("/") + 1);
      files.set(name, asset(f.contents, name.endsWith(".css") ? "text/css; charset=utf-8" : "text/javascript; charset=utf-8"));
    }
    files.set("index.html", asset(await readFile(join(sources, "index.html")), "text/html; charset=utf-8"));
    files.set("gateway.json", asset(gatewayJson(), "application/json"));
    return files;
  })();
  built.catch(() => (built = undefined)); // a failed build is tried again by the next app
  return built;
}

function send(reply: FastifyReply, ifNoneMatch: string | undefined, a: Asset): FastifyReply {
  reply
    .header("content-type", a.type)
    .header("etag", a.etag)
    .header("cache-control", "no-cache")
    .header("content-security-policy", contentSecurityPolicy)
    .header("x-content-type-options", "nosniff")
    .header("referrer-policy", "no-referrer");
  if (ifNoneMatch === a.etag) return reply.code(304).send();
  return reply.send(a.body);
}

/** GET /console/ and its files; /console redirects to /console/. Built before the app listens, so a broken build stops the start. */
export async function installConsole(app: FastifyInstance): Promise<void> {
  const files = await consoleAssets();
  // The app ignores trailing slashes, so /console lands here too: it is sent to /console/, where the page's relative URLs resolve.
  app.get("/console/", { logLevel: "warn" }, (req, reply) =>
    req.url.split("?")[0]!.endsWith("/") ? send(reply, req.headers["if-none-match"], files.get("index.html")!) : reply.redirect("/console/", 308),
  );
  app.get<{ Params: { file: string } }>("/console/:file", { logLevel: "warn" }, (req, reply) => {
    const a = files.get(req.params.file);
    if (a === undefined || req.params.file === "index.html") return reply.code(404).type("text/plain; charset=utf-8").send("no such console file\n");
    return send(reply, req.headers["if-none-match"], a);
  });
}
