// Histogram encoding: SHE (exact discrete Laplace, integer reports) and THE (thresholds as a UE protocol)
// (estimators/histogram.py; kernels.she_randomize, reference._SheBits).
import { SingleShot, noiseDraws } from './protocol.js';
import { UnaryEncoding } from './unary.js';
import { LDPError, InfeasibleParameters, quantize32 } from './util.js';

// ====================================================================== THE
export function theProbabilities(eps, theta) {
  return [1.0 - 0.5 * Math.exp((-eps * (1.0 - theta)) / 2.0), 0.5 * Math.exp((-eps * theta) / 2.0)];
}

/** scipy.optimize.minimize_scalar(method="bounded") (fminbound), as scipy computes it. */
export function fminbound(func, x1, x2, xatol = 1e-5, maxiter = 500) {
  const sqrtEps = Math.sqrt(2.2e-16);
  const goldenMean = 0.5 * (3.0 - Math.sqrt(5.0));
  let a = x1;
  let b = x2;
  let fulc = a + goldenMean * (b - a);
  let nfc = fulc;
  let xf = fulc;
  let rat = 0.0;
  let e = 0.0;
  let x = xf;
  let fx = func(x);
  let num = 1;
  let fu = Infinity;
  let ffulc = fx;
  let fnfc = fx;
  let xm = 0.5 * (a + b);
  let tol1 = sqrtEps * Math.abs(xf) + xatol / 3.0;
  let tol2 = 2.0 * tol1;
  const sign = (v) => (v > 0 ? 1 : v < 0 ? -1 : 0);
  while (Math.abs(xf - xm) > tol2 - 0.5 * (b - a)) {
    let golden = 1;
    if (Math.abs(e) > tol1) {
      golden = 0;
      let r = (xf - nfc) * (fx - ffulc);
      let q = (xf - fulc) * (fx - fnfc);
      let p = (xf - fulc) * q - (xf - nfc) * r;
      q = 2.0 * (q - r);
      if (q > 0.0) p = -p;
      q = Math.abs(q);
      r = e;
      e = rat;
      if (Math.abs(p) < Math.abs(0.5 * q * r) && p > q * (a - xf) && p < q * (b - xf)) {
        rat = (p + 0.0) / q;
        x = xf + rat;
        if (x - a < tol2 || b - x < tol2) {
          const si = sign(xm - xf) + (xm - xf === 0 ? 1 : 0);
          rat = tol1 * si;
        }
      } else {
        golden = 1;
      }
    }
    if (golden) {
      e = xf >= xm ? a - xf : b - xf;
      rat = goldenMean * e;
    }
    const si = sign(rat) + (rat === 0 ? 1 : 0);
    x = xf + si * Math.max(Math.abs(rat), tol1);
    fu = func(x);
    num += 1;
    if (fu <= fx) {
      if (x >= xf) a = xf;
      else b = xf;
      fulc = nfc; ffulc = fnfc;
      nfc = xf; fnfc = fx;
      xf = x; fx = fu;
    } else {
      if (x < xf) a = x;
      else b = x;
      if (fu <= fnfc || nfc === xf) {
        fulc = nfc; ffulc = fnfc;
        nfc = x; fnfc = fu;
      } else if (fu <= ffulc || fulc === xf || fulc === nfc) {
        fulc = x; ffulc = fu;
      }
    }
    xm = 0.5 * (a + b);
    tol1 = sqrtEps * Math.abs(xf) + xatol / 3.0;
    tol2 = 2.0 * tol1;
    if (num >= maxiter) break;
  }
  return xf;
}

/** theta in (0.5, 1) minimizing Var*, rounded to 1e-6 (histogram.the_optimal_theta). */
export function theOptimalTheta(eps) {
  const vr = (theta) => {
    const [ps, qs] = theProbabilities(eps, theta);
    return (qs * (1.0 - qs)) / (ps - qs) ** 2;
  };
  return Number(fminbound(vr, 0.5, 1.0, 1e-10).toFixed(6));
}

export class THE extends UnaryEncoding {
  constructor({ k, eps, theta = null }) {
    super();
    this.initSingleShot(k, eps);
    if (theta === null || theta === undefined) theta = theOptimalTheta(this.eps);
    theta = Number(theta);
    if (!(theta > 0.0 && theta < 1.0)) throw new LDPError(`theta must lie in (0, 1), got ${theta}`);
    this.theta = theta;
    const [p, q] = theProbabilities(this.eps, theta);
    this.p = quantize32(p);
    this.q = quantize32(q);
    if (!(this.q > 0.0 && this.q < this.p && this.p < 1.0)) {
      throw new InfeasibleParameters(`THE: eps = ${this.eps}, theta = ${theta} give bit probabilities that vanish on the 2^-32 sampling grid; use a smaller eps`);
    }
  }

  get name() { return 'THE'; }

  params() { return { protocol: this.name, k: this.k, eps: this.eps, theta: this.theta }; }
}

