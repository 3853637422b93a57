// The protocol contract on the device side (estimators/base.py, memo.py, longitudinal.py): parameters and
// fingerprint, privacy figures, memo state, and the two-round framework's calibration from (eps_inf, eps_1).
import { NoiseDraws, Stream, DOMAINS, bytesToHex } from './chacha.js';
import { LDPError, InfeasibleParameters, checkEps, fingerprintOf } from './util.js';

/** A device's memo state for one protocol: its secret 256-bit key and the set of memoized cells. */
export class MemoState {
  constructor(fingerprint, key, memoSize, seen = null) {
    if (!(key instanceof Uint8Array) || key.length !== 32) throw new LDPError('a memo key has 32 bytes');
    this.fingerprint = fingerprint;
    this.key = key;
    this.memoSize = memoSize;
    this.seen = seen ?? new Uint8Array((memoSize + 7) >> 3);
  }

  has(x) {
    return ((this.seen[x >> 3] >> (x & 7)) & 1) === 1;
  }

  mark(x) {
    this.seen[x >> 3] |= 1 << (x & 7);
  }

  /** Number of distinct memoized inputs. */
  count() {
    let c = 0;
    for (let x = 0; x < this.memoSize; x++) c += (this.seen[x >> 3] >> (x & 7)) & 1;
    return c;
  }

  /** The memoized cells, increasing. */
  cells() {
    const out = [];
    for (let x = 0; x < this.memoSize; x++) if (this.has(x)) out.push(x);
    return out;
  }

  copy() {
    return new MemoState(this.fingerprint, this.key.slice(), this.memoSize, this.seen.slice());
  }

  /** The state as a JSON-able object (the key in hex: a secret). */
  toJSON() {
    return { fingerprint: this.fingerprint, memo_size: this.memoSize, key: bytesToHex(this.key), cells: this.cells() };
  }

  static fromJSON(obj) {
    if (!obj || typeof obj !== 'object' || typeof obj.key !== 'string' || obj.key.length !== 64) {
      throw new LDPError('malformed memo state');
    }
    const key = new Uint8Array(32);
    for (let i = 0; i < 32; i++) key[i] = parseInt(obj.key.substr(2 * i, 2), 16);
    const st = new MemoState(String(obj.fingerprint), key, Number(obj.memo_size));
    for (const x of obj.cells ?? []) {
      if (!Number.isInteger(x) || x < 0 || x >= st.memoSize) throw new LDPError(`memo cell ${x} outside [0, ${st.memoSize})`);
      st.mark(x);
    }
    return st;
  }
}

/** The base of every protocol: identity, privacy figures and the device side. */
export class Protocol {
  get longitudinal() { return false; }

  get fingerprint() {
    if (this._fp === undefined) this._fp = fingerprintOf(this.params());
    return this._fp;
  }

  get epsInf() { return this.epsFirst; }

  get memoSize() { return 0; }

  get domainSize() { return this.k; }

  /** epsilon on a device's values after it memoized m distinct inputs (single-shot: 0, eps1, then inf). */
  longitudinalLoss(m) {
    return m <= 0 ? 0.0 : m === 1 ? this.epsFirst : Infinity;
  }

  get worstCaseLoss() {
    return this.longitudinalLoss(Math.max(this.memoSize, 2));
  }

  /** Distinct memoized inputs of `state` (the argument of longitudinalLoss): its marked cells; TreeHist counts its
   * tag table (Infinity once it overflowed). */
  memoizedCount(state) {
    return state.count();
  }

  /** Bytes of one report (the element size times the elements of the report shape). */
  get reportNbytes() {
    return this.reportItemsize * this.reportShape.reduce((a, b) => a * b, 1);
  }

  get reportShape() { return []; }

  /** A fresh memo state (one key from `keys`), or null for memoryless protocols. */
  newState(keys) {
    if (this.memoSize === 0) return null;
    return new MemoState(this.fingerprint, keys(), this.memoSize);
  }

  checkValue(v) {
    if (typeof v !== 'number' || !Number.isInteger(v) || v < 0 || v >= this.k) {
      throw new LDPError(`value ${v} is outside the domain [0, ${this.k})`);
    }
    return v;
  }

  stateFor(state) {
    if (this.memoSize === 0) {
      if (state) throw new LDPError(`${this.name} is memoryless; do not pass a memo state`);
      return null;
    }
    if (!state) throw new LDPError(`${this.name} memoizes: pass a memo state (protocol.newState(keys))`);
    if (state.fingerprint !== this.fingerprint) {
      throw new LDPError(`memo state belongs to another protocol configuration (state ${state.fingerprint}, protocol ${this.fingerprint})`);
    }
    return state;
  }

  /** Var* (true frequency 0) of a pure protocol: qs (1 - qs) / (n (ps - qs)^2). */
  variance(n) {
    const gamma = this.qs + 0.0 * (this.ps - this.qs);
    return (gamma * (1.0 - gamma)) / (n * (this.ps - this.qs) ** 2);
  }

  toString() {
    return `${this.name}(${JSON.stringify(this.params())})`;
  }
}

/** A memoryless protocol over [0, k) with one parameter eps. */
export class SingleShot extends Protocol {
  initSingleShot(k, eps) {
    if (typeof k !== 'number' || !Number.isInteger(k) || k < 2) throw new LDPError(`k must be an integer >= 2, got ${k}`);
    this.k = k;
    this.eps = checkEps('eps', eps);
  }

  params() {
    return { protocol: this.name, k: this.k, eps: this.eps };
  }

  get ps() { return this.p; }

  get qs() { return this.q; }
}

