// Campaigns given as JSON objects with the fields of the campaign TOML (wire/campaign.py), which converts 1:1:
//   python -c 'import json, sys, tomllib; print(json.dumps(tomllib.load(open(sys.argv[1], "rb"))))' campaign.toml
// {campaign: {id, time_step_seconds, ...}, attributes: [{name, k, protocol, <its parameters>, labels?}, ...,
//  {name, type: "numeric", range: [lo, hi], mechanism, eps, <the mechanism's parameters>}, ...],
//  {name, type: "string" | "u64", protocol: "CMS" | "HCMS" | "TreeHist", eps, m?, k?, ...its keywords, seed?, top?, candidates?, retention_steps?}, ...],
//  groups: [{name, attributes: [...], solution, <its parameters>}, ...]}
// JSON numbers are exact up to 2^53 only: give a u64 candidate or an explicit seed above it as a BigInt (or parse
// the JSON with a reviver that makes such integers BigInts); an unsafe Number is refused, never rounded.
import { make } from './registry.js';
import { makeSolution } from './multidim.js';
import { MECHANISMS, makeNumeric } from './numeric.js';
import { OPEN_PROTOCOLS, makeOpen } from './registry.js';
import { asU64, valueId } from './sketch.js';
import { LDPError, fingerprintOf } from './util.js';

export class CampaignError extends LDPError {
  constructor(message) {
    super(message);
    this.name = 'CampaignError';
  }
}

const NAME = /^[A-Za-z0-9_.-]{1,64}$/;
const CAMPAIGN_KEYS = new Set(['id', 'time_step_seconds', 'lateness_seconds', 'max_batch_reports', 'retention_steps',
  'max_steps_ahead', 'min_n', 'description']);  // min_n, retention_steps: server-side, accepted and unused
export const MIN_TIME_STEP_SECONDS = 1.0;
export const MAX_STEP = 2 ** 32 - 1;

/** One attribute: its protocol (an ungrouped attribute) or its group and index in the group's solution. */
export class Attribute {
  constructor(name, k, protocol, labels = [], group = null, index = null, valueType = 'categorical', top = 0,
    candidates = []) {
    Object.assign(this, { name, k, protocol, labels, group, index, valueType, top, candidates });
  }

  /** Whether values are open-domain strings or 64-bit integers (type = "string" or "u64"). */
  get openDomain() {
    return this.valueType === 'string' || this.valueType === 'u64';
  }

  /** An open-domain value's 64-bit id (a BigInt): a string for "string", an integer in [0, 2^64) for "u64" (a
   * BigInt, or a safe integer Number); CampaignError otherwise. */
  valueId(value) {
    if (this.valueType === 'u64') {
      if (asU64(value) === null) throw new CampaignError(`attribute '${this.name}' takes integers in [0, 2^64), got ${describe(value)}`);
    } else if (this.valueType === 'string') {
      if (typeof value !== 'string') throw new CampaignError(`attribute '${this.name}' takes strings, got ${describe(value)}`);
    } else {
      throw new CampaignError(`attribute '${this.name}' is not open-domain (${this.valueType})`);
    }
    return valueId(value);
  }

  label(v) {
    return this.labels.length ? this.labels[v] : String(v);
  }

  /** Whether the attribute is a numeric metric (type = "numeric"): a measurement of [lo, hi], not an index. */
  get numeric() {
    return this.protocol !== null && this.protocol.numeric === true;
  }
}

function describe(v) {
  if (typeof v === 'string') return JSON.stringify(v);
  if (typeof v === 'bigint') return `${v}n`;
  return String(v);
}

/** The kinds of attribute (`type`). */
export const ATTRIBUTE_TYPES = ['categorical', 'numeric', 'string', 'u64'];
/** The most items an open-domain attribute publishes per step, and the most candidates it lists. */
export const MAX_TOP = 1000;
export const MAX_CANDIDATES = 10000;

/**
 * A type = "string" or "u64" attribute (wire/campaign.py _open_attribute): an open-domain protocol and its
 * parameters (seed defaults to the id of the attribute's name), top (default 10) and candidates; no labels, no
 * group, defense "none" only.
 */
