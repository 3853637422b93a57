// Adaptive protocol choice by the smaller Var* (estimators/adaptive.py): ADP picks GRR or OUE, L-ADP picks
// L-GRR or L-OSUE. The choice depends on public parameters only, so both sides agree on it.
import { Protocol, MemoState } from './protocol.js';
import { GRR, LGRR } from './direct.js';
import { OUE, LOSUE } from './unary.js';

const N_REF = 10000;

export class Adaptive extends Protocol {
  initAdaptive(a, b) {
    this.chosen = a.variance(N_REF) <= b.variance(N_REF) ? a : b;
    this.k = this.chosen.k;
  }

  params() {
    const inner = { ...this.chosen.params() };
    const chosen = inner.protocol;
    delete inner.protocol;
    return { protocol: this.name, ...inner, chosen };
  }

  get epsFirst() { return this.chosen.epsFirst; }
  get epsInf() { return this.chosen.epsInf; }
  get memoSize() { return this.chosen.memoSize; }
  get reportItemsize() { return this.chosen.reportItemsize; }
  get reportDtype() { return this.chosen.reportDtype; }
  get reportShape() { return this.chosen.reportShape; }
  get ps() { return this.chosen.ps; }
  get qs() { return this.chosen.qs; }

  longitudinalLoss(m) { return this.chosen.longitudinalLoss(m); }

  variance(n) { return this.chosen.variance(n); }

  /** The state (checked against this protocol) as a view for the chosen protocol (same key and cells). */
  chosenState(state) {
    if (!state) return null;
    this.stateFor(state);
    return new MemoState(this.chosen.fingerprint, state.key, state.memoSize, state.seen);
  }

  randomize(v, { keys, state = null }) {
    return this.chosen.randomize(v, { keys, state: this.chosenState(state) });
  }
}

export class ADP extends Adaptive {
  constructor({ k, eps }) {
    super();
    this.initAdaptive(new GRR({ k, eps }), new OUE({ k, eps }));
  }

  get name() { return 'ADP'; }
}

export class LADP extends Adaptive {
  constructor({ k, eps_inf, eps_1, calibration = 'exact' }) {
    super();
    this.initAdaptive(new LGRR({ k, eps_inf, eps_1, calibration }), new LOSUE({ k, eps_inf, eps_1, calibration }));
  }

  get name() { return 'L-ADP'; }
  get longitudinal() { return true; }
}
