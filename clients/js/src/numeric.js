// Numeric mechanisms (estimators/numeric): a value of [lo, hi] in, one integer report out, byte for byte the
// Python reference's for the same keys. A value is clipped to [lo, hi] and mapped to the unit domain
// x = 2 (v - lo) / (hi - lo) - 1 (base.to_unit); each mechanism draws from ChaCha20 streams exactly as its
// kernel does (laplace_kernels, duchi, piecewise_kernels, sw_kernels, onebit_kernels): every threshold is an
// exact integer (BigInt where 64-bit words are compared), every float step the one Python takes in float64.
//
// A single report is row 0 of a batch of one: its words are the row's slot of the noise stream
// (nkey, NOISE, 0) under a fresh 256-bit key, then (rarely: a redraw) the extension stream (nkey, NOISE_EXT, 0).
// 1BitMean with a memo state draws alpha from (key, ONEBIT_ALPHA, 0) and the bit of rounded point j' from
// (key, PRR, j'): a keyed PRF, so a device whose value keeps rounding to one point sends the same bit forever.
import { DOMAINS, Stream } from './chacha.js';
import { Protocol, noiseDraws } from './protocol.js';
import { LDPError, InfeasibleParameters, PyFloat, checkEps, fingerprintOf, roundHalfEven } from './util.js';
import { bigMax, bigMin, ceilDiv, divToNumber, expRatio, floorDiv, lnRatio, ratioOf } from './bigmath.js';

const TWO53 = 1n << 53n;
const TWO52 = 1n << 52n;
const TWO64 = 1n << 64n;
const TWO106 = 1n << 106n;
const MASK64 = TWO64 - 1n;
/** Wang et al.'s threshold below which HM is Duchi et al.'s mechanism alone (piecewise.EPS_STAR, Python's value). */
export const EPS_STAR = 0.6093524930273093;
const TAIL_LOG = 64 * Math.log(2.0); // Laplace: noise reaching the clip with probability > 2^-64 is refused
export const LAPLACE_CLAMP = 2 ** 31 - 1;
const LAPLACE_NOISE_S = 1n << 20n;

/** The 53-bit uniform integer word >> 11 of draw j (an exact Number). */
function top53(src, j) {
  return src.hi(j) * 2097152 + (src.lo(j) >>> 11);
}

/** e^min(eps, cap) as a rational (above the cap every figure that uses it has saturated). */
function expOf(eps, cap) {
  return expRatio(Math.min(eps, cap));
}

/** ceil(2^53 / (e^eps + 1)), at least 1 (duchi.duchi_threshold_low, onebit's T_lo). */
function thresholdLow(eps, cap = 700.0) {
  const [n, d] = expOf(eps, cap);
  return bigMax(1n, ceilDiv(TWO53 * d, n + d));
}

/** Python's math.expm1, saturated at v = 700 (piecewise._expm1). */
const expm1Sat = (v) => Math.expm1(Math.min(v, 700.0));

function checkBits(name, value, lo, hi) {
  if (typeof value !== 'number' || !Number.isInteger(value) || value < lo || value > hi) {
    throw new LDPError(`${name} must be an integer in [${lo}, ${hi}], got ${value}`);
  }
  return value;
}

function writeReport(dtype, v) {
  const size = { int8: 1, uint8: 1, uint16: 2, int32: 4, uint32: 4 }[dtype];
  const out = new Uint8Array(size);
  const dv = new DataView(out.buffer);
  if (dtype === 'int8') dv.setInt8(0, v);
  else if (dtype === 'uint8') dv.setUint8(0, v);
  else if (dtype === 'uint16') dv.setUint16(0, v, true);
  else if (dtype === 'int32') dv.setInt32(0, v, true);
  else dv.setUint32(0, v, true);
  return out;
}

/** The report bytes of one report back as its integer (little-endian, the mechanism's dtype). */
export function readReport(dtype, bytes) {
  const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  if (dtype === 'int8') return dv.getInt8(0);
  if (dtype === 'uint8') return dv.getUint8(0);
  if (dtype === 'uint16') return dv.getUint16(0, true);
  if (dtype === 'int32') return dv.getInt32(0, true);
  return dv.getUint32(0, true);
}