function openAttribute(name, kind, spec, labels, defense) {
  if (labels.length) throw new CampaignError(`attribute '${name}' is open-domain (${kind}): it has no labels (name values with candidates)`);
  if (defense !== 'none') {
    throw new CampaignError(`attribute '${name}' is open-domain: no report-level poisoning defense applies to a sketch; only defense = "none"`);
  }
  if ('range' in spec || 'mechanism' in spec) {
    throw new CampaignError(`attribute '${name}' is open-domain: it has a protocol, its parameters, top and candidates, not range or mechanism`);
  }
  const { protocol, top = 10, candidates = [], ...params } = spec;
  if (typeof protocol !== 'string' || !Object.hasOwn(OPEN_PROTOCOLS, protocol)) {
    throw new CampaignError(`attribute '${name}' needs an open-domain protocol, one of ${Object.keys(OPEN_PROTOCOLS).join(', ')}; got ${JSON.stringify(protocol) ?? String(protocol)}`);
  }
  if (typeof top !== 'number' || !Number.isInteger(top) || top < 1 || top > MAX_TOP) {
    throw new CampaignError(`attribute '${name}': top must be an integer in [1, ${MAX_TOP}], got ${describe(top)}`);
  }
  if (!Array.isArray(candidates) || candidates.length > MAX_CANDIDATES) {
    throw new CampaignError(`attribute '${name}': candidates must be a list of at most ${MAX_CANDIDATES} values`);
  }
  const seen = new Set();
  for (const c of candidates) {
    const ok = kind === 'string' ? typeof c === 'string' : asU64(c) !== null;
    if (!ok) {
      const unsafe = typeof c === 'number' && Number.isInteger(c) && c > 0 ? ' (above 2^53: give it as a BigInt)' : '';
      throw new CampaignError(`attribute '${name}': candidate ${describe(c)} is not a ${kind === 'string' ? 'string' : 'integer in [0, 2^64)'}${unsafe}`);
    }
    const key = kind === 'string' ? c : asU64(c);
    if (seen.has(key)) throw new CampaignError(`attribute '${name}': a candidate is listed twice`);
    seen.add(key);
  }
  if (params.seed === undefined) params.seed = valueId(name);
  let proto;
  try {
    proto = makeOpen(protocol, params);
  } catch (exc) {
    throw new CampaignError(`attribute '${name}': ${exc.message}`);
  }
  return new Attribute(name, proto.supportSize, proto, [], null, null, kind, top, candidates.slice());
}

/**
 * A type = "numeric" attribute (wire/campaign.py _numeric_attribute): range = [lo, hi], a mechanism and its
 * parameters instead of k and protocol; no labels, no group, defense "none" only.
 */
function numericAttribute(name, spec, labels, defense) {
  if (labels.length) throw new CampaignError(`attribute '${name}' is numeric: it has no labels`);
  if (defense !== 'none') {
    throw new CampaignError(`attribute '${name}' is numeric: no report-level poisoning defense applies to a mean (a clipped range bounds what one report can shift); only defense = "none"`);
  }
  for (const key of ['k', 'protocol']) {
    if (key in spec) throw new CampaignError(`attribute '${name}' is numeric: it has a range and a mechanism, not '${key}'`);
  }
  const { range, mechanism, ...params } = spec;
  if (!Array.isArray(range) || range.length !== 2 || !range.every((x) => typeof x === 'number')) {
    throw new CampaignError(`attribute '${name}' needs range = [lo, hi] (two numbers), got ${JSON.stringify(range)}`);
  }
  if (typeof mechanism !== 'string' || !Object.hasOwn(MECHANISMS, mechanism)) {
    throw new CampaignError(`attribute '${name}' needs a mechanism, one of ${Object.keys(MECHANISMS).join(', ')}; got ${JSON.stringify(mechanism)}`);
  }
  let proto;
  try {
    proto = makeNumeric(mechanism, { ...params, lo: range[0], hi: range[1] });
  } catch (exc) {
    throw new CampaignError(`attribute '${name}': ${exc.message}`);
  }
  return new Attribute(name, proto.k, proto);
}

export class Group {
  constructor(name, solution, attributes) {
    Object.assign(this, { name, solution, attributes });
  }
}

export class Campaign {
  constructor(id, attributes, groups, timeStepSeconds, source) {
    this.id = id;
    this.attributes = attributes; // Map name -> Attribute, in the file's order
    this.groups = groups; // Map name -> Group
    this.timeStepSeconds = timeStepSeconds;
    this.source = source;
  }

