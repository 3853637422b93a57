// Local hashing: BLH, OLH and the memoized LOLOHA (estimators/hashing.py; kernels.lh_encode). A report is
// (32-bit hash seed, y), packed: the seed as little-endian u32, then y in the smallest unsigned type of [0, g).
import { DOMAINS, Stream } from './chacha.js';
import { SingleShot, TwoRoundProtocol, grrEps, noiseDraws } from './protocol.js';
import { GRRChain, grrChain, grrProbabilities } from './direct.js';
import { LDPError, InfeasibleParameters, checkDomain, checkEps, uintBytes, writeUint } from './util.js';

export const MAX_HASH_RANGE = 4294967296;
const M64 = (1n << 64n) - 1n;
const LH_A = 0x1an;
const LH_B = 0x1bn;

/** SplitMix64 finalizer: a public bijective mix of a public hash seed. */
export function mix64(z) {
  z = ((z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n) & M64;
  z = ((z ^ (z >> 27n)) * 0x94d049bb133111ebn) & M64;
  return z ^ (z >> 31n);
}

/** Multiply-add-shift coefficients (a, b) of the hash function with 32-bit seed `seed`. */
export function lhCoeffs(seed) {
  const h = mix64((BigInt(seed) * 0x9e3779b97f4a7c15n) & M64);
  return [mix64(h ^ LH_A), mix64(h ^ LH_B)];
}

/** H_seed(v) = ((((a v + b) mod 2^64) >> 32) g) >> 32, in [0, g). */
export function lhHash(seed, v, g) {
  const [a, b] = lhCoeffs(seed);
  return Number((((((a * BigInt(v)) + b) & M64) >> 32n) * BigInt(g)) >> 32n);
}

const roundHalfUp = (x) => Math.floor(x + 0.5);

function checkG(g) {
  if (typeof g !== 'number' || !Number.isInteger(g) || g < 2 || g >= MAX_HASH_RANGE) {
    throw new LDPError(`g must be an integer in [2, 2^32), got ${g}`);
  }
  return g;
}

/** OLH's g = round(e^eps + 1). */
export function olhG(eps) {
  const g = roundHalfUp(Math.exp(eps) + 1.0);
  if (g >= MAX_HASH_RANGE) throw new InfeasibleParameters(`OLH: eps = ${eps} needs g = ${g} >= 2^32 hash values`);
  return Math.max(2, g);
}

/** OLOLOHA's g (Arcolezi et al., EDBT 2023, Eq. 6). */
export function ololohaG(epsInf, eps1) {
  if (!(eps1 > 0 && eps1 < epsInf)) throw new InfeasibleParameters(`LOLOHA: eps1 = ${eps1} must lie in (0, eps_inf = ${epsInf})`);
  const a = Math.exp(epsInf);
  const b = Math.exp(eps1);
  const disc = a ** 4 - 14 * a ** 2 + 12 * a * b * (1 - a * b) + 12 * a ** 3 * b + 1;
  const r = (1 - a ** 2 + Math.sqrt(Math.max(disc, 0.0))) / (6 * (a - b));
  if (!Number.isFinite(r)) throw new InfeasibleParameters(`LOLOHA: Eq. 6 overflows for eps_inf = ${epsInf}; pass g explicitly`);
  const g = 1 + Math.max(1, roundHalfUp(r));
  if (g >= MAX_HASH_RANGE) throw new InfeasibleParameters(`LOLOHA: Eq. 6 gives g = ${g} >= 2^32; pass g explicitly`);
  return g;
}

const HashedReports = (Base) => class extends Base {
  get reportItemsize() { return 4 + uintBytes(this.g); }
  get reportDtype() { return `(seed <u4, y ${['', 'u1', 'u2', '', 'u4'][uintBytes(this.g)]})`; }

  pack(seed, y) {
    const out = new Uint8Array(this.reportItemsize);
    writeUint(out, 0, 4, seed);
    writeUint(out, 4, uintBytes(this.g), y);
    return out;
  }
};

export class LocalHashing extends HashedReports(SingleShot) {
  initLH(k, eps, g) {
    this.initSingleShot(k, eps);
    if (this.k > MAX_HASH_RANGE) throw new LDPError(`k must be at most 2^32 for local hashing, got ${k}`);
    this.g = checkG(g);
    [this.p, this.q] = grrProbabilities(this.eps, this.g);
  }

  get qs() { return 1.0 / this.g; }
  get epsFirst() { return grrEps(this.p, this.q); }

  randomize(v, { keys, state = null }) {
    this.checkValue(v);
    this.stateFor(state);
    const nkey = keys();
    const seed = new Stream(nkey, DOMAINS.LH_SEED, 1, 8).lo(0); // word row = 0 of (nkey, LH_SEED, 1)
    const x = lhHash(seed, v, this.g);
    const noise = noiseDraws(() => nkey, 2);
    return this.pack(seed, grrChain(x, this.g, this.p, 1.0, null, noise));
  }
}

export class BLH extends LocalHashing {
  constructor({ k, eps }) { super(); this.initLH(k, eps, 2); }
  get name() { return 'BLH'; }
}

export class OLH extends LocalHashing {
  constructor({ k, eps }) { super(); this.initLH(k, eps, olhG(checkEps('eps', eps))); }
  get name() { return 'OLH'; }
}

export class LOLOHA extends HashedReports(GRRChain) {
  constructor({ k, eps_inf, eps_1, g = null, calibration = 'exact' }) {
    super();
    k = checkDomain(k);
    if (k > MAX_HASH_RANGE) throw new LDPError(`k must be at most 2^32 for local hashing, got ${k}`);
    const ei = checkEps('eps_inf', eps_inf);
    const e1 = checkEps('eps_1', eps_1);
    if (e1 >= ei) throw new InfeasibleParameters(`LOLOHA: eps1 = ${e1} must be smaller than eps_inf = ${ei}`);
    this.g = g === null || g === undefined ? ololohaG(ei, e1) : checkG(g);
    this.initRounds(k, ei, e1, calibration);
  }

  get name() { return 'LOLOHA'; }
  get chainSize() { return this.g; }
  supportQ1() { return 1.0 / this.g; }
  params() { return { ...TwoRoundProtocol.prototype.params.call(this), g: this.g }; }
  get memoSize() { return this.g; }
  get worstCaseLoss() { return Infinity; }

  randomize(v, { keys, state }) {
    this.checkValue(v);
    const st = this.stateFor(state);
    const seed = new Stream(st.key, DOMAINS.LH_SEED, 0, 8).lo(0); // the device's fixed hash function
    const x = lhHash(seed, v, this.g);
    return this.pack(seed, this.chain(x, st, keys));
  }
}