/** A value mapped to the unit domain [-1, 1] and whether it was clipped (base.to_unit, the same float steps). */
export function toUnit(v, lo, hi) {
  const c = Math.min(Math.max(v, lo), hi);
  const x = (2.0 * (c - lo)) / (hi - lo) - 1.0;
  return [Math.min(Math.max(x, -1.0), 1.0), v < lo || v > hi];
}

/**
 * The base of every numeric mechanism, with the protocol contract of a campaign attribute (NumericProtocol):
 * parameters {mechanism, eps, lo, hi, ...}, fingerprint, one integer report of `reportDtype`.
 */
export class NumericMechanism extends Protocol {
  initNumeric(eps, lo, hi) {
    this.eps = checkEps('eps', eps);
    lo = Number(lo);
    hi = Number(hi);
    if (!(Number.isFinite(lo) && Number.isFinite(hi) && lo < hi)) {
      throw new LDPError(`the range must be finite with lo < hi, got [${lo}, ${hi}]`);
    }
    this.lo = lo;
    this.hi = hi;
  }

  /** A numeric attribute: a value is a measurement of [lo, hi], not a domain index. */
  get numeric() { return true; }

  /** Mean mechanisms aggregate one sum ("mean"); Square Wave a histogram ("distribution"). */
  get aggregate() { return 'mean'; }

  /** Canonical parameters (mechanism.params()): what device and server agree on. */
  params() {
    return { mechanism: this.name, eps: this.eps, lo: this.lo, hi: this.hi, ...this.ownParams() };
  }

  ownParams() { return {}; }

  /** sha256 of json.dumps(params, sort_keys=True) with lo, hi (and gamma) written as Python floats. */
  get fingerprint() {
    if (this._fp === undefined) {
      const p = this.params();
      for (const key of ['lo', 'hi', 'gamma']) if (key in p) p[key] = new PyFloat(p[key]);
      this._fp = fingerprintOf(p);
    }
    return this._fp;
  }

  get k() { return this.supportSize; }

  get supportSize() { return 1; }

  get domainSize() { return this.supportSize; }

  get reportItemsize() { return { int8: 1, uint8: 1, uint16: 2, int32: 4, uint32: 4 }[this.reportDtype]; }

  /** A measurement: a finite number (NaN and infinities are refused, not clipped). */
  checkValue(v) {
    if (typeof v !== 'number') throw new LDPError(`numeric values must be numbers, got ${typeof v} ${String(v)}`);
    if (!Number.isFinite(v)) throw new LDPError('a numeric value is NaN or infinite: not a measurement');
    return v;
  }

  /** Whether `v` lies outside [lo, hi] (clipped to the nearest end before randomizing; a device counts them). */
  clipped(v) {
    return this.checkValue(v) < this.lo || v > this.hi;
  }

  /** [x in [-1, 1], clipped] of a value (base.to_unit). */
  prepare(v) {
    return toUnit(this.checkValue(v), this.lo, this.hi);
  }

  /** One report (its bytes, little-endian) of the value `v` (metric units): fresh noise from `keys`. */
  randomize(v, { keys, state = null }) {
    const [x] = this.prepare(v);
    this.stateFor(state);
    return writeReport(this.reportDtype, this.randomizeUnit(x, keys));
  }

  /**
   * The calibrated figures (the `derived` of the randomizer vectors): eps_first, eps_inf, memo_size and the
   * mechanism's own; integers a kernel compares as 64-bit quantities are decimal strings.
   */
  derived() {
    return { eps_first: this.epsFirst, eps_inf: this.epsInf, memo_size: this.memoSize, ...this.ownDerived() };
  }

  ownDerived() { return {}; }

  /** The report as its integer (the bytes of randomize read back). */
  decodeReport(bytes) {
    return readReport(this.reportDtype, bytes);
  }
}

// ---------------------------------------------------------------- Laplace (laplace.py, laplace_kernels.py)
/** A row's random bits, low bit first, words drawn as they run out (laplace_kernels._take). */
class Bits {
  constructor(draws) {
    this.draws = draws;
    this.buf = 0n;
    this.have = 0;
    this.j = 0;
  }