// ---------------------------------------------------------------- the two-round framework
export class Rounds {
  constructor(p1, q1, p2, q2, q1s = null) {
    Object.assign(this, { p1, q1, p2, q2, q1s });
  }

  get ps() { return this.p1 * this.p2 + (1.0 - this.p1) * this.q2; }

  get qs() {
    const q1 = this.q1s === null ? this.q1 : this.q1s;
    return q1 * this.p2 + (1.0 - q1) * this.q2;
  }
}

export function grrEps(p, q) {
  return Math.log(p / q);
}

export function ueEps(p, q) {
  return Math.log((p * (1.0 - q)) / ((1.0 - p) * q));
}

export function grrChainEpsFirst(r) {
  const ps = r.p1 * r.p2 + (1 - r.p1) * r.q2;
  const qs = r.q1 * r.p2 + (1 - r.q1) * r.q2;
  return grrEps(ps, qs);
}

export function ueChainEpsFirst(r) {
  return ueEps(r.ps, r.qs);
}

const fmtG = (x) => Number(x).toPrecision(6).replace(/\.?0+(e|$)/, '$1');

/** Root of eps_of(theta) = eps1 for theta in (lo, hi), by bisection to adjacent floats (longitudinal._solve). */
export function solve(name, epsOf, lo, hi, eps1, epsInf) {
  if (eps1 >= epsInf) throw new InfeasibleParameters(`${name}: eps1 = ${fmtG(eps1)} must be smaller than eps_inf = ${fmtG(epsInf)}`);
  const top = epsOf(hi);
  if (!(eps1 < top)) {
    throw new InfeasibleParameters(`${name} cannot reach eps1 = ${fmtG(eps1)} with eps_inf = ${fmtG(epsInf)}: its IRR round caps a single report at eps1 < ${fmtG(top)}`);
  }
  let fLo = epsOf(lo) - eps1;
  for (;;) {
    const mid = 0.5 * (lo + hi);
    if (!(lo < mid && mid < hi)) return Math.abs(epsOf(hi) - eps1) < Math.abs(fLo) ? hi : lo;
    const fMid = epsOf(mid) - eps1;
    if (fMid === 0.0) return mid;
    if ((fMid < 0.0) === (fLo < 0.0)) {
      lo = mid;
      fLo = fMid;
    } else {
      hi = mid;
    }
  }
}

/** p2 of a GRR IRR round over m values (q2 = (1 - p2)/(m - 1)): "paper" (DCN 2022, Eq. 13) or "exact". */
export function grrChainP2(p1, q1, m, eps1, epsInf, calibration, name) {
  if (eps1 >= epsInf) throw new InfeasibleParameters(`${name}: eps1 = ${fmtG(eps1)} must be smaller than eps_inf = ${fmtG(epsInf)}`);
  const e = Math.exp(eps1);
  const a = 1.0 / (m - 1);
  let num, den;
  if (calibration === 'paper') {
    num = e * p1 * a - q1 * a;
    den = p1 - q1 * a - e * q1 + e * p1 * a;
  } else if (calibration === 'exact') {
    num = e * (1 - q1) * a - (1 - p1) * a;
    den = p1 - (1 - p1) * a - e * q1 + e * (1 - q1) * a;
  } else {
    throw new LDPError(`calibration must be one of exact, paper, got ${calibration}`);
  }
  const p2 = num / den;
  if (!(1.0 / m < p2 && p2 <= 1.0)) {
    throw new InfeasibleParameters(`${name}: no IRR probability gives eps1 = ${fmtG(eps1)} with eps_inf = ${fmtG(epsInf)}, m = ${m}`);
  }
  return p2;
}

export function sueIrr(p1, q1, eps1, epsInf, name) {
  const p2 = solve(name, (p) => ueChainEpsFirst(new Rounds(p1, q1, p, 1 - p)), 0.5, 1.0 - 1e-15, eps1, epsInf);
  return [p2, 1.0 - p2];
}

export function oueIrr(p1, q1, eps1, epsInf, name) {
  const q2 = solve(name, (t) => ueChainEpsFirst(new Rounds(p1, q1, 0.5, 0.5 - t)), 0.0, 0.5 - 1e-15, eps1, epsInf);
  return [0.5, 0.5 - q2];
}

export const CALIBRATIONS = ['exact', 'paper'];

/** Base of every memoizing protocol: PRR memoized per device, IRR per report. */
export class TwoRoundProtocol extends Protocol {
  get longitudinal() { return true; }

  initRounds(k, epsInf, eps1, calibration = 'exact') {
    if (!CALIBRATIONS.includes(calibration)) throw new LDPError(`calibration must be one of exact, paper, got ${calibration}`);
    this.k = k;
    this.requestedEpsInf = checkEps('eps_inf', epsInf);
    this.requestedEps1 = checkEps('eps_1', eps1);
    this.calibration = calibration;
    this.rounds = this.solveRounds();
  }

  params() {
    return { protocol: this.name, k: this.k, eps_inf: this.requestedEpsInf, eps_1: this.requestedEps1, calibration: this.calibration };
  }

  get ps() { return this.rounds.ps; }
  get qs() { return this.rounds.qs; }
  get p1() { return this.rounds.p1; }
  get q1() { return this.rounds.q1; }
  get p2() { return this.rounds.p2; }
  get q2() { return this.rounds.q2; }
  get memoSize() { return this.k; }

  longitudinalLoss(m) {
    return Math.min(m, this.memoSize) * this.epsInf;
  }
}

/** The fresh-noise draws of one report: row 0 of a batch of one under a new 256-bit key. */
export function noiseDraws(keys, slot) {
  return new NoiseDraws(keys(), slot);
}

export function prrStream(state, x, words) {
  return new Stream(state.key, DOMAINS.PRR, x, words);
}
