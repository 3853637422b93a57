// Subset selection: the omega-subset mechanism SS (estimators/subset.py; kernels.ss_randomize).
import { SingleShot, noiseDraws } from './protocol.js';
import { LDPError, uintBytes, uintName, writeUint } from './util.js';

export const LAYOUTS = ['auto', 'bits', 'indices'];

/** omega = max(1, round(k / (e^eps + 1))). */
export function ssOptimalOmega(k, eps) {
  return Math.max(1, Math.trunc(Math.floor(k / (Math.exp(eps) + 1.0) + 0.5)));
}

export function ssProbabilities(k, eps, omega) {
  const d = omega * Math.exp(eps) + k - omega;
  const ps = (omega * Math.exp(eps)) / d;
  const out = (k - omega) / d;
  const qs = (ps * (omega - 1)) / (k - 1) + (out * omega) / (k - 1);
  return [ps, qs];
}

export class SS extends SingleShot {
  constructor({ k, eps, omega = null, layout = 'auto' }) {
    super();
    this.initSingleShot(k, eps);
    if (omega === null || omega === undefined) omega = ssOptimalOmega(this.k, this.eps);
    if (typeof omega !== 'number' || !Number.isInteger(omega) || omega < 1 || omega > this.k - 1) {
      throw new LDPError(`omega must be an integer in [1, k-1] = [1, ${this.k - 1}], got ${omega}`);
    }
    this.omega = omega;
    if (!LAYOUTS.includes(layout)) throw new LDPError(`layout must be one of ${LAYOUTS.join(', ')}, got ${layout}`);
    if (layout === 'auto') layout = this.omega * uintBytes(this.k) < (this.k + 7) >> 3 ? 'indices' : 'bits';
    this.layout = layout;
    [this.p, this.q] = ssProbabilities(this.k, this.eps, this.omega);
    this.pOut = (this.k - this.omega) / (this.omega * Math.exp(this.eps) + this.k - this.omega);
  }

  get name() { return 'SS'; }

  params() { return { protocol: this.name, k: this.k, eps: this.eps, omega: this.omega, layout: this.layout }; }

  get epsFirst() {
    return Math.log(this.p) - Math.log(this.pOut) + Math.log((this.k - this.omega) / this.omega);
  }

  get reportItemsize() { return this.layout === 'bits' ? 1 : uintBytes(this.k); }
  get reportDtype() { return this.layout === 'bits' ? 'uint8' : uintName(uintBytes(this.k)); }
  get reportShape() { return [this.layout === 'bits' ? (this.k + 7) >> 3 : this.omega]; }

  randomize(v, { keys, state = null }) {
    this.checkValue(v);
    this.stateFor(state);
    const { k, omega } = this;
    const noise = noiseDraws(keys, 1 + omega);
    const bits = new Uint8Array((k + 7) >> 3);
    const has = (i) => (bits[i >> 3] >> (i & 7)) & 1;
    const set = (i) => { bits[i >> 3] |= 1 << (i & 7); };
    let m = omega;
    if (noise.unit(0) < this.p) {
      set(v);
      m = omega - 1;
    }
    const pop = k - 1;
    for (let s = 0; s < m; s++) {
      const j = pop - m + s;
      const t = Math.trunc(noise.unit(1 + s) * (j + 1));
      let vt = t >= v ? t + 1 : t;
      if (has(vt)) vt = j >= v ? j + 1 : j;
      set(vt);
    }
    if (this.layout === 'bits') return bits;
    const size = uintBytes(k);
    const out = new Uint8Array(omega * size);
    let c = 0;
    for (let i = 0; i < k; i++) if (has(i)) writeUint(out, size * c++, size, i);
    return out;
  }
}