  /** Attributes reported by their own protocol (not by a group's solution), in the file's order. */
  get ungrouped() {
    return [...this.attributes.values()].filter((a) => a.group === null).map((a) => a.name);
  }

  attribute(name) {
    const a = this.attributes.get(name);
    if (!a) throw new CampaignError(`campaign '${this.id}' has no attribute '${name}'`);
    return a;
  }

  group(name) {
    const g = this.groups.get(name);
    if (!g) {
      const have = [...this.groups.keys()].map((x) => `'${x}'`).join(', ') || 'none';
      throw new CampaignError(`campaign '${this.id}' has no group '${name}' (groups: ${have})`);
    }
    return g;
  }

  /** The protocol whose reports an attribute sends: its own, or its group solution's channel. */
  reportProtocol(name) {
    const a = this.attribute(name);
    return a.group === null ? a.protocol : this.groups.get(a.group).solution.channels[a.index];
  }

  /** The fingerprint a compact body's section carries for an attribute (wire/campaign.py): its protocol's, or
   * for a group attribute its view of the group's solution (solution, attribute index, channel). */
  wireFingerprint(name) {
    const a = this.attribute(name);
    if (a.group === null) return a.protocol.fingerprint;
    const sol = this.groups.get(a.group).solution;
    const ch = sol.channels[a.index];
    return fingerprintOf({ protocol: `${sol.name}/${ch.name}`, solution: sol.params(), attribute: a.index,
      channel: ch.params() });
  }

  /** floor(unix_time / time_step_seconds): the step a device stamps on a report. */
  stepAt(nowSeconds = Date.now() / 1000) {
    return Math.floor(nowSeconds / this.timeStepSeconds);
  }

