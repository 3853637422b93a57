// ChaCha20 streams: the one primitive behind every random draw of a device (estimators/randomness.py).
//
// The stream (key, domain, a) is the RFC 8439 keystream under the 256-bit `key` with the 96-bit nonce
// (domain, a mod 2^32, floor(a / 2^32)) and the block counter from 0; its word j is the little-endian u64
// in keystream bytes 8j .. 8j+7. Memoized responses use the device's memo key (PRR, LH_SEED, BITFLIP_*,
// ONEBIT_ALPHA), fresh noise a per-report key (NOISE: row 0 of a batch of one; NOISE_EXT: draws beyond the row's slot).
import { chacha20 } from '@noble/ciphers/chacha.js';

// The platform CSPRNG: WebCrypto's getRandomValues (browsers, React Native with a getRandomValues polyfill,
// Node >= 19 as a global); on Node 18 (Debian bookworm's nodejs) WebCrypto is node:crypto's `webcrypto`.
const WEBCRYPTO = (globalThis.crypto && typeof globalThis.crypto.getRandomValues === 'function')
  ? globalThis.crypto
  : (typeof process === 'object' && process.versions && process.versions.node)
    ? (await import('node:crypto')).webcrypto
    : null;

function csprng() {
  if (!WEBCRYPTO || typeof WEBCRYPTO.getRandomValues !== 'function') {
    throw new Error('no CSPRNG: crypto.getRandomValues is missing on this platform');
  }
  return WEBCRYPTO;
}

/** Stream domains (nonce word 0): ASCII tags, as in estimators/randomness.py. */
export const DOMAINS = Object.freeze({
  PRR: 0x31525250, // "PRR1": memoized responses, a = memoized input
  NOISE: 0x5349494e, // "NIIS": fresh noise, a = row (0 on a device)
  LH_SEED: 0x44534c48, // "HLSD": local-hashing seeds
  BITFLIP_J: 0x4a504642, // "BFPJ": dBitFlipPM's sampled buckets
  BITFLIP_BIT: 0x42504642, // "BFPB": dBitFlipPM's memoized bits, a = case
  NOISE_EXT: 0x5458454e, // "NEXT": draws of row a beyond its fixed noise slot
  ONEBIT_ALPHA: 0x48504c41, // "ALPH": a 1BitMean device's rounding point alpha, a = 0
});

export const KEY_BYTES = 32;
const BLOCK_BYTES = 64;
const TWO32 = 4294967296;
const TWO_M53 = 1.1102230246251565e-16; // 2^-53

/** ``n`` bytes from the platform CSPRNG (WebCrypto `crypto.getRandomValues`). */
export function randomBytes(n) {
  return csprng().getRandomValues(new Uint8Array(n));
}

/** 32 bytes from the platform CSPRNG. */
export function randomKey() {
  return randomBytes(KEY_BYTES);
}

export function hexToBytes(hex) {
  if (typeof hex !== 'string' || hex.length % 2 || /[^0-9a-fA-F]/.test(hex)) {
    throw new Error(`not a hex string: ${hex}`);
  }
  const out = new Uint8Array(hex.length / 2);
  for (let i = 0; i < out.length; i++) out[i] = parseInt(hex.substr(2 * i, 2), 16);
  return out;
}

export function bytesToHex(bytes) {
  let s = '';
  for (let i = 0; i < bytes.length; i++) s += (bytes[i] < 16 ? '0' : '') + bytes[i].toString(16);
  return s;
}

function nonceOf(domain, a) {
  const n = new Uint8Array(12);
  const v = new DataView(n.buffer);
  v.setUint32(0, domain >>> 0, true);
  if (typeof a === 'bigint') { // a 64-bit input (an open-domain memoized prefix id)
    if (a < 0n || a >= 1n << 64n) throw new Error(`stream input must lie in [0, 2^64), got ${a}`);
    v.setUint32(4, Number(a & 0xffffffffn), true);
    v.setUint32(8, Number(a >> 32n), true);
    return n;
  }
  if (!Number.isSafeInteger(a) || a < 0) throw new Error(`stream input must be a non-negative safe integer, got ${a}`);
  v.setUint32(4, a % TWO32, true);
  v.setUint32(8, Math.floor(a / TWO32), true);
  return n;
}

/**
 * One ChaCha20 stream, computed on demand a few blocks at a time. Word j is read as its two 32-bit halves
 * (`lo(j)`, `hi(j)`), its bytes (`byte(j, t)`), `unit(j)` or `low24(j)`; `word(j)` gives the BigInt.
 */
export class Stream {
  constructor(key, domain, a = 0, prefetchWords = 8) {
    if (!(key instanceof Uint8Array) || key.length !== KEY_BYTES) throw new Error('a stream key has 32 bytes');
    this.key = key;
    this.nonce = nonceOf(domain, a);
    this.bytes = new Uint8Array(0);
    this.u32 = new Uint32Array(0);
    this._fill(Math.max(1, Math.ceil(prefetchWords / 8)));
  }

