// dBitFlipPM (estimators/bitflip.py; kernels.bitflip_randomize): d sampled buckets fixed per device by its memo
// key, memoized bits per case; no fresh randomness at all.
import { DOMAINS, Stream } from './chacha.js';
import { Protocol } from './protocol.js';
import { LDPError, checkDomain, checkEps, checkInt, uintBytes, uintName, writeUint } from './util.js';

export const MAX_BUCKETS = 2 ** 31 - 1;

export class DBitFlipPM extends Protocol {
  constructor({ k, b, d, eps_inf }) {
    super();
    this.k = checkDomain(k);
    this.b = checkInt('b (number of buckets)', b, 2, MAX_BUCKETS);
    if (this.b > this.k) throw new LDPError(`b = ${this.b} buckets cannot exceed the domain size k = ${this.k}`);
    if (this.k * this.b > Number.MAX_SAFE_INTEGER) throw new LDPError(`k * b = ${this.k * this.b} overflows`);
    this.d = checkInt('d (sampled buckets per device)', d, 1);
    if (this.d > this.b) throw new LDPError(`d = ${this.d} sampled buckets cannot exceed b = ${this.b}`);
    this.requestedEpsInf = checkEps('eps_inf', eps_inf);
    const h = Math.exp(this.requestedEpsInf / 2);
    this.p = h / (h + 1);
    this.q = 1 / (h + 1);
    this.floyd = this.d * this.d <= 4 * this.b;
  }

  get name() { return 'dBitFlipPM'; }
  get longitudinal() { return true; }
  params() { return { protocol: this.name, k: this.k, b: this.b, d: this.d, eps_inf: this.requestedEpsInf }; }

  get ps() { return (this.d / this.b) * this.p; }
  get qs() { return (this.d / this.b) * this.q; }

  get epsInf() {
    if (this.d === 1) return Math.log(this.p / this.q);
    return Math.log((this.p * (1 - this.q)) / ((1 - this.p) * this.q));
  }

  get epsFirst() { return this.epsInf; }
  get memoSize() { return this.b; }
  get domainSize() { return this.b; }
  get memoCases() { return Math.min(this.d + 1, this.b); }

  longitudinalLoss(m) {
    return Math.min(Math.max(m, 0), this.memoCases) * this.epsInf;
  }

  get worstCaseLoss() {
    const r = Math.max(this.memoSize, 2);
    return this.b === this.k && this.d >= this.b - 1 ? this.longitudinalLoss(r) : Infinity;
  }

  bucket(v) { return Math.floor((v * this.b) / this.k); }

  /** bucket j holds the values [edges[j], edges[j + 1]) with edges[j] = ceil(j k / b). */
  bucketEdges() {
    const out = [];
    for (let j = 0; j <= this.b; j++) out.push(Math.ceil((j * this.k) / this.b));
    return out;
  }

  get reportItemsize() { return uintBytes(2 * this.b); }
  get reportDtype() { return uintName(this.reportItemsize); }
  get reportShape() { return [this.d]; }

  /** The device's d sampled buckets, increasing: a pure function of its memo key. */
  sampled(key) {
    const { b, d } = this;
    const js = new Stream(key, DOMAINS.BITFLIP_J, 0, this.floyd ? Math.min(d, 64) : Math.min(b, 16));
    const row = [];
    if (this.floyd) {
      for (let s = 0; s < d; s++) {
        const t = b - d + s;
        const r = Math.trunc(js.unit(s) * (t + 1));
        const val = row.includes(r) ? t : r;
        let pos = row.length;
        row.push(val);
        while (pos > 0 && row[pos - 1] > val) { row[pos] = row[pos - 1]; pos -= 1; }
        row[pos] = val;
      }
    } else {
      for (let t = 0; t < b; t++) {
        const need = d - row.length;
        if (need === 0) break;
        const rem = b - t;
        if (need === rem || js.unit(t) * rem < need) row.push(t);
      }
    }
    return row;
  }

  randomize(v, { keys, state }) {
    this.checkValue(v);
    const st = this.stateFor(state);
    const x = Math.floor((v * this.b) / this.k);
    st.mark(x);
    const J = this.sampled(st.key);
    let kase = J.indexOf(x);
    if (kase < 0) kase = this.d;
    const bits = new Stream(st.key, DOMAINS.BITFLIP_BIT, kase, Math.min(this.d, 64));
    const size = this.reportItemsize;
    const out = new Uint8Array(this.d * size);
    for (let l = 0; l < this.d; l++) {
      const bit = bits.unit(l) < (l === kase ? this.p : this.q) ? 1 : 0;
      writeUint(out, l * size, size, J[l] * 2 + bit);
    }
    return out;
  }
}
