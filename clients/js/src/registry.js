// make(name, params): every protocol by its public name, with the keywords the Python constructor takes
// (estimators/registry.py): unknown or missing keywords are refused, never guessed.
import { GRR, LGRR } from './direct.js';
import { SUE, OUE, LOUE, LSUE, LOSUE, LSOUE } from './unary.js';
import { ADP, LADP } from './adaptive.js';
import { HR, FHR } from './hadamard.js';
import { BLH, OLH, LOLOHA } from './hashing.js';
import { DBitFlipPM } from './bitflip.js';
import { SS } from './subset.js';
import { SHE, THE } from './histogram.js';
import { makeNumeric } from './numeric.js';
import { CMS, HCMS } from './cms.js';
import { TreeHist } from './treehist.js';
import { LDPError } from './util.js';

const L = ['k', 'eps_inf', 'eps_1', 'calibration'];
const L_REQ = ['k', 'eps_inf', 'eps_1'];
const S = ['k', 'eps'];

/** name -> [class, accepted keywords, required keywords] (registration order of estimators.PROTOCOLS). */
export const PROTOCOLS = {
  GRR: [GRR, S, S],
  SUE: [SUE, S, S],
  OUE: [OUE, S, S],
  ADP: [ADP, S, S],
  'L-GRR': [LGRR, L, L_REQ],
  'L-SUE': [LSUE, L, L_REQ],
  'L-OUE': [LOUE, L, L_REQ],
  'L-OSUE': [LOSUE, L, L_REQ],
  'L-SOUE': [LSOUE, L, L_REQ],
  'L-ADP': [LADP, L, L_REQ],
  HR: [HR, S, S],
  FHR: [FHR, S, S],
  BLH: [BLH, S, S],
  OLH: [OLH, S, S],
  LOLOHA: [LOLOHA, ['k', 'eps_inf', 'eps_1', 'g', 'calibration'], L_REQ],
  dBitFlipPM: [DBitFlipPM, ['k', 'b', 'd', 'eps_inf'], ['k', 'b', 'd', 'eps_inf']],
  SS: [SS, ['k', 'eps', 'omega', 'layout'], S],
  SHE: [SHE, S, S],
  THE: [THE, ['k', 'eps', 'theta'], S],
};

const SKETCH = ['eps', 'm', 'k', 'seed'];

/**
 * name -> [class, accepted keywords, required keywords] of the open-domain protocols of a type = "string" / "u64"
 * attribute (estimators.sketch.OPEN_PROTOCOLS). A new protocol: its module (an OpenDomainProtocol) and one line here.
 */
export const OPEN_PROTOCOLS = {
  CMS: [CMS, SKETCH, SKETCH],
  HCMS: [HCMS, SKETCH, SKETCH],
  TreeHist: [TreeHist, ['eps', 'bits', 'step', 'start_bits', 'rows', 'oracle', 'k_prime', 'seed', 'eps_1', 'memo_slots'],
    ['eps']],
};

function construct(table, what, name, params) {
  const entry = Object.hasOwn(table, name) ? table[name] : null;
  if (!entry) throw new LDPError(`unknown ${what} '${name}'; known: ${Object.keys(table).join(', ')}`);
  const [Cls, accepted, required] = entry;
  const unknown = Object.keys(params).filter((p) => !accepted.includes(p)).sort();
  if (unknown.length) throw new LDPError(`${name} does not take ${unknown.join(', ')}; it takes ${accepted.join(', ')}`);
  const missing = required.filter((p) => params[p] === undefined);
  if (missing.length) throw new LDPError(`${name} needs ${missing.join(', ')}`);
  return new Cls(params);
}

/** Build an open-domain protocol: makeOpen("HCMS", {eps: 4.0, m: 256, k: 16, seed: valueId("crash")}). */
export function makeOpen(name, params = {}) {
  return construct(OPEN_PROTOCOLS, 'open-domain protocol', name, params);
}

/** The keyword parameters make(name) accepts. */
export function parameters(name) {
  const entry = PROTOCOLS[name];
  if (!entry) throw new LDPError(`unknown protocol '${name}'; known: ${Object.keys(PROTOCOLS).join(', ')}`);
  return entry[1];
}

/** Build a protocol: make("L-OSUE", {k: 100, eps_inf: 2.0, eps_1: 1.0}). */
export function make(name, params = {}) {
  const entry = PROTOCOLS[name];
  if (!entry) throw new LDPError(`unknown protocol '${name}'; known: ${Object.keys(PROTOCOLS).join(', ')}`);
  const [Cls, accepted, required] = entry;
  const unknown = Object.keys(params).filter((p) => !accepted.includes(p)).sort();
  if (unknown.length) throw new LDPError(`${name} does not take ${unknown.join(', ')}; it takes ${accepted.join(', ')}`);
  const missing = required.filter((p) => params[p] === undefined);
  if (missing.length) throw new LDPError(`${name} needs ${missing.join(', ')}`);
  return new Cls(params);
}

/** Inverse of proto.params() (a numeric mechanism's parameters name their `mechanism`; an open-domain protocol's
 * seed may be a BigInt). */
export function fromParams(params) {
  if (params.mechanism !== undefined && params.protocol === undefined) {
    const { mechanism, ...own } = params;
    return makeNumeric(mechanism, own);
  }
  const { protocol, chosen, ...rest } = params;
  if (Object.hasOwn(OPEN_PROTOCOLS, protocol)) return makeOpen(protocol, rest);
  return make(protocol, rest);
}
