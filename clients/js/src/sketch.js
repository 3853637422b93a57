// Open-domain values (type = "string" / "u64" attributes): their 64-bit ids, the public hash family of the sketches,
// and the device side of an open-domain protocol (estimators/sketch/hashing.py, base.py).
//
// A string's id is the little-endian first 8 bytes of the SHA-256 of its UTF-8 bytes; an integer in [0, 2^64) (a
// BigInt, or a non-negative safe integer Number) is its own id. Ids are BigInts. The family (exact 64-bit BigInt
// arithmetic):
//   h_seed(v) = top(mix64(v ^ spread(seed)), m),  spread(s) = mix64(s * 0x9E3779B97F4A7C15 + 0x5348),
//   top(z, m) = ((z >> 32) * m) >> 32,            rowSeeds(s, rows)[j] = mix64(s + j + 1)
// An open-domain protocol module (cms.js, treehist.js) extends OpenDomainProtocol and adds one
// line to OPEN_PROTOCOLS (registry.js).
import { sha256 } from '@noble/hashes/sha2.js';
import { Protocol } from './protocol.js';
import { expRatio, ceilDiv, lnRatio } from './bigmath.js';
import { LDPError } from './util.js';

export const M64 = (1n << 64n) - 1n;
const TWO64 = 1n << 64n;
export const SEED_SPREAD_MUL = 0x9e3779b97f4a7c15n;
export const SEED_SPREAD_ADD = 0x5348n; // "SH"

/** An integer in [0, 2^64) as a BigInt (a BigInt, or a non-negative safe integer Number); null if it is not one. */
export function asU64(value) {
  if (typeof value === 'bigint') return value >= 0n && value <= M64 ? value : null;
  if (typeof value === 'number' && Number.isSafeInteger(value) && value >= 0) return BigInt(value);
  return null;
}

/** Whether a string holds a UTF-16 surrogate that is not half of a pair (TextEncoder would write U+FFFD for it). */
function hasLoneSurrogate(s) {
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c >= 0xd800 && c <= 0xdbff) {
      const d = i + 1 < s.length ? s.charCodeAt(i + 1) : 0;
      if (d >= 0xdc00 && d <= 0xdfff) i++;
      else return true;
    } else if (c >= 0xdc00 && c <= 0xdfff) {
      return true;
    }
  }
  return false;
}

/**
 * The 64-bit id (BigInt) of an open-domain value: a string (the little-endian first 8 bytes of the SHA-256 of its
 * UTF-8 bytes), a Uint8Array (of its bytes), or an integer in [0, 2^64) (itself; Numbers above 2^53 are refused:
 * pass a BigInt).
 */
export function valueId(value) {
  let bytes;
  if (typeof value === 'string') {
    if (hasLoneSurrogate(value)) {
      throw new LDPError('a string with a lone surrogate has no UTF-8 encoding (Python refuses it too)');
    }
    bytes = new TextEncoder().encode(value);
  } else if (value instanceof Uint8Array) {
    bytes = value;
  } else {
    const v = asU64(value);
    if (v === null) {
      throw new LDPError(`an open-domain value is a string or an integer in [0, 2^64) (a BigInt above 2^53), got ${String(value)}`);
    }
    return v;
  }
  const d = sha256(bytes);
  let id = 0n;
  for (let i = 7; i >= 0; i--) id = (id << 8n) | BigInt(d[i]);
  return id;
}

/** The SplitMix64 finalizer of z mod 2^64 (BigInt). */
export function mix64(z) {
  z &= M64;
  z = ((z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n) & M64;
  z = ((z ^ (z >> 27n)) * 0x94d049bb133111ebn) & M64;
  return z ^ (z >> 31n);
}

/** mix64(seed * 0x9E3779B97F4A7C15 + 0x5348): a row seed spread over 64 bits. */
export function spread(seed) {
  return mix64(BigInt(seed) * SEED_SPREAD_MUL + SEED_SPREAD_ADD);
}

/** The public seeds (BigInts) of `rows` hash functions of a protocol with public seed `seed`: mix64(seed + j + 1). */
export function rowSeeds(seed, rows) {
  const s = BigInt(seed);
  const out = [];
  for (let j = 0; j < rows; j++) out.push(mix64(s + BigInt(j + 1)));
  return out;
}

/** h_rowSeed(id) in [0, m) (a Number): the reference's sketch_hash of one id and one row. */
export function sketchHash(id, rowSeed, m) {
  const z = mix64(BigInt(id) ^ spread(rowSeed));
  return Number(((z >> 32n) * BigInt(m)) >> 32n);
}

/** 2^64 - 1 - (2^64 mod m): the largest word a uniform draw of [0, m) by word % m accepts (BigInt). */
export function rejectionLimit(m) {
  return M64 - (TWO64 % BigInt(m));
}

/** T = ceil(2^bits / (e^eps + 1)), at least 1 (a Number; exact rational arithmetic, as the reference's Decimal). */
export function flipThreshold(eps, bits) {
  const [num, den] = expRatio(eps);
  const t = ceilDiv((1n << BigInt(bits)) * den, num + den);
  return Number(t < 1n ? 1n : t);
}

/** times * ln((2^bits - T) / T), correctly rounded (the reference's 60-digit Decimal ln). */
export function flipEps(T, bits, times = 1) {
  return times * lnRatio((1n << BigInt(bits)) - BigInt(T), BigInt(T));
}

/**
 * The device side of an open-domain protocol: randomizes ONE 64-bit value id per report (fresh noise, no memo
 * state). A campaign attribute's k is the protocol's supportSize, not a domain size.
 */
export class OpenDomainProtocol extends Protocol {
  get openDomain() { return true; }

  get domainSize() {
    throw new LDPError(`${this.name} randomizes open-domain values (64-bit ids): it has no domain size`);
  }

  /** A value id as a BigInt in [0, 2^64) (a BigInt, or a safe integer Number). */
  checkValue(v) {
    const id = asU64(v);
    if (id === null) throw new LDPError(`${this.name} randomizes value ids, integers in [0, 2^64) (a string's id: valueId), got ${String(v)}`);
    return id;
  }

  /** The report of one device holding `value` (a string, or an integer id in [0, 2^64)). */
  randomizeValue(value, { keys }) {
    return this.randomize(valueId(value), { keys });
  }

  randomize(v, { keys, state = null }) {
    const id = this.checkValue(v);
    this.stateFor(state);
    return this.randomizeId(id, keys);
  }
}
