// Hadamard response: HR and FHR (estimators/hadamard.py; kernels.hr_randomize / fhr_randomize).
import { SingleShot, noiseDraws } from './protocol.js';
import { LDPError, uintBytes, uintName, writeUint } from './util.js';

export const MAX_K = 1 << 24;
export const HR_SLOT = 2; // noise words per HR row: 0 the row j, 1 keep?
export const FHR_SLOT = 3; // noise words per FHR row: 0 the +1 column x, 1 the -1 column y, 2 keep?

/** popcount(x) mod 2 for 0 <= x < 2^31. */
function parity(x) {
  x ^= x >>> 16;
  x ^= x >>> 8;
  x ^= x >>> 4;
  x ^= x >>> 2;
  x ^= x >>> 1;
  return x & 1;
}

/** K = the smallest power of two > k. */
export function hadamardOrder(k) {
  return 2 ** (32 - Math.clz32(k)); // 1 << k.bit_length()
}

class Hadamard extends SingleShot {
  initHadamard(k, eps) {
    this.initSingleShot(k, eps);
    if (this.k > MAX_K) throw new LDPError(`${this.name} supports k <= ${MAX_K}, got ${this.k}`);
    this.K = hadamardOrder(this.k);
    this.p = 1.0 / (1.0 + Math.exp(-this.eps));
  }
}

export class HR extends Hadamard {
  constructor({ k, eps }) { super(); this.initHadamard(k, eps); }
  get name() { return 'HR'; }
  get ps() { return this.p; }
  get qs() { return 0.5; }
  get epsFirst() { return Math.log(this.p) - Math.log1p(-this.p); }
  get reportItemsize() { return uintBytes(2 * this.K); }
  get reportDtype() { return uintName(this.reportItemsize); }

  randomize(v, { keys, state = null }) {
    this.checkValue(v);
    this.stateFor(state);
    const noise = noiseDraws(keys, HR_SLOT);
    const j = Math.trunc(noise.unit(0) * this.K);
    let bit = 1 - parity(j & (v + 1));
    if (noise.unit(1) >= this.p) bit = 1 - bit;
    const out = new Uint8Array(this.reportItemsize);
    writeUint(out, 0, this.reportItemsize, j * 2 + bit);
    return out;
  }
}

export class FHR extends Hadamard {
  constructor({ k, eps }) { super(); this.initHadamard(k, eps); }
  get name() { return 'FHR'; }
  get epsFirst() { return Infinity; } // (eps, 1/2)-FLDP, not eps-LDP: see estimators/hadamard.py
  get reportItemsize() { return uintBytes(this.K); }
  get reportDtype() { return uintName(this.reportItemsize); }
  get reportShape() { return [2]; }

  randomize(v, { keys, state = null }) {
    this.checkValue(v);
    this.stateFor(state);
    const noise = noiseDraws(keys, FHR_SLOT);
    const w = v + 1;
    const low = w & -w;
    let x = Math.trunc(noise.unit(0) * this.K);
    if (parity(w & x) === 1) x ^= low;
    let y = Math.trunc(noise.unit(1) * this.K);
    if (parity(w & y) === 0) y ^= low;
    const keep = noise.unit(2) < this.p;
    const size = this.reportItemsize;
    const out = new Uint8Array(2 * size);
    writeUint(out, 0, size, keep ? x : y);
    writeUint(out, size, size, keep ? y : x);
    return out;
  }
}