  take(k) {
    if (k <= this.have) {
      const kk = BigInt(k);
      const r = this.buf & ((1n << kk) - 1n);
      this.buf >>= kk;
      this.have -= k;
      return r;
    }
    const w = this.draws.word(this.j++);
    const need = BigInt(k - this.have);
    const r = this.buf | ((w & ((1n << need) - 1n)) << BigInt(this.have));
    this.buf = w >> need;
    this.have = 64 - Number(need);
    return r;
  }

  /** Bernoulli(num / den) exactly: random bits against the binary expansion of num / den. */
  bernRatio(num, den) {
    if (num >= den) return true;
    let r = num;
    while (r !== 0n) {
      r <<= 1n;
      let c = 0n;
      if (r >= den) {
        r -= den;
        c = 1n;
      }
      if (this.take(1) !== c) return c === 1n;
    }
    return false;
  }

  /** A uniform integer of [0, t): tbits bits, redrawn while >= t. */
  uniformBelow(t, tbits) {
    if (tbits === 0) return 0n;
    for (;;) {
      const u = this.take(tbits);
      if (u < t) return u;
    }
  }

  /** Bernoulli(exp(-num/den)), 0 <= num <= den (Canonne, Kamath & Steinke, NeurIPS 2020, Algorithm 1). */
  bernExp(num, den) {
    let k = 1n;
    while (this.bernRatio(num, den * k)) k += 1n;
    return (k & 1n) === 1n;
  }
}

export class Laplace extends NumericMechanism {
  constructor({ eps, lo = -1.0, hi = 1.0, grid_bits = 12 }) {
    super();
    this.initNumeric(eps, lo, hi);
    this.gridBits = checkBits('grid_bits', grid_bits, 0, 24);
    this.nGrid = 2 ** this.gridBits;
    this.step = 2 ** -this.gridBits;
    const [en, ed] = ratioOf(this.eps);
    this.noiseS = LAPLACE_NOISE_S;
    this.noiseT = ceilDiv(2n * BigInt(this.nGrid) * LAPLACE_NOISE_S * ed, en);
    if (this.noiseT >= 1n << 48n) throw new InfeasibleParameters(`Laplace: ε = ${this.eps} is too small for grid_bits = ${this.gridBits}`);
    this.lam = Number(LAPLACE_NOISE_S) / Number(this.noiseT);
    if ((LAPLACE_CLAMP - this.nGrid) * this.lam < TAIL_LOG) {
      throw new InfeasibleParameters(`Laplace: with ε = ${this.eps} the noise of grid_bits = ${this.gridBits} would overflow an int32 report; use a coarser grid (smaller grid_bits)`);
    }
    this.tbits = (this.noiseT - 1n).toString(2).length - (this.noiseT === 1n ? 1 : 0);
  }

  get name() { return 'Laplace'; }

  ownParams() { return { grid_bits: this.gridBits }; }

  get reportDtype() { return 'int32'; }

  /** 2N s / t: the exact ε of the implemented law, <= eps. */
  get epsFirst() { return (2 * this.nGrid * Number(this.noiseS)) / Number(this.noiseT); }

  ownDerived() { return { n_grid: this.nGrid, noise_s: String(this.noiseS), noise_t: String(this.noiseT) }; }

  randomizeUnit(x, keys) {
    const draws = noiseDraws(keys, 2);
    const bits = new Bits(draws);
    const t = this.noiseT;
    const s = this.noiseS;
    const a = x * this.nGrid;
    const lo = Math.floor(a);
    const k = lo + (bits.bernRatio(BigInt(Math.ceil((a - lo) * 9007199254740992)), TWO53) ? 1 : 0);
    for (;;) { // Canonne, Kamath & Steinke, NeurIPS 2020, Algorithm 2
      const u = bits.uniformBelow(t, this.tbits);
      if (!bits.bernExp(u, t)) continue;
      let v = 0n;
      while (bits.bernExp(1n, 1n)) v += 1n;
      const y = (u + t * v) / s;
      const neg = bits.take(1) === 1n;
      if (neg && y === 0n) continue;
      const yy = Number(bigMin(y, 1n << 40n)); // beyond 2^40 the clip decides alike
      const r = neg ? k - yy : k + yy;
      this.lastExtWords = draws.extWords;
      return Math.min(Math.max(r, -LAPLACE_CLAMP), LAPLACE_CLAMP);
    }
  }
}

