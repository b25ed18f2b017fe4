import net from "node:net";

/**
 * A client that writes HTTP/2 frames itself, for what Node's client will
 * not do: ignore the server's settings (SETTINGS_MAX_CONCURRENT_STREAMS),
 * open streams and leave them. It acknowledges the server's SETTINGS,
 * answers nothing else, and records the frames the server sends.
 */
export interface RawHttp2 {
  /** Opens stream `id` (odd, rising) with HEADERS; `end` ends its request too. */
  headers(id: number, headers: Readonly<Record<string, string>>, end?: boolean): void;
  /**
   * Opens stream `id` with HEADERS whose header block never ends: then
   * `continuations` empty CONTINUATION frames, none with END_HEADERS (a
   * CONTINUATION flood, CVE-2024-27316's kind: the block never grows, so no
   * header size limit stops it, and no stream exists for a request timeout
   * to cut).
   */
  unendedHeaders(id: number, headers: Readonly<Record<string, string>>, continuations: number): void;
  /** Sends `bytes` on stream `id` (DATA); `end` ends its request. */
  data(id: number, bytes: Buffer, end?: boolean): void;
  /** Resets stream `id` (RST_STREAM with `code`). */
  reset(id: number, code: number): void;
  /** Sends a PING (8 bytes of opaque data). */
  ping(): void;
  /** Stops or resumes reading what the server sends (a client that never reads holds the server's replies). */
  reading(on: boolean): void;
  /** Every frame received so far. */
  readonly frames: readonly RawFrame[];
  /** Resolves when the server has sent its first SETTINGS. */
  readonly ready: Promise<void>;
  /** Resolves when the connection has closed. */
  readonly closed: Promise<void>;
  destroy(): void;
}

export interface RawFrame {
  readonly type: number;
  readonly flags: number;
  readonly stream: number;
  readonly payload: Buffer;
}

export const frameType = { data: 0, headers: 1, rstStream: 3, settings: 4, ping: 6, goaway: 7, windowUpdate: 8, continuation: 9 } as const;
/** RFC 9113, section 7. */
export const errorCode = { noError: 0, protocolError: 1, refusedStream: 7, cancel: 8, enhanceYourCalm: 11 } as const;

function frame(type: number, flags: number, stream: number, payload: Buffer = Buffer.alloc(0)): Buffer {
  const head = Buffer.alloc(9);
  head.writeUIntBE(payload.length, 0, 3);
  head[3] = type;
  head[4] = flags;
  head.writeUInt32BE(stream, 5);
  return Buffer.concat([head, payload]);
}

/** HPACK: each field a literal without indexing, new name, no Huffman (RFC 7541, 6.2.2); names and values under 127 bytes. */
function hpack(headers: Readonly<Record<string, string>>): Buffer {
  const parts: Buffer[] = [];
  for (const [name, value] of Object.entries(headers)) {
    const n = Buffer.from(name);
    const v = Buffer.from(value);
    if (n.length > 126 || v.length > 126) throw new Error("raw-http2: a header longer than 126 bytes");
    parts.push(Buffer.from([0, n.length]), n, Buffer.from([v.length]), v);
  }
  return Buffer.concat(parts);
}

export function rawHttp2(port: number): RawHttp2 {
  const socket = net.connect(port, "127.0.0.1");
  socket.on("error", () => {});
  const frames: RawFrame[] = [];
  let ready!: () => void;
  const readyP = new Promise<void>((r) => (ready = r));
  const closed = new Promise<void>((r) => socket.once("close", () => r()));
  socket.write(Buffer.concat([Buffer.from("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), frame(frameType.settings, 0, 0)]));
  let pending = Buffer.alloc(0);
  socket.on("data", (chunk: Buffer) => {
    pending = Buffer.concat([pending, chunk]);
    while (pending.length >= 9) {
      const length = pending.readUIntBE(0, 3);
      if (pending.length < 9 + length) break;
      const f: RawFrame = { type: pending[3]!, flags: pending[4]!, stream: pending.readUInt32BE(5) & 0x7fffffff, payload: pending.subarray(9, 9 + length) };
      pending = pending.subarray(9 + length);
      frames.push(f);
      if (f.type === frameType.settings && (f.flags & 1) === 0) {
        socket.write(frame(frameType.settings, 1, 0));
        ready();
      }
    }
  });
  return {
    headers(id, headers, end = false) {
      // END_HEADERS (0x4), and END_STREAM (0x1) when asked.
      socket.write(frame(frameType.headers, 0x4 | (end ? 0x1 : 0), id, hpack(headers)));
    },
    unendedHeaders(id, headers, continuations) {
      socket.write(frame(frameType.headers, 0, id, hpack(headers)));
      for (let i = 0; i < continuations; i++) socket.write(frame(frameType.continuation, 0, id));
    },
    data(id, bytes, end = false) {
      socket.write(frame(frameType.data, end ? 0x1 : 0, id, bytes));
    },
    reset(id, code) {
      const payload = Buffer.alloc(4);
      payload.writeUInt32BE(code);
      socket.write(frame(frameType.rstStream, 0, id, payload));
    },
    ping() {
      socket.write(frame(frameType.ping, 0, 0, Buffer.alloc(8)));
    },
    reading(on) {
      if (on) socket.resume();
      else socket.pause();
    },
    frames,
    ready: readyP,
    closed,
    destroy: () => socket.destroy(),
  };
}

/** The SETTINGS parameters of a SETTINGS frame's payload, by identifier (RFC 9113, 6.5.2). */
export function settingsOf(payload: Buffer): Map<number, number> {
  const settings = new Map<number, number>();
  for (let i = 0; i + 6 <= payload.length; i += 6) settings.set(payload.readUInt16BE(i), payload.readUInt32BE(i + 2));
  return settings;
}
