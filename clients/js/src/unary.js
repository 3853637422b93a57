// Unary encoding: SUE, OUE and the memoized chains L-SUE, L-OUE, L-OSUE, L-SOUE (estimators/unary.py;
// kernels.ue_chain_randomize): exact lazy Bernoulli bits on the 2^-32 grid, 8 per stream word.
import { DOMAINS, Stream } from './chacha.js';
import {
  SingleShot, TwoRoundProtocol, Rounds, ueEps, ueChainEpsFirst, sueIrr, oueIrr, noiseDraws,
} from './protocol.js';
import { checkDomain, quantize32, threshold32, splitThreshold, LDPError } from './util.js';

export const UE_REFINE_SLOTS = 2;
const TWO32 = 4294967296;

/** SUE: p = e^{eps/2} / (e^{eps/2} + 1), q = 1 - p, on the 2^-32 grid. */
export function sueProbabilities(eps) {
  const h = Math.exp(eps / 2);
  return [quantize32(h / (h + 1)), quantize32(1 / (h + 1))];
}

/** OUE: p = 1/2, q = 1 / (e^eps + 1), on the 2^-32 grid. */
export function oueProbabilities(eps) {
  return [0.5, quantize32(1 / (Math.exp(eps) + 1))];
}

/**
 * Lazy exact Bernoulli bits of one round over the bytes' lanes (randomness.bernoulli_top / bernoulli_refine):
 * lane t of byte b is 1 iff byte t of word `w0 + b` of the stream `top` is below the top byte of the lane's
 * threshold (`hiA`/`restA` where bit t of `sel[b]` is set, else `hiB`/`restB`; `sel` null: B everywhere); ties
 * are settled in (byte, lane) order by the low 24 bits of successive words j, j+1, ... of `refine`.
 * Returns the next refinement index.
 */
function bernoulliRound(bits, nbytes, top, w0, sel, hiA, restA, hiB, restB, refine, j) {
  top.ensure(w0 + nbytes);
  const z = top.bytes;
  let o = 8 * w0;
  for (let b = 0; b < nbytes; b++, o += 8) {
    const s = sel === null ? 0 : sel[b];
    let byte = 0;
    for (let t = 0; t < 8; t++) {
      const a = (s >> t) & 1;
      const hi = a ? hiA : hiB;
      const zt = z[o + t];
      if (zt < hi) byte |= 1 << t;
      else if (zt === hi) {
        if (refine.low24(j) < (a ? restA : restB)) byte |= 1 << t;
        j += 1;
      }
    }
    bits[b] = byte;
  }
  return j;
}

/**
 * Two UE rounds over k bits for one device, packed little-endian into ceil(k/8) bytes. Thresholds are 32-bit
 * integers (threshold32); t2p = 2^32, t2q = 0 disables the IRR. With `state` the PRR draws from the stream
 * (key, PRR, x) (words 0..B-1 the bytes, B the hot bit, then refinements) and x is marked; without it from the
 * noise slot (same layout). The IRR takes the slot's next B words; refinements of noise rounds take the slot's
 * last UE_REFINE_SLOTS words, then the row's extension stream.
 */
export function ueChain(x, k, t1p, t1q, t2p, t2q, state, keys) {
  const nbytes = (k + 7) >> 3;
  const memo = state !== null;
  const irr = !(t2p === TWO32 && t2q === 0);
  const first = memo ? 0 : nbytes + 1;
  const refine0 = first + (irr ? nbytes : 0);
  const w = refine0 + UE_REFINE_SLOTS;
  const noise = noiseDraws(keys, w);
  const [q1Hi, q1Rest] = splitThreshold(t1q);
  const bits = new Uint8Array(nbytes);
  let jn = refine0;
  let hot;
  if (memo) {
    state.mark(x);
    const pw = ((nbytes + 1 + UE_REFINE_SLOTS + 7) >> 3) * 8;
    const prr = new Stream(state.key, DOMAINS.PRR, x, pw);
    bernoulliRound(bits, nbytes, prr, 0, null, q1Hi, q1Rest, q1Hi, q1Rest, prr, nbytes + 1);
    hot = prr.lo(nbytes);
  } else {
    jn = bernoulliRound(bits, nbytes, noise.main, 0, null, q1Hi, q1Rest, q1Hi, q1Rest, noise, jn);
    hot = noise.lo(nbytes);
  }
  const mb = 1 << (x & 7);
  if (hot < t1p) bits[x >> 3] |= mb;
  else bits[x >> 3] &= ~mb & 0xff;
  if (irr) {
    const [p2Hi, p2Rest] = splitThreshold(t2p);
    const [q2Hi, q2Rest] = splitThreshold(t2q);
    jn = bernoulliRound(bits, nbytes, noise.main, first, bits.slice(), p2Hi, p2Rest, q2Hi, q2Rest, noise, jn);
  }
  if (k & 7) bits[nbytes - 1] &= (1 << (k & 7)) - 1;
  return bits;
}

