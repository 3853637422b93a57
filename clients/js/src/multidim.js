// Multidimensional solutions (estimators/multidim.py): d attributes per device under one budget, each through a
// channel protocol. Split (SPL, L-SPL), sample (SMP, L-SMP, ALLOMFREE) and fake data (RS+FD, L-RS+FD,
// ALLOMFREE with fake_data). The device state (memo keys per attribute, the sampled attribute, the fixed fake
// inputs, the real reports per attribute) is drawn in the Python order, so recorded keys replay byte for byte.
import { DOMAINS, Stream } from './chacha.js';
import { MemoState } from './protocol.js';
import { make, parameters } from './registry.js';
import { ueChain } from './unary.js';
import { LDPError, checkEps, fingerprintOf, threshold32 } from './util.js';

export const SAMPLINGS = ['fixed', 'per-step'];
export const AMPLIFICATIONS = ['paper', 'none'];
export const OBJECTIVES = ['variance', 'loss'];
export const RSFD_PROTOCOLS = ['GRR', 'OUE-z', 'OUE-r', 'ADP'];
export const LOSS_VARIANCE_FACTOR = 1.25;
const LOSS_RTOL = 1e-6;
const TWO32 = 4294967296;

// fake-data laws of an attribute (what a non-sampled attribute reports)
const RAW_UNIFORM = 'uniform value';
const UNIFORM = 'channel of a uniform input';
const ZERO = 'OUE of the all-zero vector';

/** eps' = ln(d (e^eps - 1) + 1): RS+FD's budget for the sampled attribute. */
export function amplifiedEps(eps, d) {
  return Math.log1p(d * Math.expm1(eps));
}

/** One integer uniform on [0, m): word 0 of (fresh key, NOISE, 0) as floor(u m) (multidim.uniform_draws, n = 1). */
export function uniformDraw(keys, m) {
  const u = new Stream(keys(), DOMAINS.NOISE, 0, 8).unit(0);
  return Math.min(Math.trunc(u * m), m - 1);
}

function checkKs(ks) {
  if (!Array.isArray(ks) || ks.length < 2 || !ks.every((k) => typeof k === 'number' && Number.isInteger(k) && k >= 2)) {
    throw new LDPError(`ks must list at least 2 integer domain sizes >= 2, got ${JSON.stringify(ks)}`);
  }
  return ks.slice();
}

function checkChoice(what, value, allowed) {
  if (!allowed.includes(value)) throw new LDPError(`${what} must be one of ${allowed.map((a) => `'${a}'`).join(', ')}, got ${JSON.stringify(value)}`);
  return value;
}

function perAttribute(protocolParams, d) {
  if (protocolParams === null || protocolParams === undefined) return Array.from({ length: d }, () => ({}));
  if (Array.isArray(protocolParams)) {
    if (protocolParams.length === d && protocolParams.every((p) => p && typeof p === 'object' && !Array.isArray(p))) {
      return protocolParams.map((p) => ({ ...p }));
    }
  } else if (typeof protocolParams === 'object') {
    return Array.from({ length: d }, () => ({ ...protocolParams }));
  }
  throw new LDPError(`protocol_params must be a dict or a list of ${d} dicts (one per attribute), got ${JSON.stringify(protocolParams)}`);
}

function channel(protocol, k, budget, extra, longitudinal, solution) {
  const takes = parameters(protocol);
  if (takes.includes('eps_inf') !== longitudinal) {
    throw new LDPError(`${solution} needs ${longitudinal ? 'a longitudinal (memoizing)' : 'a single-shot'} protocol, got ${protocol}`);
  }
  const clash = Object.keys(extra).filter((x) => ['k', 'eps', 'eps_inf', 'eps_1'].includes(x)).sort();
  if (clash.length) throw new LDPError(`${solution}: protocol_params cannot set ${clash.join(', ')} (the solution sets the domain size and spends the budget)`);
  const opts = { k, ...extra };
  for (const [name, value] of Object.entries(budget)) {
    if (value === null || value === undefined) continue;
    if (!takes.includes(name)) {
      throw new LDPError(`${solution}: ${protocol} takes no ${name}${name === 'eps_1' ? ' (it has no IRR round: its eps1 is its eps_inf); pass eps_1=None' : ''}`);
    }
    opts[name] = value;
  }
  return make(protocol, opts);
}

