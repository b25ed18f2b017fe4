/** One length-prefixed gRPC (and gRPC-Web) message: a flags byte (1: compressed), the length, the bytes. */
export function grpcFrame(message: Uint8Array, flags = 0): Buffer {
  const f = Buffer.alloc(5 + message.length);
  f[0] = flags;
  f.writeUInt32BE(message.length, 1);
  f.set(message, 5);
  return f;
}