// ---------------------------------------------------------------- Duchi et al. (duchi.py)
export class Duchi extends NumericMechanism {
  constructor({ eps, lo = -1.0, hi = 1.0 }) {
    super();
    this.initNumeric(eps, lo, hi);
    this.tLo = Number(thresholdLow(this.eps));
    this.s = Number(TWO52) - this.tLo; // S, an exact double
    this.B = Number(TWO52) / this.s;
  }

  get name() { return 'Duchi'; }

  get reportDtype() { return 'int8'; }

  /** log((2^53 - T_lo) / T_lo) (math.log of each, as Python). */
  get epsFirst() { return Math.log(Number(TWO53) - this.tLo) - Math.log(this.tLo); }

  ownDerived() { return { t_lo: String(this.tLo), s: String(this.s), B: this.B }; }

  randomizeUnit(x, keys) {
    const noise = noiseDraws(keys, 1);
    this.lastExtWords = 0;
    const thr = this.tLo + roundHalfEven((x + 1.0) * this.s);
    return top53(noise, 0) < thr ? 1 : -1;
  }
}

// ---------------------------------------------------------------- PM, HM (piecewise.py, piecewise_kernels.py)
export class PM extends NumericMechanism {
  constructor({ eps, lo = -1.0, hi = 1.0, grid_bits = 16 }) {
    super();
    this.initNumeric(eps, lo, hi);
    this.gridBits = checkBits('grid_bits', grid_bits, 4, 24);
    this.m = 2 ** this.gridBits;
    const ea = expm1Sat(this.eps / 2.0) + 1.0;
    this.kk = Math.min(Math.max(roundHalfEven(this.m / (ea + 1.0)), 1), Math.floor(this.m / 2));
    this.ll = this.m - this.kk;
    const K = BigInt(this.kk);
    const L = BigInt(this.ll);
    const [en, ed] = expOf(this.eps, 100.0);
    // B = floor(2^64 / (K e + L)), A = floor(B e), A <= (2^64 - L B) / K
    const b = bigMax(floorDiv(TWO64 * ed, K * en + L * ed), 1n);
    let a = floorDiv(b * en, ed);
    a = bigMin(a, (TWO64 - L * b) / K);
    if (a - b < 1n << 32n) {
      throw new InfeasibleParameters(`PM: ε = ${this.eps} is too small for grid_bits = ${this.gridBits} (the cell masses' integers differ by less than 2^32); use a coarser grid`);
    }
    this.a = a;
    this.b = b;
    this.dab = a - b;
    this.dF = Number(this.dab);
    this.z = K * a + L * b;
    this.zlim = this.z - 1n;
    this.ka1 = a * (K - 1n);
  }

  get name() { return 'PM'; }

  ownParams() { return { grid_bits: this.gridBits }; }

  get reportDtype() { return this.gridBits <= 16 ? 'uint16' : 'uint32'; }

  get supportSize() { return 2; }

  /** log(A / B) = log1p((A - B) / B): the exact ε of the implemented law, <= eps. */
  get epsFirst() { return Math.log1p(divToNumber(this.dab, this.b)); }

  ownDerived() {
    return { m: this.m, k: this.kk, l: this.ll, a: String(this.a), b: String(this.b), z: String(this.z) };
  }

  /** PM's cell of unit input x from the word w, redrawn from the row's draws (index j on) while w > Z - 1. */
  cell(x, w, draws, j) {
    const lF = this.ll;
    const t = (x + 1.0) * 0.5 * lF;
    let s0 = Math.floor(t);
    if (s0 > lF - 1.0) s0 = lF - 1.0;
    const f = t - s0;
    let q;
    if (f >= 1.0) q = this.dab;
    else {
      q = BigInt(roundHalfEven(f * this.dF));
      if (q > this.dab) q = this.dab;
    }
    while (w > this.zlim) w = draws.word(j++);
    const { a, b } = this;
    const s = BigInt(s0);
    const k = BigInt(this.kk);
    if (w < this.ka1) return Number(s + 1n + w / a);
    const v = w - this.ka1;
    if (v < a + b) return Number(v < a - q ? s : s + k);
    const u = (v - a - b) / b;
    return Number(u < s ? u : u + k + 1n);
  }