/** (ps', qs') of attribute reports real w.p. 1/d and fake otherwise. */
export function fakeDataProbabilities(ch, d, law) {
  const { ps, qs } = ch;
  const pi = law === ZERO ? 0.0 : 1.0 / ch.domainSize;
  const phi = qs + (ps - qs) * pi;
  return [ps / d + ((d - 1) * phi) / d, qs / d + ((d - 1) * phi) / d];
}

function pureVarStar(ps, qs) {
  return (qs * (1.0 - qs)) / (ps - qs) ** 2;
}

function representatives(ch) {
  if (typeof ch.bucketEdges === 'function') return ch.bucketEdges().slice(0, -1);
  return Array.from({ length: ch.domainSize }, (_, i) => i);
}

/** A device's state for one solution. */
export class MultiState {
  constructor(fingerprint, sampled, memos, fake, reported) {
    Object.assign(this, { fingerprint, sampled, memos, fake, reported });
  }

  get d() { return this.reported.length; }

  copy() {
    return new MultiState(this.fingerprint, this.sampled, this.memos.map((m) => (m ? m.copy() : null)),
      this.fake ? this.fake.slice() : null, this.reported.slice());
  }

  toJSON() {
    return { fingerprint: this.fingerprint, sampled: this.sampled, fake: this.fake, reported: this.reported,
      memos: this.memos.map((m) => (m ? m.toJSON() : null)) };
  }

  static fromJSON(obj) {
    if (!obj || typeof obj !== 'object' || !Array.isArray(obj.reported) || !Array.isArray(obj.memos)) {
      throw new LDPError('malformed group state');
    }
    return new MultiState(String(obj.fingerprint), obj.sampled ?? null, obj.memos.map((m) => (m ? MemoState.fromJSON(m) : null)),
      obj.fake ?? null, obj.reported.map(Number));
  }
}

export class Solution {
  setup(ks, channels, choices, params, sampling = null, fakeLaws = null) {
    this.ks = ks;
    this.channels = channels;
    this.choices = choices;
    this.sampling = sampling;
    this.fakeLaws = fakeLaws;
    this._params = { solution: this.name, ...params };
  }

  get d() { return this.ks.length; }

  params() { return JSON.parse(JSON.stringify(this._params)); }

  get fingerprint() {
    if (this._fp === undefined) this._fp = fingerprintOf(this._params);
    return this._fp;
  }

  get composes() { return this.layout === 'split' || this.sampling === 'per-step'; }

  get epsFirst() {
    const e = this.channels.map((c) => c.epsFirst);
    return this.layout === 'split' ? e.reduce((a, b) => a + b, 0) : Math.max(...e);
  }

  get epsInf() {
    if (!this.longitudinal) return this.epsFirst;
    const e = this.channels.map((c) => c.epsInf);
    return this.composes ? e.reduce((a, b) => a + b, 0) : Math.max(...e);
  }

  /** Worst-case device-level epsilon once a device memoized (at most) `m` inputs in every attribute it reports. */
  lossBound(m) {
    const losses = this.channels.map((c) => c.longitudinalLoss(m));
    return this.composes ? losses.reduce((a, b) => a + b, 0) : Math.max(...losses);
  }

  get worstCaseLoss() {
    if (this.channels.some((c) => c.worstCaseLoss === Infinity)) return Infinity;
    return this.lossBound(Math.max(Math.max(...this.channels.map((c) => c.memoSize)), 2));
  }

  /** Per attribute: the inputs memoized from real data, or the real reports capped at 2 (single-shot channels). */
  memoizedCells(state) {
    return this.channels.map((c, j) => (state.memos[j] ? state.memos[j].count() : Math.min(state.reported[j], 2)));
  }

