import { negotiate } from "@fastify/accept-negotiator";
import zlib from "node:zlib";

/** What a legacy answer may be compressed with, most preferred first (as @fastify/compress offered them). */
const encodings = ["br", "gzip", "deflate"] as const;
type Encoding = (typeof encodings)[number];

// Brotli at quality 4: near gzip's speed, smaller output (the level @fastify/compress uses).
const brotliOptions = { params: { [zlib.constants.BROTLI_PARAM_MODE]: zlib.constants.BROTLI_MODE_TEXT, [zlib.constants.BROTLI_PARAM_QUALITY]: 4 } };

/** The last few Accept-Encoding values and their choice: clients send few distinct ones. */
const chosen = new Map<string, Encoding | undefined>();

/**
 * The encoding an `Accept-Encoding` header asks for, by its q-values (`*` and
 * `x-gzip` count as gzip), or undefined for none (absent, identity, nothing
 * we offer).
 */
export function negotiateEncoding(header: string | undefined): Encoding | undefined {
  if (header === undefined || header === "") return undefined;
  let choice = chosen.get(header);
  if (choice === undefined && !chosen.has(header)) {
    choice = (negotiate(header.toLowerCase().replace(/\*|x-gzip/g, "gzip"), [...encodings]) as Encoding | null) ?? undefined;
    if (chosen.size >= 256) chosen.clear();
    chosen.set(header, choice);
  }
  return choice;
}

/** The body compressed with `encoding` (a string as its UTF-8 bytes). */
export function compress(encoding: Encoding, body: string | Buffer): Buffer {
  switch (encoding) {
    case "br":
      return zlib.brotliCompressSync(body, brotliOptions);
    case "gzip":
      return zlib.gzipSync(body);
    case "deflate":
      return zlib.deflateSync(body);
  }
}
