// Apple's Count Mean Sketch (CMS) and Hadamard Count Mean Sketch (HCMS) on the device (estimators/sketch/cms.py;
// the draws of estimators/sketch/cms_kernels.py, byte for byte).
//
// The device picks a row j uniformly and hashes its value id with row j's public function (sketchHash with
// rowSeeds(seed, k)[j]). Draws: the report's noise slot, words 0 .. W-1 of (noise key, NOISE, 0), then its
// extension stream (NoiseDraws).
//   row:  slot word 0 z; while z > rejectionLimit(k) the next draw is taken (the shared counter below); j = z mod k.
//   CMS  (W = 1 + B + 2, B = ceil(m / 8)): byte lane t of slot word 1 + b is flip bit 8b + t (its byte below the
//        top byte of the 32-bit threshold T = ceil(2^32 / (e^{eps/2} + 1)); a tie settled, in lane order, by the
//        low 24 bits of the next draw); bit h_j(id) inverted, bits >= m cleared. Report: row (uint16 LE), the m
//        bits packed little-endian.
//   HCMS (W = 3): l = word 1 & (m - 1); the flip is (word 2 >> 11) < T (T = ceil(2^53 / (e^eps + 1))); the bit is
//        [(-1)^popcount(h_j(id) & l) = +1] xor the flip. Report: ((j m + l) << 1) | bit as a uint64 LE.
// Draws past the slot's fixed words (row rejections, then CMS tie refinements) share one counter starting at the
// slot's refinement words (CMS: word 1 + B; HCMS: word 3, the extension stream).
import { NoiseDraws } from './chacha.js';
import { OpenDomainProtocol, M64, flipEps, flipThreshold, rejectionLimit, rowSeeds, sketchHash } from './sketch.js';
import { LDPError, checkEps, splitThreshold } from './util.js';

export const CMS_REFINE_SLOTS = 2;
export const HCMS_SLOT = 3;
export const ROW_BYTES = 2;
const MAX_ROWS = 65536;

function integer(name, x) {
  if (typeof x === 'bigint') return x;
  if (typeof x !== 'number' || !Number.isInteger(x)) throw new LDPError(`${name} must be an integer, got ${String(x)}`);
  return x;
}

class CountMeanSketch extends OpenDomainProtocol {
  initSketch({ eps, m, k, seed }, flipBits, flipShare) {
    this.eps = checkEps('eps', eps);
    m = integer('m', m);
    k = integer('k (rows)', k);
    if (seed === undefined) throw new LDPError(`${this.name} needs seed`);
    const s = typeof seed === 'bigint' ? seed : integer('seed', seed);
    if (typeof m !== 'number' || m < 2 || m >= 2 ** 31) throw new LDPError(`m must be an integer in [2, 2^31), got ${m}`);
    if (typeof k !== 'number' || k < 1 || k > MAX_ROWS) throw new LDPError(`k (rows) must be an integer in [1, ${MAX_ROWS}], got ${k}`);
    if (typeof s === 'number' && !Number.isSafeInteger(s)) {
      throw new LDPError(`seed ${s} is not exact as a Number: pass it as a BigInt`);
    }
    const big = BigInt(s);
    if (big < 0n || big > M64) throw new LDPError(`seed must be an integer in [0, 2^64), got ${big}`);
    this.m = m;
    this.k = k; // the rows (Apple's notation), as the reference's
    this.seed = big;
    this.seeds = rowSeeds(big, k);
    this.limit = rejectionLimit(k);
    this.flipBits = flipBits;
    this.T = flipThreshold(flipShare * this.eps, flipBits);
    this.q = this.T / 2 ** flipBits;
  }

  params() {
    return { protocol: this.name, eps: this.eps, m: this.m, k: this.k, seed: this.seed };
  }

  row(d, jn) {
    let z = d.word(0);
    while (z > this.limit) {
      z = d.word(jn);
      jn += 1;
    }
    return [Number(z % BigInt(this.k)), jn];
  }
}

/** Apple's Count Mean Sketch: report uint8 [2 + ceil(m/8)], the row (uint16 LE) then the m bits. */
export class CMS extends CountMeanSketch {
  constructor(params) {
    super();
    this.initSketch(params, 32, 0.5);
    this.nbytes = (this.m + 7) >> 3;
    [this.tHi, this.tRest] = splitThreshold(this.T);
  }

  get name() { return 'CMS'; }

  /** 2 log((2^32 - T) / T) <= eps: two entries of one row differ between any two ids. */
  get epsFirst() { return flipEps(this.T, 32, 2); }

  get supportSize() { return this.k * (this.m + 1); }

  get reportItemsize() { return 1; }

  get reportDtype() { return 'uint8'; }

  get reportShape() { return [ROW_BYTES + this.nbytes]; }

  randomizeId(id, keys) {
    const nb = this.nbytes;
    const d = new NoiseDraws(keys(), 1 + nb + CMS_REFINE_SLOTS);
    let [j, jn] = this.row(d, 1 + nb);
    const out = new Uint8Array(ROW_BYTES + nb);
    d.main.ensure(1 + nb);
    const z = d.main.bytes;
    const { tHi, tRest } = this;
    for (let b = 0, o = 8; b < nb; b++, o += 8) {
      let byte = 0;
      for (let t = 0; t < 8; t++) {
        const zt = z[o + t];
        if (zt < tHi) byte |= 1 << t;
        else if (zt === tHi) {
          if (d.low24(jn) < tRest) byte |= 1 << t;
          jn += 1;
        }
      }
      out[ROW_BYTES + b] = byte;
    }
    const h = sketchHash(id, this.seeds[j], this.m);
    out[ROW_BYTES + (h >> 3)] ^= 1 << (h & 7);
    if (this.m & 7) out[ROW_BYTES + nb - 1] &= (1 << (this.m & 7)) - 1;
    out[0] = j & 0xff;
    out[1] = j >> 8;
    return out;
  }
}

function parity(x) {
  let p = 0;
  for (; x; x &= x - 1) p ^= 1;
  return p;
}

/** Apple's Hadamard Count Mean Sketch: report uint64, ((j m + l) << 1) | bit. */
export class HCMS extends CountMeanSketch {
  constructor(params) {
    super();
    const m = params?.m;
    if (typeof m !== 'number' || !Number.isInteger(m) || m < 2 || (m & (m - 1)) !== 0) {
      throw new LDPError(`HCMS needs m a power of 2, got ${String(m)}`);
    }
    this.initSketch(params, 53, 1.0);
  }

  get name() { return 'HCMS'; }

  /** log((2^53 - T) / T) <= eps: one bit, flipped with probability T / 2^53. */
  get epsFirst() { return flipEps(this.T, 53); }

  get supportSize() { return 2 * this.k * this.m; }

  get reportItemsize() { return 8; }

  get reportDtype() { return 'uint64'; }

  randomizeId(id, keys) {
    const d = new NoiseDraws(keys(), HCMS_SLOT);
    const [j] = this.row(d, HCMS_SLOT);
    const l = d.lo(1) & (this.m - 1);
    const h = sketchHash(id, this.seeds[j], this.m);
    let bit = 1 - parity(h & l);
    if ((d.word(2) >> 11n) < BigInt(this.T)) bit = 1 - bit;
    let v = (BigInt(j * this.m + l) << 1n) | BigInt(bit);
    const out = new Uint8Array(8);
    for (let i = 0; i < 8; i++, v >>= 8n) out[i] = Number(v & 0xffn);
    return out;
  }
}