  /** The device's worst-case longitudinal epsilon so far over all attributes. */
  longitudinalLoss(state) {
    const cells = this.memoizedCells(state);
    let total = 0.0;
    this.channels.forEach((c, j) => { total += c.longitudinalLoss(cells[j]); });
    return total;
  }

  get needsState() {
    return this.channels.some((c) => c.memoSize) || this.sampling === 'fixed' || (this.layout === 'fake' && this.longitudinal);
  }

  /** A fresh device: memo keys per memoizing channel, the sampled attribute, the fixed fake inputs (in this order). */
  newState(keys) {
    const memos = this.channels.map((c) => c.newState(keys));
    const sampled = this.layout !== 'split' ? uniformDraw(keys, this.d) : null;
    let fake = null;
    if (this.layout === 'fake' && this.longitudinal) {
      fake = this.channels.map((c) => {
        const reps = representatives(c);
        return reps[uniformDraw(keys, reps.length)];
      });
    }
    return new MultiState(this.fingerprint, sampled, memos, fake, new Array(this.d).fill(0));
  }

  checkState(state) {
    if (state.fingerprint !== this.fingerprint) {
      throw new LDPError(`device state belongs to another solution configuration (state ${state.fingerprint}, solution ${this.fingerprint})`);
    }
    const bad = this.channels.map((c, j) => j).filter((j) => {
      const m = state.memos[j];
      const c = this.channels[j];
      return (m === null) !== (c.memoSize === 0) || (m !== null && m.fingerprint !== c.fingerprint);
    });
    if (state.d !== this.d || bad.length || (state.sampled === null) !== (this.layout === 'split')
        || (state.fake === null) !== (this.layout !== 'fake' || !this.longitudinal)) {
      throw new LDPError(`device state does not match ${this.name}'s channels (attributes ${JSON.stringify(bad)})`);
    }
  }

  checkValues(values) {
    if (!Array.isArray(values) || values.length !== this.d) throw new LDPError(`values must be ${this.d} integers, got ${JSON.stringify(values)}`);
    values.forEach((v, j) => {
      if (typeof v !== 'number' || !Number.isInteger(v) || v < 0 || v >= this.ks[j]) {
        throw new LDPError(`value ${v} of attribute ${j} is outside the domain [0, ${this.ks[j]})`);
      }
    });
    return values;
  }

  /**
   * One step of one device: per attribute its report bytes, or null where the device sends nothing (sampling
   * solutions: every attribute but the sampled one). Updates `state` in place.
   */
  randomize(values, { keys, state = null }) {
    const v = this.checkValues(values);
    if (state === null) {
      if (this.needsState) throw new LDPError(`${this.name} keeps device state: pass state = solution.newState(keys)`);
    } else {
      this.checkState(state);
    }
    let sampled = null;
    if (this.layout !== 'split') {
      if (this.sampling === 'per-step' || state === null) {
        sampled = uniformDraw(keys, this.d);
        if (state !== null) state.sampled = sampled;
      } else {
        sampled = state.sampled;
      }
    }
    const count = (j) => {
      if (state !== null && state.reported[j] < 255) state.reported[j] += 1;
    };
    const memo = (j) => (state === null ? null : state.memos[j]);
    const out = [];
    this.channels.forEach((c, j) => {
      if (this.layout === 'split') {
        out.push(c.randomize(v[j], { keys, state: memo(j) }));
        count(j);
      } else if (this.layout === 'sample') {
        if (j !== sampled) {
          out.push(null);
          return;
        }
        out.push(c.randomize(v[j], { keys, state: memo(j) }));
        count(j);
      } else {
        const real = sampled === j;
        const law = this.fakeLaws[j];
        if (this.longitudinal) {
          // the channel of the true value (sampled) or of the device's fixed fake input; fake inputs are not marked
          const m = state.memos[j];
          const saved = !real && m ? m.seen.slice() : null;
          out.push(c.randomize(real ? v[j] : state.fake[j], { keys, state: m }));
          if (saved) m.seen = saved;
        } else if (law === UNIFORM) { // RS+FD[OUE-r]: the channel of a fresh uniform value
          const u = uniformDraw(keys, c.k);
          out.push(c.randomize(real ? v[j] : u, { keys }));
        } else if (real) {
          out.push(c.randomize(v[j], { keys }));
        } else {
          keys().fill(0); // the reference randomizes the (empty) batch of real rows: one noise key, unused
          if (law === RAW_UNIFORM) { // RS+FD[GRR]: a uniform value, not randomized
            out.push(c.encodeValue(uniformDraw(keys, c.k)));
          } else { // RS+FD[OUE-z]: OUE of the all-zero vector (every bit 1 w.p. q)
            const t = threshold32(c.q);
            out.push(ueChain(0, c.k, t, t, TWO32, 0, null, keys));
          }
        }
        if (real) count(j);
      }
    });
    return out;
  }
}