  randomizeUnit(x, keys) {
    const draws = noiseDraws(keys, 1);
    const c = this.cell(x, draws.word(0), draws, 1);
    this.lastExtWords = draws.extWords;
    return c;
  }
}

export class HM extends NumericMechanism {
  constructor({ eps, lo = -1.0, hi = 1.0, grid_bits = 16 }) {
    super();
    this.initNumeric(eps, lo, hi);
    this.pm = new PM({ eps: this.eps, lo, hi, grid_bits });
    this.gridBits = this.pm.gridBits;
    this.m = this.pm.m;
    this.alphaPaper = this.eps > EPS_STAR ? -Math.expm1(-this.eps / 2.0) : 0.0;
    // alpha 2^64 is an integer double (alpha > 1/4): Python's round() of it is exact
    this.tAlpha = bigMin(BigInt(this.alphaPaper * 2 ** 64), TWO64 - 1n);
    this.dTlo = Number(thresholdLow(this.eps, 100.0));
    this.dS = Number(TWO52) - this.dTlo;
    this.B = Number(TWO52) / this.dS;
  }

  get name() { return 'HM'; }

  ownParams() { return { grid_bits: this.gridBits }; }

  get reportDtype() { return 'uint32'; }

  get supportSize() { return 5; }

  /** log((2^53 - T_lo) / T_lo): the ε of the implemented Duchi branch. */
  get duchiEps() { return Math.log1p((Number(TWO53) - 2 * this.dTlo) / this.dTlo); }

  get epsFirst() { return Math.max(this.duchiEps, this.tAlpha > 0n ? this.pm.epsFirst : 0.0); }

  ownDerived() {
    return { ...this.pm.ownDerived(), t_alpha: String(this.tAlpha), d_tlo: String(this.dTlo), d_s: String(this.dS), B: this.B };
  }

  randomizeUnit(x, keys) {
    const draws = noiseDraws(keys, 2);
    this.lastExtWords = 0;
    if (draws.word(0) < this.tAlpha) {
      const c = this.pm.cell(x, draws.word(1), draws, 2);
      this.lastExtWords = draws.extWords;
      return c;
    }
    const thr = this.dTlo + roundHalfEven((x + 1.0) * this.dS);
    return top53(draws, 1) < thr ? this.m + 1 : this.m;
  }
}

// ---------------------------------------------------------------- Square Wave (square_wave.py, sw_kernels.py)
/** 2^64 - 1 - (2^64 mod m): the largest word a uniform draw of [0, m) by word % m accepts. */
export function rejectionLimit(m) {
  return MASK64 - (TWO64 % BigInt(m));
}

export class SW extends NumericMechanism {
  constructor({ eps, lo = -1.0, hi = 1.0, d_in = 1024, d_out = 1024 }) {
    super();
    this.initNumeric(eps, lo, hi);
    this.dIn = checkBits('d_in (input grid points)', d_in, 2, 65536);
    this.dOut = checkBits('d_out (output cells)', d_out, 2, 65536);
    const em1 = Math.expm1(this.eps);
    this.bPaper = (this.eps * (em1 + 1.0) - em1) / (2.0 * (em1 + 1.0) * (em1 - this.eps));
    this.kk = Math.min(Math.max(roundHalfEven((2.0 * this.bPaper * this.dOut) / (1.0 + 2.0 * this.bPaper)), 1), this.dOut - 1);
    this.ll = this.dOut - this.kk;
    const [en, ed] = expOf(this.eps, 700.0); // beyond ~56 T saturates at 2^64 - 1 alike
    const ke = BigInt(this.kk) * en;
    const t = floorDiv(TWO64 * ke, ke + BigInt(this.ll) * ed);
    this.tNear = bigMin(bigMax(t, 1n), TWO64 - 1n);
    this.limK = rejectionLimit(this.kk);
    this.limL = rejectionLimit(this.ll);
  }

