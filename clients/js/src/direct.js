// Direct encoding: GRR and its memoized chain L-GRR (estimators/direct.py; kernels.grr_chain_randomize).
import { DOMAINS, Stream } from './chacha.js';
import { SingleShot, TwoRoundProtocol, Rounds, grrEps, grrChainEpsFirst, grrChainP2, noiseDraws } from './protocol.js';
import { checkDomain, uintBytes, uintName, writeUint } from './util.js';

/** GRR over m values: p = e^eps / (e^eps + m - 1), q = 1 / (e^eps + m - 1). */
export function grrProbabilities(eps, m) {
  const d = Math.exp(eps) + m - 1;
  return [Math.exp(eps) / d, 1.0 / d];
}

/** A value uniform over [0, m) \ {x} from one uniform u. */
export function otherThan(x, m, u) {
  let o = Math.trunc(u * (m - 1));
  if (o >= x) o += 1;
  return o;
}

/**
 * Two GRR rounds over [0, m) for one device: the first from words 0 (keep?) and 1 (which other value) of the
 * PRR stream `prr` (memoized) or, without it, of the noise slot; the IRR (p2 < 1) from the slot's next two words.
 */
export function grrChain(x, m, p1, p2, prr, noise) {
  const irr = p2 < 1.0;
  const first = prr ? 0 : 2;
  const src = prr ?? noise;
  if (src.unit(0) >= p1) x = otherThan(x, m, src.unit(1));
  if (irr && noise.unit(first) >= p2) x = otherThan(x, m, noise.unit(first + 1));
  return x;
}

/** Reports are the randomized values: one unsigned integer of the smallest width holding [0, k). */
export const DirectReports = (Base) => class extends Base {
  get reportItemsize() { return uintBytes(this.k); }
  get reportDtype() { return uintName(this.reportItemsize); }

  encodeValue(v) {
    const out = new Uint8Array(this.reportItemsize);
    writeUint(out, 0, this.reportItemsize, v);
    return out;
  }
};

export class GRR extends DirectReports(SingleShot) {
  constructor({ k, eps }) {
    super();
    this.initSingleShot(k, eps);
    [this.p, this.q] = grrProbabilities(this.eps, this.k);
  }

  get name() { return 'GRR'; }

  get epsFirst() { return grrEps(this.p, this.q); }

  randomize(v, { keys, state = null }) {
    this.checkValue(v);
    this.stateFor(state);
    const noise = noiseDraws(keys, 2);
    return this.encodeValue(grrChain(v, this.k, this.p, 1.0, null, noise));
  }
}

/** Two GRR rounds over chain_size values (L-GRR: k; LOLOHA: g). */
export class GRRChain extends TwoRoundProtocol {
  get chainSize() { return this.k; }

  supportQ1() { return null; }

  solveRounds() {
    const m = this.chainSize;
    const [p1, q1] = grrProbabilities(this.requestedEpsInf, m);
    const p2 = grrChainP2(p1, q1, m, this.requestedEps1, this.requestedEpsInf, this.calibration, this.name);
    return new Rounds(p1, q1, p2, (1 - p2) / (m - 1), this.supportQ1());
  }

  get epsInf() { return grrEps(this.p1, this.q1); }

  get epsFirst() { return grrChainEpsFirst(this.rounds); }

  /** The memoized chain over [0, chain_size) for input x (marks x), then the IRR from a fresh noise key. */
  chain(x, state, keys) {
    state.mark(x);
    const prr = new Stream(state.key, DOMAINS.PRR, x, 8);
    const noise = noiseDraws(keys, 2);
    return grrChain(x, this.chainSize, this.p1, this.p2, prr, noise);
  }
}

export class LGRR extends DirectReports(GRRChain) {
  constructor({ k, eps_inf, eps_1, calibration = 'exact' }) {
    super();
    this.initRounds(checkDomain(k), eps_inf, eps_1, calibration);
  }

  get name() { return 'L-GRR'; }

  randomize(v, { keys, state }) {
    this.checkValue(v);
    const st = this.stateFor(state);
    return this.encodeValue(this.chain(v, st, keys));
  }
}