class Plain extends Solution {
  build(ks, protocol, budget, protocolParams, { sampling = null, extra = {}, fakeLaw = null } = {}) {
    ks = checkKs(ks);
    const per = perAttribute(protocolParams, ks.length);
    if (sampling !== null) checkChoice('sampling', sampling, SAMPLINGS);
    const channels = ks.map((k, j) => channel(protocol, k, budget, per[j], this.longitudinal, this.name));
    const choices = channels.map((c) => [c.name, `fixed by the solution (protocol='${protocol}')`]);
    const params = { ks, ...this.budgetParams, protocol, protocol_params: protocolParams ?? null,
      ...(sampling === null ? {} : { sampling }), ...extra };
    this.setup(ks, channels, choices, params, sampling, fakeLaw === null ? null : ks.map(() => fakeLaw));
  }
}

function longitudinalBudget(epsInf, eps1) {
  return [checkEps('eps_inf', epsInf), eps1 === null || eps1 === undefined ? null : checkEps('eps_1', eps1)];
}

function amplify(amplification, eps, d) {
  checkChoice('amplification', amplification, AMPLIFICATIONS);
  if (eps === null) return null;
  return amplification === 'paper' ? amplifiedEps(eps, d) : eps;
}

export class SPL extends Plain {
  constructor({ ks, eps, protocol, protocol_params = null }) {
    super();
    this.eps = checkEps('eps', eps);
    this.budgetParams = { eps: this.eps };
    this.build(ks, protocol, { eps: this.eps / checkKs(ks).length }, protocol_params);
  }

  get name() { return 'SPL'; }
  get longitudinal() { return false; }
  get layout() { return 'split'; }
}

export class SMP extends Plain {
  constructor({ ks, eps, protocol, protocol_params = null, sampling = 'fixed' }) {
    super();
    this.eps = checkEps('eps', eps);
    this.budgetParams = { eps: this.eps };
    this.build(ks, protocol, { eps: this.eps }, protocol_params, { sampling });
  }

  get name() { return 'SMP'; }
  get longitudinal() { return false; }
  get layout() { return 'sample'; }
}

export class LSPL extends Plain {
  constructor({ ks, eps_inf, protocol, eps_1 = null, protocol_params = null }) {
    super();
    [this.epsInfTotal, this.eps1Total] = longitudinalBudget(eps_inf, eps_1);
    this.budgetParams = { eps_inf: this.epsInfTotal, eps_1: this.eps1Total };
    const d = checkKs(ks).length;
    this.build(ks, protocol, { eps_inf: this.epsInfTotal / d, eps_1: this.eps1Total === null ? null : this.eps1Total / d }, protocol_params);
  }

  get name() { return 'L-SPL'; }
  get longitudinal() { return true; }
  get layout() { return 'split'; }
}

export class LSMP extends Plain {
  constructor({ ks, eps_inf, protocol, eps_1 = null, protocol_params = null, sampling = 'fixed' }) {
    super();
    [this.epsInfTotal, this.eps1Total] = longitudinalBudget(eps_inf, eps_1);
    this.budgetParams = { eps_inf: this.epsInfTotal, eps_1: this.eps1Total };
    this.build(ks, protocol, { eps_inf: this.epsInfTotal, eps_1: this.eps1Total }, protocol_params, { sampling });
  }