/** Reports are k-bit vectors packed little-endian into ceil(k/8) bytes. */
export const UnaryReports = (Base) => class extends Base {
  get reportItemsize() { return 1; }
  get reportDtype() { return 'uint8'; }
  get reportShape() { return [(this.k + 7) >> 3]; }
};

export class UnaryEncoding extends UnaryReports(SingleShot) {
  initUE(k, eps) {
    this.initSingleShot(k, eps);
    [this.p, this.q] = this.probabilities(this.eps);
  }

  get epsFirst() { return ueEps(this.p, this.q); }

  randomize(v, { keys, state = null }) {
    this.checkValue(v);
    this.stateFor(state);
    return ueChain(v, this.k, threshold32(this.p), threshold32(this.q), TWO32, 0, null, keys);
  }
}

export class SUE extends UnaryEncoding {
  constructor({ k, eps }) { super(); this.initUE(k, eps); }
  get name() { return 'SUE'; }
  probabilities(eps) { return sueProbabilities(eps); }
}

export class OUE extends UnaryEncoding {
  constructor({ k, eps }) { super(); this.initUE(k, eps); }
  get name() { return 'OUE'; }
  probabilities(eps) { return oueProbabilities(eps); }
}

const FIRST = { OUE: oueProbabilities, SUE: sueProbabilities };
const SECOND = { OUE: oueIrr, SUE: sueIrr };

export class LongitudinalUE extends UnaryReports(TwoRoundProtocol) {
  constructor({ k, eps_inf, eps_1, calibration = 'exact' }) {
    super();
    this.initRounds(checkDomain(k), eps_inf, eps_1, calibration);
  }

  solveRounds() {
    const [p1, q1] = FIRST[this.prr](this.requestedEpsInf);
    const [p2, q2] = SECOND[this.irr](p1, q1, this.requestedEps1, this.requestedEpsInf, this.name);
    return new Rounds(p1, q1, quantize32(p2), quantize32(q2));
  }

  get epsInf() { return ueEps(this.p1, this.q1); }

  get epsFirst() { return ueChainEpsFirst(this.rounds); }

  randomize(v, { keys, state }) {
    this.checkValue(v);
    const st = this.stateFor(state);
    if (!st) throw new LDPError(`${this.name} memoizes: pass a memo state`);
    return ueChain(v, this.k, threshold32(this.p1), threshold32(this.q1), threshold32(this.p2), threshold32(this.q2), st, keys);
  }
}

export class LOUE extends LongitudinalUE {
  get name() { return 'L-OUE'; }
  get prr() { return 'OUE'; }
  get irr() { return 'OUE'; }
}

export class LSUE extends LongitudinalUE {
  get name() { return 'L-SUE'; }
  get prr() { return 'SUE'; }
  get irr() { return 'SUE'; }
}

export class LOSUE extends LongitudinalUE {
  get name() { return 'L-OSUE'; }
  get prr() { return 'OUE'; }
  get irr() { return 'SUE'; }
}

export class LSOUE extends LongitudinalUE {
  get name() { return 'L-SOUE'; }
  get prr() { return 'SUE'; }
  get irr() { return 'OUE'; }
}
