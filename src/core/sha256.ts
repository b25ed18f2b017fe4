/**
 * SHA-256 (FIPS 180-4) of a string's UTF-8 bytes, in JavaScript. Every plain
 * call checks its secret with a salted SHA-256, and node:crypto's one-shot
 * `hash` spends most of a short input's cost in OpenSSL's per-call set-up
 * (fetching and initialising the digest), not in the two blocks of
 * compression: in the served legacy hit it was 6-9% of the CPU. The rounds
 * have no data-dependent branches, as in OpenSSL. test/sha256.test.ts holds
 * it to node:crypto over random and edge-case inputs.
 */

const K = new Int32Array([
  0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
  0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
  0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
  0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
  0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
]);
const W = new Int32Array(64);
const H = new Int32Array(8);
const encoder = new TextEncoder();
let block = new Uint8Array(1024);

/** The 32-byte SHA-256 digest of `text` encoded as UTF-8 (lone surrogates as U+FFFD, as Buffer and node:crypto encode them). */
export function sha256(text: string): Buffer {
  // UTF-8 takes at most 3 bytes a UTF-16 unit; then 0x80, the zero pad and the 8-byte length.
  const room = text.length * 3 + 73;
  if (block.length < room) block = new Uint8Array(room * 2);
  const n = encoder.encodeInto(text, block).written;
  const total = (((n + 8) >> 6) + 1) << 6;
  block[n] = 0x80;
  block.fill(0, n + 1, total);
  const bits = n * 8;
  // The length in bits, big-endian in the last 8 bytes (inputs here are far below 2^32 bits).
  block[total - 5] = Math.floor(bits / 2 ** 32) & 0xff;
  block[total - 4] = (bits >>> 24) & 0xff;
  block[total - 3] = (bits >>> 16) & 0xff;
  block[total - 2] = (bits >>> 8) & 0xff;
  block[total - 1] = bits & 0xff;
  H[0] = 0x6a09e667;
  H[1] = 0xbb67ae85;
  H[2] = 0x3c6ef372;
  H[3] = 0xa54ff53a;
  H[4] = 0x510e527f;
  H[5] = 0x9b05688c;
  H[6] = 0x1f83d9ab;
  H[7] = 0x5be0cd19;
  for (let at = 0; at < total; at += 64) compress(block, at);
  const out = Buffer.allocUnsafe(32);
  for (let i = 0; i < 8; i++) out.writeInt32BE(H[i]!, i * 4);
  return out;
}

function compress(b: Uint8Array, at: number): void {
  for (let i = 0; i < 16; i++) {
    const j = at + i * 4;
    W[i] = (b[j]! << 24) | (b[j + 1]! << 16) | (b[j + 2]! << 8) | b[j + 3]!;
  }
  for (let i = 16; i < 64; i++) {
    const x = W[i - 15]!;
    const y = W[i - 2]!;
    const s0 = ((x >>> 7) | (x << 25)) ^ ((x >>> 18) | (x << 14)) ^ (x >>> 3);
    const s1 = ((y >>> 17) | (y << 15)) ^ ((y >>> 19) | (y << 13)) ^ (y >>> 10);
    W[i] = (W[i - 16]! + s0 + W[i - 7]! + s1) | 0;
  }
  let a = H[0]!;
  let bb = H[1]!;
  let c = H[2]!;
  let d = H[3]!;
  let e = H[4]!;
  let f = H[5]!;
  let g = H[6]!;
  let h = H[7]!;
  for (let i = 0; i < 64; i++) {
    const S1 = ((e >>> 6) | (e << 26)) ^ ((e >>> 11) | (e << 21)) ^ ((e >>> 25) | (e << 7));
    const ch = (e & f) ^ (~e & g);
    const t1 = (h + S1 + ch + K[i]! + W[i]!) | 0;
    const S0 = ((a >>> 2) | (a << 30)) ^ ((a >>> 13) | (a << 19)) ^ ((a >>> 22) | (a << 10));
    const maj = (a & bb) ^ (a & c) ^ (bb & c);
    const t2 = (S0 + maj) | 0;
    h = g;
    g = f;
    f = e;
    e = (d + t1) | 0;
    d = c;
    c = bb;
    bb = a;
    a = (t1 + t2) | 0;
  }
  H[0] = (H[0]! + a) | 0;
  H[1] = (H[1]! + bb) | 0;
  H[2] = (H[2]! + c) | 0;
  H[3] = (H[3]! + d) | 0;
  H[4] = (H[4]! + e) | 0;
  H[5] = (H[5]! + f) | 0;
  H[6] = (H[6]! + g) | 0;
  H[7] = (H[7]! + h) | 0;
}