  get name() { return 'L-SMP'; }
  get longitudinal() { return true; }
  get layout() { return 'sample'; }
}

export class LRSFD extends Plain {
  constructor({ ks, eps_inf, protocol, eps_1 = null, protocol_params = null, sampling = 'fixed', amplification = 'paper' }) {
    super();
    [this.epsInfTotal, this.eps1Total] = longitudinalBudget(eps_inf, eps_1);
    this.budgetParams = { eps_inf: this.epsInfTotal, eps_1: this.eps1Total };
    const d = checkKs(ks).length;
    const budget = { eps_inf: amplify(amplification, this.epsInfTotal, d), eps_1: amplify(amplification, this.eps1Total, d) };
    this.build(ks, protocol, budget, protocol_params, { sampling, extra: { amplification }, fakeLaw: UNIFORM });
  }

  get name() { return 'L-RS+FD'; }
  get longitudinal() { return true; }
  get layout() { return 'fake'; }
}

export class RSFD extends Solution {
  constructor({ ks, eps, protocol, sampling = 'fixed', amplification = 'paper' }) {
    super();
    ks = checkKs(ks);
    const d = ks.length;
    this.eps = checkEps('eps', eps);
    checkChoice('protocol', protocol, RSFD_PROTOCOLS);
    checkChoice('sampling', sampling, SAMPLINGS);
    const amp = amplify(amplification, this.eps, d);
    const channels = [];
    const choices = [];
    const laws = [];
    for (const k of ks) {
      const grr = make('GRR', { k, eps: amp });
      const oue = make('OUE', { k, eps: amp });
      let pick;
      let why;
      if (protocol === 'ADP') {
        const vg = pureVarStar(...fakeDataProbabilities(grr, d, RAW_UNIFORM));
        const vo = pureVarStar(...fakeDataProbabilities(oue, d, ZERO));
        pick = vg <= vo ? 'GRR' : 'OUE-z';
        why = `${pick}: smaller RS+FD Var* (${vg} for GRR vs ${vo} for OUE-z)`;
      } else {
        pick = protocol;
        why = `fixed by the solution (protocol='${protocol}')`;
      }
      channels.push(pick === 'GRR' ? grr : oue);
      laws.push({ GRR: RAW_UNIFORM, 'OUE-z': ZERO, 'OUE-r': UNIFORM }[pick]);
      choices.push([pick, why]);
    }
    this.setup(ks, channels, choices, { ks, eps: this.eps, protocol, sampling, amplification }, sampling, laws);
  }

  get name() { return 'RS+FD'; }
  get longitudinal() { return false; }
  get layout() { return 'fake'; }
}

export class ALLOMFREE extends Solution {
  constructor({ ks, eps_inf, eps_1, calibration = 'exact', objective = 'variance', fake_data = false, sampling = 'fixed',
    amplification = 'paper', variance_factor = LOSS_VARIANCE_FACTOR }) {
    super();
    ks = checkKs(ks);
    const d = ks.length;
    this.epsInfTotal = checkEps('eps_inf', eps_inf);
    this.eps1Total = checkEps('eps_1', eps_1);
    checkChoice('calibration', calibration, ['exact', 'paper']);
    checkChoice('objective', objective, OBJECTIVES);
    checkChoice('sampling', sampling, SAMPLINGS);
    if (typeof fake_data !== 'boolean') throw new LDPError(`fake_data must be true or false, got ${JSON.stringify(fake_data)}`);
    const factor = Number(variance_factor);
    if (!Number.isFinite(factor) || factor < 1.0) throw new LDPError(`variance_factor must be a number >= 1, got ${variance_factor}`);
    this._layout = fake_data ? 'fake' : 'sample';
    let ei;
    let e1;
    if (fake_data) {
      ei = amplify(amplification, this.epsInfTotal, d);
      e1 = amplify(amplification, this.eps1Total, d);
    } else {
      checkChoice('amplification', amplification, AMPLIFICATIONS);
      ei = this.epsInfTotal;
      e1 = this.eps1Total;
    }
    const names = ['L-GRR', 'L-OSUE', ...(objective === 'loss' ? ['LOLOHA'] : [])];
    const channels = [];
    const choices = [];
    for (const k of ks) {
      const cands = names.map((nm) => make(nm, { k, eps_inf: ei, eps_1: e1, calibration }));
      const vr = cands.map((c) => (fake_data ? pureVarStar(...fakeDataProbabilities(c, d, UNIFORM)) : c.variance(1)));
      const pick = ALLOMFREE.choose(cands, vr, objective, factor);
      channels.push(cands[pick]);
      choices.push([cands[pick].name, `${objective === 'variance' ? 'smallest Var*' : 'smallest worst-case longitudinal loss'}`]);
    }
    const params = { ks, eps_inf: this.epsInfTotal, eps_1: this.eps1Total, calibration, objective, fake_data, sampling,
      amplification, variance_factor: factor };
    this.setup(ks, channels, choices, params, sampling, fake_data ? ks.map(() => UNIFORM) : null);
  }