  get name() { return 'SW'; }

  get aggregate() { return 'distribution'; }

  ownParams() { return { d_in: this.dIn, d_out: this.dOut }; }

  get reportDtype() { return 'uint16'; }

  get supportSize() { return this.dOut; }

  /** log(T L / ((2^64 - T) K)): the exact ε of the implemented law (60-digit ln in Python). */
  get epsFirst() {
    return lnRatio(this.tNear * BigInt(this.ll), (TWO64 - this.tNear) * BigInt(this.kk));
  }

  ownDerived() { return { k: this.kk, l: this.ll, t_near: String(this.tNear), b: this.bPaper }; }

  /** [s_lo, threshold over 2^53] of grid point i: its window starts at s_lo or s_lo + 1 (E = i L / (d_in - 1)). */
  start(i) {
    const den = BigInt(this.dIn - 1);
    const num = BigInt(i) * BigInt(this.ll);
    return [Number(num / den), Number((2n * (num % den) * TWO53 + den) / (2n * den))];
  }

  randomizeUnit(x, keys) {
    const draws = noiseDraws(keys, 4);
    const t = (x + 1.0) * 0.5 * (this.dIn - 1);
    let i0 = Math.floor(t);
    if (i0 > this.dIn - 2) i0 = this.dIn - 2;
    if (i0 < 0) i0 = 0;
    const g = draws.unit(0) < t - i0 ? i0 + 1 : i0;
    const [sLo, sThr] = this.start(g);
    const s = sLo + (top53(draws, 1) < sThr ? 1 : 0);
    const near = draws.word(2) < this.tNear;
    const m = near ? this.kk : this.ll;
    const lim = near ? this.limK : this.limL;
    let w = draws.word(3);
    for (let j = 4; w > lim; j++) w = draws.word(j);
    this.lastExtWords = draws.extWords;
    const u = Number(w % BigInt(m));
    if (near) return s + u;
    return u >= s ? u + this.kk : u;
  }
}

// ---------------------------------------------------------------- 1BitMean (onebit.py, onebit_kernels.py)
export const ONEBIT_MAX_S = 2 ** 20;

export class OneBitMean extends NumericMechanism {
  constructor({ eps, lo = -1.0, hi = 1.0, s = 16, gamma = 0.0 }) {
    super();
    this.initNumeric(eps, lo, hi);
    this.s = checkBits('s (rounding buckets)', s, 1, ONEBIT_MAX_S);
    const g = Number(gamma);
    if (typeof gamma === 'boolean' || !(g >= 0.0 && g < 0.5)) throw new LDPError(`gamma (output perturbation) must lie in [0, 0.5), got ${gamma}`);
    this.gamma = g;
    this.tLo = thresholdLow(this.eps);
    this.stepT = (TWO53 - 2n * this.tLo) / BigInt(this.s);
    if (this.stepT < 1n) throw new InfeasibleParameters(`1BitMean: ε = ${this.eps} is too small for s = ${this.s} buckets`);
    this.tHi = this.tLo + BigInt(this.s) * this.stepT;
    this.g = BigInt(roundHalfEven(g * 9007199254740992));
    this.n0 = this.g * TWO53 + (TWO53 - 2n * this.g) * this.tLo;
    this.n1 = (TWO53 - 2n * this.g) * this.stepT;
    this.tLoN = Number(this.tLo);
    this.stepN = Number(this.stepT);
    this.gN = Number(this.g);
  }

  get name() { return '1BitMean'; }

  get longitudinal() { return true; }

  ownParams() { return { s: this.s, gamma: this.gamma }; }

  get reportDtype() { return 'uint8'; }

  /** log max(P_s / P_0, (1 - P_0) / (1 - P_s)) of the implemented report law, <= eps. */
  get epsFirst() {
    const ns = this.n0 + BigInt(this.s) * this.n1;
    return Math.max(lnRatio(ns, this.n0), lnRatio(TWO106 - this.n0, TWO106 - ns));
  }