  /** A campaign from its parsed JSON (the TOML's fields); CampaignError if it cannot be used. */
  static fromJSON(data) {
    if (typeof data === 'string') data = JSON.parse(data);
    const head = data?.campaign;
    if (!head || typeof head !== 'object' || Array.isArray(head)) throw new CampaignError('a campaign needs a campaign table');
    const unknown = Object.keys(head).filter((k) => !CAMPAIGN_KEYS.has(k)).sort();
    if (unknown.length) throw new CampaignError(`unknown [campaign] keys: ${unknown.join(', ')}`);
    const cid = head.id;
    if (typeof cid !== 'string' || !NAME.test(cid)) throw new CampaignError(`campaign id must match ${NAME.source}, got ${JSON.stringify(cid)}`);
    const step = Number(head.time_step_seconds ?? 10.0);
    if (!(step >= MIN_TIME_STEP_SECONDS)) throw new CampaignError(`time_step_seconds must be >= ${MIN_TIME_STEP_SECONDS}, got ${step}`);
    const raw = data.attributes;
    if (!Array.isArray(raw) || !raw.length) throw new CampaignError('a campaign needs at least one [[attributes]] entry');
    const groupsRaw = data.groups ?? [];
    if (!Array.isArray(groupsRaw)) throw new CampaignError('groups must be an array of tables ([[groups]])');
    const memberOf = new Map();
    for (const g of groupsRaw) {
      const gname = g?.name;
      if (typeof gname !== 'string' || !NAME.test(gname)) throw new CampaignError(`group name must match ${NAME.source}, got ${JSON.stringify(gname)}`);
      const members = g.attributes;
      if (!Array.isArray(members) || members.length < 2 || !members.every((m) => typeof m === 'string')) {
        throw new CampaignError(`group '${gname}' needs a list of at least 2 attribute names`);
      }
      for (const m of members) {
        if (memberOf.has(m)) throw new CampaignError(`attribute '${m}' is in groups '${memberOf.get(m)}' and '${gname}': its budget would be spent twice`);
        memberOf.set(m, gname);
      }
    }
    const attrs = new Map();
    const ks = new Map();
    const labelsOf = new Map();
    for (const entry of raw) {
      const { name, labels: rawLabels = [], defense = 'none', type: kind = 'categorical', protocol, retention_steps: keep,
        ...params } = entry ?? {};
      // an attribute's own retention_steps: server-side (the steps kept of it), validated as the reference, unused
      if (keep !== undefined && keep !== null && !(typeof keep === 'number' && Number.isInteger(keep) && keep >= 1)) {
        throw new CampaignError(`attribute '${name}': retention_steps must be an integer >= 1 (the final steps kept of it), got ${String(keep)}`);
      }
      if (typeof name !== 'string' || !NAME.test(name)) throw new CampaignError(`attribute name must match ${NAME.source}, got ${JSON.stringify(name)}`);
      if (attrs.has(name) || ks.has(name)) throw new CampaignError(`attribute '${name}' is declared twice`);
      const labels = rawLabels.map(String);
      if (!ATTRIBUTE_TYPES.includes(kind)) throw new CampaignError(`attribute '${name}': type must be one of ${ATTRIBUTE_TYPES.join(', ')}, got ${JSON.stringify(kind)}`);
      if (kind === 'numeric') {
        if (memberOf.has(name)) throw new CampaignError(`attribute '${name}' is numeric: it cannot belong to group '${memberOf.get(name)}' (a group's solution reports categorical values)`);
        attrs.set(name, numericAttribute(name, protocol === undefined ? params : { ...params, protocol }, labels, defense));
        continue;
      }
      if (kind === 'string' || kind === 'u64') {
        if (memberOf.has(name)) throw new CampaignError(`attribute '${name}' is open-domain: it cannot belong to group '${memberOf.get(name)}' (a group's solution reports categorical values)`);
        attrs.set(name, openAttribute(name, kind, protocol === undefined ? params : { ...params, protocol }, labels, defense));
        continue;
      }
      if (memberOf.has(name)) {
        const extra = Object.keys(params).filter((k) => k !== 'k');
        if (protocol !== undefined) extra.push('protocol');
        if (extra.length) {
          throw new CampaignError(`attribute '${name}' belongs to group '${memberOf.get(name)}', whose solution spends one budget over the group: remove its own ${extra.sort().join(', ')} (a budget spent twice)`);
        }
        if (defense !== 'none') throw new CampaignError(`attribute '${name}' belongs to a group: only defense = "none"`);
        const k = params.k;
        if (typeof k !== 'number' || !Number.isInteger(k) || k < 2) throw new CampaignError(`attribute '${name}' needs an integer domain size k >= 2, got ${JSON.stringify(k)}`);
        ks.set(name, k);
        labelsOf.set(name, labels);
        continue;
      }
      if (typeof protocol !== 'string') throw new CampaignError(`attribute '${name}' needs a protocol`);
      let proto;
      try {
        proto = make(protocol, params);
      } catch (exc) {
        throw new CampaignError(`attribute '${name}': ${exc.message}`);
      }
      if (labels.length && labels.length !== proto.domainSize) {
        throw new CampaignError(`attribute '${name}' has ${labels.length} labels for a domain of ${proto.domainSize}`);
      }
      attrs.set(name, new Attribute(name, proto.k, proto, labels));
    }
    const groups = new Map();
    for (const g of groupsRaw) {
      const { name: gname, attributes: members, solution, ...spec } = g;
      if (groups.has(gname)) throw new CampaignError(`group '${gname}' is declared twice`);
      const missing = members.filter((m) => !ks.has(m));
      if (missing.length) throw new CampaignError(`group '${gname}' names undeclared attributes: ${missing.join(', ')}`);
      if (typeof solution !== 'string') throw new CampaignError(`group '${gname}' needs a solution`);
      let sol;
      try {
        sol = makeSolution({ solution, ks: members.map((m) => ks.get(m)), ...spec });
      } catch (exc) {
        throw new CampaignError(`group '${gname}': ${exc.message}`);
      }
      if (sol.layout === 'fake' && !('amplification' in spec)) {
        throw new CampaignError(`group '${gname}': ${solution} with fake data must state its amplification ("paper" or "none")`);
      }
      groups.set(gname, new Group(gname, sol, members.slice()));
      members.forEach((m, j) => {
        const ch = sol.channels[j];
        if (labelsOf.get(m).length && labelsOf.get(m).length !== ch.domainSize) {
          throw new CampaignError(`attribute '${m}' has ${labelsOf.get(m).length} labels for a domain of ${ch.domainSize}`);
        }
        attrs.set(m, new Attribute(m, ks.get(m), null, labelsOf.get(m), gname, j));
      });
    }
    const ordered = new Map(raw.map((e) => [e.name, attrs.get(e.name)]));
    return new Campaign(cid, ordered, groups, step, data);
  }
}