  static choose(cands, vr, objective, factor) {
    let best = 0;
    vr.forEach((v, i) => { if (v < vr[best]) best = i; }); // first of equal variances
    if (objective === 'variance') return best;
    const ok = vr.map((v, i) => i).filter((i) => vr[i] <= factor * vr[best]);
    const loss = new Map(ok.map((i) => [i, cands[i].worstCaseLoss]));
    const low = Math.min(...loss.values());
    const tied = ok.filter((i) => loss.get(i) <= low * (1 + LOSS_RTOL));
    return tied.reduce((a, i) => (vr[i] < vr[a] ? i : a), tied[0]);
  }

  get name() { return 'ALLOMFREE'; }
  get longitudinal() { return true; }
  get layout() { return this._layout; }
}

/** name -> [class, accepted keywords, required keywords] (estimators.SOLUTIONS). */
export const SOLUTIONS = {
  SPL: [SPL, ['ks', 'eps', 'protocol', 'protocol_params'], ['ks', 'eps', 'protocol']],
  SMP: [SMP, ['ks', 'eps', 'protocol', 'protocol_params', 'sampling'], ['ks', 'eps', 'protocol']],
  'L-SPL': [LSPL, ['ks', 'eps_inf', 'protocol', 'eps_1', 'protocol_params'], ['ks', 'eps_inf', 'protocol']],
  'L-SMP': [LSMP, ['ks', 'eps_inf', 'protocol', 'eps_1', 'protocol_params', 'sampling'], ['ks', 'eps_inf', 'protocol']],
  'RS+FD': [RSFD, ['ks', 'eps', 'protocol', 'sampling', 'amplification'], ['ks', 'eps', 'protocol']],
  ALLOMFREE: [ALLOMFREE, ['ks', 'eps_inf', 'eps_1', 'calibration', 'objective', 'fake_data', 'sampling', 'amplification',
    'variance_factor'], ['ks', 'eps_inf', 'eps_1']],
  'L-RS+FD': [LRSFD, ['ks', 'eps_inf', 'protocol', 'eps_1', 'protocol_params', 'sampling', 'amplification'],
    ['ks', 'eps_inf', 'protocol']],
};

/** Build a solution: makeSolution({solution: "ALLOMFREE", ks: [2, 10, 300], eps_inf: 2.0, eps_1: 1.0}). */
export function makeSolution({ solution, ...params }) {
  const entry = SOLUTIONS[solution];
  if (!entry) throw new LDPError(`unknown solution '${solution}'; known: ${Object.keys(SOLUTIONS).join(', ')}`);
  const [Cls, accepted, required] = entry;
  const unknown = Object.keys(params).filter((p) => !accepted.includes(p)).sort();
  if (unknown.length) throw new LDPError(`${solution} does not take ${unknown.join(', ')}; it takes ${accepted.join(', ')}`);
  const missing = required.filter((p) => params[p] === undefined);
  if (missing.length) throw new LDPError(`${solution} needs ${missing.join(', ')}`);
  return new Cls(params);
}