  _fill(blocks) {
    const have = this.bytes.length / BLOCK_BYTES;
    if (blocks <= have) return;
    if (blocks > TWO32) throw new Error('a stream holds at most 2^32 blocks');
    const more = Math.max(blocks - have, have); // grow geometrically
    const all = new Uint8Array((have + more) * BLOCK_BYTES);
    all.set(this.bytes, 0);
    // the keystream is the encryption of zeros: written in place over the new (zero) part of the buffer
    const fresh = all.subarray(have * BLOCK_BYTES);
    chacha20(this.key, this.nonce, fresh, fresh, have);
    this.bytes = all;
    this.u32 = new Uint32Array(all.buffer); // platforms running this are little-endian (checked below)
  }

  /** Make sure words 0 .. n-1 are computed. */
  ensure(n) {
    if (n * 8 > this.bytes.length) this._fill(Math.ceil(n / 8));
  }

  lo(j) {
    this.ensure(j + 1);
    return this.u32[2 * j];
  }

  hi(j) {
    this.ensure(j + 1);
    return this.u32[2 * j + 1];
  }

  /** Byte t (0..7, little-endian: lane t) of word j. */
  byte(j, t) {
    this.ensure(j + 1);
    return this.bytes[8 * j + t];
  }

  /** The low 24 bits of word j. */
  low24(j) {
    return this.lo(j) & 0xffffff;
  }

  /** Uniform double in [0, 1) with 53 random bits: (w >> 11) 2^-53. */
  unit(j) {
    this.ensure(j + 1);
    return (this.u32[2 * j + 1] * 2097152 + (this.u32[2 * j] >>> 11)) * TWO_M53;
  }

  word(j) {
    return (BigInt(this.hi(j)) << 32n) | BigInt(this.lo(j));
  }
}

/**
 * A row's draws: words 0 .. slot-1 of its noise slot (the batch stream (nkey, NOISE, 0) of a batch of one),
 * then word j - slot of its extension stream (nkey, NOISE_EXT, 0) (estimators.randomness.stream_word with
 * skip = slot).
 */
export class NoiseDraws {
  constructor(nkey, slot) {
    this.nkey = nkey;
    this.slot = slot;
    this.main = new Stream(nkey, DOMAINS.NOISE, 0, Math.max(slot, 1));
    this.ext = null;
    this.extWords = 0; // words of the extension stream read so far (diagnosis)
  }

  _at(j) {
    if (j < this.slot) return [this.main, j];
    if (this.ext === null) this.ext = new Stream(this.nkey, DOMAINS.NOISE_EXT, 0, 8);
    if (j - this.slot >= this.extWords) this.extWords = j - this.slot + 1;
    return [this.ext, j - this.slot];
  }

  lo(j) { const [s, i] = this._at(j); return s.lo(i); }
  hi(j) { const [s, i] = this._at(j); return s.hi(i); }
  byte(j, t) { const [s, i] = this._at(j); return s.byte(i, t); }
  low24(j) { const [s, i] = this._at(j); return s.low24(i); }
  unit(j) { const [s, i] = this._at(j); return s.unit(i); }
  word(j) { const [s, i] = this._at(j); return s.word(i); }
}

if (new Uint8Array(new Uint32Array([0x11223344]).buffer)[0] !== 0x44) {
  throw new Error('ldp-stream-device assumes a little-endian platform');
}

// Keys are cut from a pool of CSPRNG output (one getRandomValues call per 128 keys: the call costs more than
// the bytes); a key's bytes are wiped from the pool as it is handed out.
const POOL_KEYS = 128;
let pool = null;
let poolAt = POOL_KEYS;

/** A key source: a function returning a fresh 32-byte key from the CSPRNG per call (draw order is the randomizer's). */
export function cryptoKeys() {
  if (poolAt === POOL_KEYS) {
    if (pool === null) pool = new Uint8Array(POOL_KEYS * KEY_BYTES);
    csprng().getRandomValues(pool);
    poolAt = 0;
  }
  const off = poolAt * KEY_BYTES;
  const key = pool.slice(off, off + KEY_BYTES);
  pool.fill(0, off, off + KEY_BYTES);
  poolAt += 1;
  return key;
}

/** A key source replaying recorded keys (hex strings) in order: test vectors only (not private). */
export function keyTape(hexKeys) {
  const left = [...hexKeys];
  const tape = () => {
    if (!left.length) throw new Error('the randomizer drew more keys than the tape holds');
    tape.drawn += 1;
    return hexToBytes(left.shift());
  };
  tape.drawn = 0;
  Object.defineProperty(tape, 'left', { get: () => left.length });
  return tape;
}