  /** ε of one memoized bit: log max(T_s / T_lo, (2^53 - T_lo) / (2^53 - T_s)). */
  get epsMemo() {
    return Math.max(lnRatio(this.tHi, this.tLo), lnRatio(TWO53 - this.tLo, TWO53 - this.tHi));
  }

  get epsInf() { return this.epsMemo; }

  ownDerived() { return { t_lo: String(this.tLo), step: String(this.stepT), g: String(this.g), eps_memo: this.epsMemo }; }

  /** Memoizable rounded points {0, ..., s}. */
  get memoSize() { return this.s + 1; }

  /** eps_memo × min(k, s + 1) after k distinct rounded points reported. */
  longitudinalLoss(m) {
    return Math.min(Math.max(m, 0), this.memoSize) * this.epsMemo;
  }

  /** alpha-point rounding of unit input x to a point of {0, ..., s}: j + 1 iff alpha < f. */
  round(x, alpha) {
    const t = (x + 1.0) * 0.5 * this.s;
    let j = Math.floor(t);
    if (j > this.s - 1) j = this.s - 1;
    if (j < 0) j = 0;
    return alpha < t - j ? j + 1 : j;
  }

  /** The device's alpha in [0, 1), fixed by its memo key. */
  alpha(state) {
    return new Stream(state.key, DOMAINS.ONEBIT_ALPHA, 0, 8).unit(0);
  }

  /**
   * One report (a bit). Without a memo state a fresh device (alpha, bit and flip from one noise key); with the
   * device's state its memoized bit of the rounded point (marked in the state), flipped with probability gamma by
   * fresh noise (a noise key is drawn only when gamma > 0).
   */
  randomize(v, { keys, state = null }) {
    const [x] = this.prepare(v);
    this.lastExtWords = 0;
    if (state === null || state === undefined) {
      const noise = noiseDraws(keys, this.gN > 0 ? 3 : 2);
      const j = this.round(x, noise.unit(0));
      let bit = top53(noise, 1) < this.tLoN + j * this.stepN;
      if (this.gN > 0 && top53(noise, 2) < this.gN) bit = !bit;
      return writeReport('uint8', bit ? 1 : 0);
    }
    const st = this.stateFor(state);
    const noise = this.gN > 0 ? noiseDraws(keys, 1) : null;
    const j = this.round(x, this.alpha(st));
    st.mark(j);
    let bit = top53(new Stream(st.key, DOMAINS.PRR, j, 8), 0) < this.tLoN + j * this.stepN;
    if (noise !== null && top53(noise, 0) < this.gN) bit = !bit;
    return writeReport('uint8', bit ? 1 : 0);
  }
}

// ---------------------------------------------------------------- registry (estimators.numeric.MECHANISMS)
const BASE = ['eps', 'lo', 'hi'];

/** name -> [class, accepted keywords] (registration order of estimators.numeric.MECHANISMS). */
export const MECHANISMS = {
  Laplace: [Laplace, [...BASE, 'grid_bits']],
  Duchi: [Duchi, BASE],
  PM: [PM, [...BASE, 'grid_bits']],
  HM: [HM, [...BASE, 'grid_bits']],
  SW: [SW, [...BASE, 'd_in', 'd_out']],
  '1BitMean': [OneBitMean, [...BASE, 's', 'gamma']],
};

/** Build a numeric mechanism: makeNumeric("PM", {eps: 1.0, lo: 0.0, hi: 600.0}). */
export function makeNumeric(name, params = {}) {
  if (!Object.hasOwn(MECHANISMS, name)) throw new LDPError(`unknown numeric mechanism '${name}'; known: ${Object.keys(MECHANISMS).join(', ')}`);
  const [Cls, accepted] = MECHANISMS[name];
  const unknown = Object.keys(params).filter((p) => !accepted.includes(p)).sort();
  if (unknown.length) throw new LDPError(`${name} does not take ${unknown.join(', ')}; it takes ${accepted.join(', ')}`);
  if (params.eps === undefined) throw new LDPError(`${name} needs eps`);
  return new Cls(params);
}