// ====================================================================== SHE
export const SHE_T_BITS = 48;
export const SHE_DIGIT_BITS = 4;
const SHE_TAIL = 40n;
export const SHE_MIN_EPS = 1e-4;
export const SHE_MAX_EPS = 64.0;

/** Noise-slot width (words) of an SHE row of k coordinates (kernels.she_slot_words). */
export function sheSlotWords(k, s, tBits) {
  const alpha = Math.exp(-s / 2.0 ** tBits);
  const per = (2.0 * (tBits + 11)) / ((1.0 - Math.exp(-1.0)) * (1.0 + alpha));
  const count = Math.ceil((per * (k + Math.sqrt(k))) / 64.0);
  return Math.max(1, Math.ceil(count / 8)) * 8;
}

/** A row's draws as a bit string: its slot words, then its NOISE_EXT stream, each word from bit 0 up. */
class SheBits {
  constructor(draws) {
    this.draws = draws;
    this.j = 0;
    this.buf = 0n;
    this.have = 0;
  }

  take(m) {
    while (this.have < m) {
      this.buf |= this.draws.word(this.j) << BigInt(this.have);
      this.j += 1;
      this.have += 64;
    }
    const bm = BigInt(m);
    const v = this.buf & ((1n << bm) - 1n);
    this.buf >>= bm;
    this.have -= m;
    return v;
  }
}

function bitLength(n) {
  return n <= 0n ? 0 : n.toString(2).length;
}

function bernFrac(g, tBits, bits) {
  if (g <= 0n || g >= 1n << BigInt(tBits)) return g > 0n;
  for (let i = tBits - SHE_DIGIT_BITS; i >= 0; i -= SHE_DIGIT_BITS) {
    const b = bits.take(SHE_DIGIT_BITS);
    const u = (g >> BigInt(i)) & 15n;
    if (b !== u) return b < u;
  }
  return false;
}

function bernInv(kk, bits) {
  const nb = bitLength(kk - 1n);
  for (;;) {
    const v = bits.take(nb);
    if (v < kk) return v === 0n;
  }
}

function bernExp(g, tBits, bits) {
  let kk = 1n;
  while ((kk === 1n || bernInv(kk, bits)) && bernFrac(g, tBits, bits)) kk += 1n;
  return kk % 2n === 1n;
}

function discreteLaplace(s, tBits, vcap, bits) {
  const t = 1n << BigInt(tBits);
  for (;;) {
    const u = bits.take(tBits);
    if (!bernExp(u, tBits, bits)) continue;
    let v = 0n;
    while (v < vcap && bernExp(t, tBits, bits)) v += 1n;
    const y = (u + t * v) / s;
    const neg = bits.take(1) === 1n;
    if (neg && y === 0n) continue;
    return neg ? -y : y;
  }
}

export class SHE extends SingleShot {
  constructor({ k, eps }) {
    super();
    this.initSingleShot(k, eps);
    if (!(this.eps >= SHE_MIN_EPS && this.eps <= SHE_MAX_EPS)) {
      throw new InfeasibleParameters(`SHE supports ${SHE_MIN_EPS} <= eps <= ${SHE_MAX_EPS}, got ${this.eps}`);
    }
    this.s = Math.floor(this.eps * 2 ** (SHE_T_BITS - 1)); // floor(ldexp(eps, 47)): exact
    const t = 1n << BigInt(SHE_T_BITS);
    const sb = BigInt(this.s);
    this.bound = Number(1n + (SHE_TAIL * t + sb - 1n) / sb);
    this.slot = sheSlotWords(this.k, this.s, SHE_T_BITS);
  }

  get name() { return 'SHE'; }

  get epsFirst() { return (2 * this.s) / 2 ** SHE_T_BITS; }

  get reportItemsize() { return this.bound <= 127 ? 1 : this.bound <= 32767 ? 2 : 4; }
  get reportDtype() { return { 1: 'int8', 2: 'int16', 4: 'int32' }[this.reportItemsize]; }
  get reportShape() { return [this.k]; }

  randomize(v, { keys, state = null }) {
    this.checkValue(v);
    this.stateFor(state);
    const bits = new SheBits(noiseDraws(keys, this.slot));
    const sb = BigInt(this.s);
    const t = 1n << BigInt(SHE_T_BITS);
    const bound = BigInt(this.bound);
    const vcap = (sb * (bound + 1n) + t - 1n) >> BigInt(SHE_T_BITS);
    const size = this.reportItemsize;
    const out = new Uint8Array(this.k * size);
    const view = new DataView(out.buffer);
    for (let j = 0; j < this.k; j++) {
      let z = discreteLaplace(sb, SHE_T_BITS, vcap, bits) + (j === v ? 1n : 0n);
      if (z > bound) z = bound;
      if (z < -bound) z = -bound;
      const zn = Number(z);
      if (size === 1) view.setInt8(j, zn);
      else if (size === 2) view.setInt16(2 * j, zn, true);
      else view.setInt32(4 * j, zn, true);
    }
    return out;
  }
}
