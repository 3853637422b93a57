// The device ledger (producers/sdk.py, Device): one device's memo states and lifetime privacy budget.
//
// Reserved loss (schedule only): each report of a memoizing attribute reserves one more memo slot while the
// attribute has fewer than memo_size slots and the reservation fits the budget; memoryless reports spend
// eps_first each; a group step reserves its solution's worst case after one more step. Actual loss (values):
// longitudinal_loss(memoized count). privacy_loss <= reserved_loss <= budget at all times.
// Freezing: a memoizing attribute whose new value cannot be memoized randomizes the value it last reported
// (memoized) instead. Refusals (BudgetExceeded, nothing randomized, saved or sent) only on the reserved loss:
// a memoryless report that does not fit, the first report of a memoizing attribute whose first slot does not
// fit, a group step that does not fit. A budget that cannot memoize one value of some memoizing attribute is
// refused at construction.
//
// State lives in a Storage (get/set of strings): device.json (campaign id, a fingerprint per scope),
// budget.json (the ledger), <attribute>.memo.json (memo key + memoized cells), <group>.group.json (the group's
// solution state). Writes follow the Python order, so a crash can only over-count the reserved loss.
import { bytesToHex, cryptoKeys, hexToBytes } from './chacha.js';
import { MemoState } from './protocol.js';
import { MultiState } from './multidim.js';
import { LDPError, formatG, sha256Hex } from './util.js';

export const TOL = 1e-9;
const DEVICE_FORMAT = 'ldp-stream/device';
const LEDGER = ['spent_reports', 'memo_slots', 'last_values', 'group_reports'];

/** The report would push the device's reserved loss over its budget; nothing was memoized, saved or sent. */
export class BudgetExceeded extends LDPError {
  constructor(attribute, spent, cost, budget, detail = null) {
    const msg = `privacy budget exceeded: reporting '${attribute}' would raise the device's reserved longitudinal loss from ${formatG(spent, 4)} to ${formatG(spent + cost, 4)} > budget ${formatG(budget, 4)}; nothing was memoized or sent`;
    super(detail === null ? msg : `${msg} (${detail})`);
    this.name = 'BudgetExceeded';
    Object.assign(this, { attribute, spent, cost, budget });
  }
}

/** A memoizing attribute met a new value while its memo table is full (TreeHist: memo_slots / 64 tags): the loss of
 * a new memoized value could not be accounted, so the value is refused; nothing was memoized or sent. */
export class MemoTableFull extends LDPError {
  constructor(attribute, capacity) {
    super(`the memo table of '${attribute}' is full: it holds ${capacity} distinct memoized values and a new one `
      + 'could not be accounted for, so it is refused (nothing was memoized or sent; values already memoized still '
      + 'report; a campaign with a larger memo_slots, or a reset accepting the privacy loss, makes room)');
    this.name = 'MemoTableFull';
    this.attribute = attribute;
    this.capacity = capacity;
  }
}

/** Device state that does not belong to this campaign, is missing or cannot be read: the device refuses. */
export class DeviceStateError extends LDPError {
  constructor(message) {
    super(message);
    this.name = 'DeviceStateError';
  }
}

const L = (proto, m) => proto.longitudinalLoss(m);

/** What a lifetime budget allows on the campaign's attributes, and why (producers.sdk.budget_plan, same text). */
export function budgetPlan(campaign, budgetEps) {
  if (budgetEps === null || budgetEps === undefined) return 'no lifetime budget: every memoizing attribute memoizes up to its memo_size values';
  const lines = [`lifetime budget ε = ${formatG(budgetEps)}:`];
  const memoizing = [];
  for (const name of campaign.ungrouped) {
    const proto = campaign.attribute(name).protocol;
    if (!proto.memoSize) {
      lines.push(`  ${name} (${proto.name}, memoryless): every report spends ε1 = ${formatG(proto.epsFirst, 4)}`);
      continue;
    }
    memoizing.push([name, proto]);
    const first = L(proto, 1);
    let alone = 0;
    for (let m = 1; m <= proto.memoSize; m++) if (L(proto, m) <= budgetEps + TOL) alone = m;
    const more = proto.memoSize > 1 ? L(proto, 2) - first : 0.0;
    lines.push(`  ${name} (${proto.name}): its first memoized value reserves ${formatG(first, 4)}, each further one ${formatG(more, 4)}; alone in the budget it could memoize ${alone} of its ${proto.memoSize} possible inputs`);
  }
  for (const g of campaign.groups.values()) {
    lines.push(`  group ${g.name} (${g.solution.name}): every group step reserves its solution's worst-case loss`);
  }
  if (memoizing.length) {
    const slots = new Map(memoizing.map(([n]) => [n, 0]));
    const protos = new Map(memoizing);
    let reserved = 0.0;
    let open = memoizing.map(([n]) => n);
    while (open.length) {
      for (const name of [...open]) {
        const p = protos.get(name);
        const m = slots.get(name);
        const cost = m < p.memoSize ? L(p, m + 1) - L(p, m) : Infinity;
        if (reserved + cost > budgetEps + TOL) {
          open = open.filter((x) => x !== name);
          continue;
        }
        reserved += cost;
        slots.set(name, m + 1);
      }
    }
    const total = [...slots.values()].reduce((a, b) => a + b, 0);
    lines.push(`  reporting in turn, the memoizing attributes memoize ${[...slots].map(([n, s]) => `${n} ${s}`).join(', ')} value(s) (${total} reports reserve ${formatG(reserved, 4)}); every report of a memoizing attribute reserves a slot whether or not its value changed, and an attribute whose slots are used freezes on its last value (reports go on)`);
  }
  return lines.join('\n');
}

function keyId(st, withSampled = false) {
  const parts = [];
  if (st instanceof MemoState) parts.push(st.key);
  else {
    for (const m of st.memos) parts.push(m === null ? new TextEncoder().encode('-') : m.key);
    for (const arr of [st.fake, withSampled ? st.sampled : null]) {
      parts.push(new TextEncoder().encode(arr === null ? '-' : JSON.stringify(arr)));
    }
  }
  const all = new Uint8Array(parts.reduce((a, p) => a + p.length, 0));
  let o = 0;
  for (const p of parts) { all.set(p, o); o += p.length; }
  return sha256Hex(all).slice(0, 32);
}

const copyMap = (m) => ({ ...m });

/**
 * One device's ledger over a campaign. `storage`: {get(name) -> string | null, set(name, value)}; `keys`: the
 * key source (default: the platform CSPRNG; anything else is simulation, never on a real device).
 */
export class Ledger {
  constructor(campaign, storage, { budgetEps = null, keys = cryptoKeys } = {}) {
    if (budgetEps !== null && !(budgetEps >= 0)) throw new RangeError(`budgetEps must be >= 0 or null, got ${budgetEps}`);
    if (budgetEps !== null) {
      for (const name of campaign.ungrouped) {
        const proto = campaign.attribute(name).protocol;
        const first = proto.memoSize ? L(proto, 1) : 0.0;
        if (first > budgetEps + TOL) {
          throw new RangeError(`budget_eps=${formatG(budgetEps, 4)} cannot memoize a single value of '${name}' (${proto.name}, one memoized value costs ${formatG(first, 4)}): the budget must allow at least one memoized value of every memoizing attribute`);
        }
      }
    }
    this.campaign = campaign;
    this.storage = storage;
    this.budgetEps = budgetEps === null ? null : Number(budgetEps);
    this.keys = keys;
    this.budgetPlan = budgetPlan(campaign, this.budgetEps);
    this.states = {}; // memoizing attribute -> MemoState (null: memoryless or broken)
    this.spentReports = {};
    this.memoSlots = {};
    this.lastValues = {};
    this.groupStates = {};
    this.groupReports = {};
    this.keyed = {};
    this.retired = {};
    this.recorded = {};
    this.fingerprints = {};
    this.clippedCounts = {}; // numeric attribute -> values clipped to its range by this object (never stored or sent)
    this.broken = {};
    this.changedScopes = new Set();
    this.storage.lock?.();
    try {
      this.checkOrWriteIdentity();
      this.load();
    } catch (exc) {
      this.storage.unlock?.();
      throw exc;
    }
  }

  close() {
    this.storage.unlock?.();
  }

  // ------------------------------------------------------------------ state files
  memoName(attribute) { return `${attribute}.memo.json`; }
  groupName(group) { return `${group}.group.json`; }

  scopes() {
    const out = {};
    for (const n of this.campaign.ungrouped) out[`a:${n}`] = this.campaign.attribute(n).protocol.fingerprint;
    for (const g of this.campaign.groups.values()) out[`g:${g.name}`] = g.solution.fingerprint;
    return out;
  }

  writeIdentity(fingerprints) {
    const sorted = Object.fromEntries(Object.entries(fingerprints).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)));
    this.storage.set('device.json', JSON.stringify({ format: DEVICE_FORMAT, campaign: this.campaign.id, ledger: true, fingerprints: sorted }));
    this.fingerprints = { ...fingerprints };
  }

  readJson(name, what) {
    const text = this.storage.get(name);
    if (text === null || text === undefined) return null;
    try {
      const obj = JSON.parse(text);
      if (!obj || typeof obj !== 'object' || Array.isArray(obj)) throw new Error('not a JSON object');
      return obj;
    } catch (exc) {
      throw new DeviceStateError(`cannot read ${name} (${what}): ${exc.message}; the device refuses to report`);
    }
  }

  checkOrWriteIdentity() {
    const ident = this.readJson('device.json', 'the device identity');
    if (ident === null) {
      const ledger = this.readJson('budget.json', 'the privacy ledger');
      const used = ledger !== null && [...LEDGER, 'keyed', 'retired'].some((k) => ledger[k] && Object.keys(ledger[k]).length);
      const stateFiles = [...this.campaign.ungrouped.map((n) => this.memoName(n)), ...[...this.campaign.groups.keys()].map((g) => this.groupName(g))]
        .filter((n) => this.storage.get(n) !== null);
      if (used || stateFiles.length) {
        throw new DeviceStateError(`device.json is missing but the storage holds device state (${stateFiles.join(', ') || 'budget.json'}): the device cannot check which attributes it belongs to and refuses to report (a new device: a new storage and a new token)`);
      }
      if (ledger === null) this.storage.set('budget.json', JSON.stringify(this.ledgerData()));
      this.writeIdentity(this.scopes());
      return;
    }
    if (ident.campaign !== this.campaign.id) {
      throw new DeviceStateError(`the storage holds the state of campaign '${ident.campaign}', not '${this.campaign.id}'; a device must keep its memo state for the campaign's lifetime, use another storage`);
    }
    if (!ident.fingerprints || typeof ident.fingerprints !== 'object') throw new DeviceStateError('device.json has no per-attribute fingerprints');
    this.fingerprints = Object.fromEntries(Object.entries(ident.fingerprints).map(([k, v]) => [String(k), String(v)]));
    if (this.storage.get('budget.json') === null) {
      throw new DeviceStateError('budget.json (the privacy ledger) is missing while device.json says it exists: the loss this device has spent is unknown, so it refuses to report (a new device: a new storage and a new token)');
    }
  }

  load() {
    const raw = this.readJson('budget.json', 'the privacy ledger') ?? {};
    try {
      for (const key of LEDGER) {
        const part = raw[key] ?? {};
        const out = {};
        for (const [k, v] of Object.entries(part)) {
          // a numeric attribute's last value is a measurement (any finite number); every other entry an integer
          const numericLast = key === 'last_values' && this.campaign.attributes.get(k)?.numeric;
          // a memoizing open-domain attribute's last value: the hex of its memoized report (never the value)
          const openLast = key === 'last_values' && this.campaign.attributes.get(k)?.openDomain;
          if (openLast) {
            if (typeof v !== 'string' || !/^([0-9a-f]{2})+$/.test(v)) throw new Error(`${key}.${k} is not the hex of a report`);
          } else if (numericLast ? !(typeof v === 'number' && Number.isFinite(v)) : !Number.isInteger(v)) {
            throw new Error(`${key}.${k} is not ${numericLast ? 'a finite number' : 'an integer'}`);
          }
          out[k] = v;
        }
        this[{ spent_reports: 'spentReports', memo_slots: 'memoSlots', last_values: 'lastValues', group_reports: 'groupReports' }[key]] = out;
      }
      this.keyed = Object.fromEntries(Object.entries(raw.keyed ?? {}).map(([k, v]) => [k, String(v)]));
      this.retired = Object.fromEntries(Object.entries(raw.retired ?? {}).map(([k, v]) => [k, Number(v)]));
      this.recorded = Object.fromEntries(Object.entries(raw.recorded ?? {}).map(([k, v]) => [k, Number(v)]));
    } catch (exc) {
      throw new DeviceStateError(`cannot read budget.json (the privacy ledger): ${exc.message}; the device refuses to report (the loss it has spent is unknown)`);
    }
    const scopes = this.scopes();
    const fresh = Object.fromEntries(Object.entries(scopes).filter(([s]) => !(s in this.fingerprints)));
    if (Object.keys(fresh).length) this.writeIdentity({ ...this.fingerprints, ...fresh });
    for (const name of this.campaign.ungrouped) {
      this.states[name] = this.loadOrCreate(name, this.campaign.attribute(name).protocol);
    }
    for (const g of this.campaign.groups.values()) {
      const st = this.loadOrCreateGroup(g);
      if (st !== null) this.groupStates[g.name] = st;
    }
  }

  used(scope) {
    const [kind, name] = [scope.slice(0, 1), scope.slice(2)];
    if (scope in this.keyed) return true;
    if (kind === 'a') return (this.spentReports[name] ?? 0) > 0 || (this.memoSlots[name] ?? 0) > 0;
    return (this.groupReports[name] ?? 0) > 0;
  }

  checkFingerprint(scope, fingerprint) {
    delete this.broken[scope];
    this.changedScopes.delete(scope);
    if (this.fingerprints[scope] === fingerprint) return true;
    if (!this.used(scope)) {
      this.writeIdentity({ ...this.fingerprints, [scope]: fingerprint });
      return true;
    }
    const [kind, name] = [scope.slice(0, 1), scope.slice(2)];
    const what = kind === 'a' ? 'attribute' : 'group';
    this.changedScopes.add(scope);
    this.broken[scope] = `${what} '${name}' changed (protocol, domain or ε: fingerprint ${this.fingerprints[scope]} in device.json, ${fingerprint} in the campaign): it is a new ${what} with new keys, refused until reset('${name}'${kind === 'g' ? ', {group: true' : ', {'} acceptPrivacyLoss: true}) starts it anew; its ε is then counted in the lifetime budget and the ${formatG(this.recorded[scope] ?? 0.0, 4)} the old one spent stays in the ledger`;
    return false;
  }

  brokenFile(scope, file, problem) {
    const [kind, name] = [scope.slice(0, 1), scope.slice(2)];
    this.broken[scope] = `${file} ${problem}, but the ledger shows this ${kind === 'a' ? 'attribute' : 'group'} has reported with it: reporting with a new state would re-randomize memoized values (an averaging attack) without counting the loss, so nothing is sent. Restore it, or call reset('${name}', {${kind === 'g' ? 'group: true, ' : ''}acceptPrivacyLoss: true})`;
  }

  loadOrCreate(name, proto) {
    const scope = `a:${name}`;
    if (!this.checkFingerprint(scope, proto.fingerprint) || proto.memoSize === 0) return null;
    const file = this.memoName(name);
    const text = this.storage.get(file);
    let st = null;
    if (text !== null && text !== undefined) {
      try {
        st = MemoState.fromJSON(JSON.parse(text));
        if (st.fingerprint !== proto.fingerprint || st.memoSize !== proto.memoSize) {
          throw new Error(`it belongs to protocol ${st.fingerprint}, not ${proto.fingerprint}`);
        }
      } catch (exc) {
        if (scope in this.keyed || this.used(scope)) {
          this.brokenFile(scope, file, `cannot be used (${exc.message})`);
          return null;
        }
        st = null; // never reported with: nothing was sent under that key, a fresh one is as good
      }
    }
    if (st === null) {
      if (scope in this.keyed) {
        this.brokenFile(scope, file, 'is missing');
        return null;
      }
      st = proto.newState(this.keys); // the secret key from the CSPRNG; recorded in the ledger at its first report
      this.saveMemo(name, st);
      return st;
    }
    if (scope in this.keyed && this.keyed[scope] !== keyId(st)) {
      this.brokenFile(scope, file, 'holds another key than the one the ledger recorded');
      return null;
    }
    return st;
  }

  saveMemo(name, st) {
    this.storage.set(this.memoName(name), JSON.stringify(st.toJSON()));
  }

  loadOrCreateGroup(group) {
    const scope = `g:${group.name}`;
    delete this.groupStates[group.name];
    if (!this.checkFingerprint(scope, group.solution.fingerprint)) return null;
    const file = this.groupName(group.name);
    const text = this.storage.get(file);
    if (text === null || text === undefined) {
      if (scope in this.keyed) {
        this.brokenFile(scope, file, 'is missing');
        return null;
      }
      const st = group.solution.newState(this.keys);
      this.storage.set(file, JSON.stringify(st.toJSON()));
      return st;
    }
    let st;
    try {
      st = MultiState.fromJSON(JSON.parse(text));
      group.solution.checkState(st);
    } catch (exc) {
      if (!this.used(scope)) {
        st = group.solution.newState(this.keys);
        this.storage.set(file, JSON.stringify(st.toJSON()));
        return st;
      }
      this.brokenFile(scope, file, `cannot be used (${exc.message})`);
      return null;
    }
    if (scope in this.keyed && this.keyed[scope] !== this.groupKeyId(group.name, st)) {
      this.brokenFile(scope, file, 'holds other keys or another sampled attribute than the ledger recorded');
      return null;
    }
    return st;
  }

  groupKeyId(group, st) {
    return keyId(st, this.campaign.group(group).solution.sampling === 'fixed');
  }

  usable(scope) {
    if (scope in this.broken) throw new DeviceStateError(this.broken[scope]);
  }

  ledgerData() {
    return { campaign: this.campaign.id, spent_reports: this.spentReports, memo_slots: this.memoSlots,
      last_values: this.lastValues, group_reports: this.groupReports, keyed: this.keyed, retired: this.retired,
      recorded: this.recorded };
  }

  /** Write the ledger (the parts not given are kept); each scope's reserved loss is recorded too. */
  saveBudget({ spent, slots, last, groups, keyed, retired } = {}) {
    const old = JSON.stringify(this.ledgerData());
    if (spent !== undefined) this.spentReports = copyMap(spent);
    if (slots !== undefined) this.memoSlots = copyMap(slots);
    if (last !== undefined) this.lastValues = copyMap(last);
    if (groups !== undefined) this.groupReports = copyMap(groups);
    if (keyed !== undefined) this.keyed = copyMap(keyed);
    if (retired !== undefined) this.retired = copyMap(retired);
    const rec = { ...this.recorded };
    for (const scope of Object.keys(this.scopes())) {
      if (!this.changedScopes.has(scope)) {
        const name = scope.slice(2);
        rec[scope] = scope.startsWith('a:') ? this.attrReserved(name) : this.groupReserved(name);
      }
    }
    this.recorded = rec;
    const data = JSON.stringify(this.ledgerData());
    if (data !== old || this.storage.get('budget.json') === null) this.storage.set('budget.json', data);
  }

  // ------------------------------------------------------------------ accounting
  own(attribute) {
    const attr = this.campaign.attribute(attribute);
    if (attr.group !== null) {
      const sol = this.campaign.group(attr.group).solution;
      throw new LDPError(`attribute '${attribute}' is randomized with the other attributes of group '${attr.group}' (${sol.name}, one budget over the group): use reportGroup('${attr.group}', values) or sendGroup`);
    }
    return attr.protocol;
  }

  groupSteps(group) {
    const st = this.groupStates[group];
    const ledger = this.groupReports[group] ?? 0;
    if (!st) return ledger;
    return Math.max(ledger, st.reported.length ? Math.max(...st.reported) : 0);
  }

  groupBound(group, steps) {
    const sol = this.campaign.group(group).solution;
    if (steps <= 0) return 0.0;
    if (sol.longitudinal) return sol.lossBound(steps);
    return steps * sol.epsFirst;
  }

  groupReserved(group) {
    return this.versionReserved(`g:${group}`) + (this.retired[`g:${group}`] ?? 0.0);
  }

  versionReserved(scope) {
    const [kind, name] = [scope.slice(0, 1), scope.slice(2)];
    if (this.changedScopes.has(scope)) return (this.recorded[scope] ?? 0.0) - (this.retired[scope] ?? 0.0);
    if (kind === 'g') return this.groupBound(name, this.groupSteps(name));
    const proto = this.campaign.attribute(name).protocol;
    if (proto.memoSize === 0) return (this.spentReports[name] ?? 0) * proto.epsFirst;
    return L(proto, this.slots(name));
  }

  groupLoss(group) {
    const sol = this.campaign.group(group).solution;
    const st = this.groupStates[group];
    if (sol.longitudinal && st && !(`g:${group}` in this.broken)) {
      return sol.longitudinalLoss(st) + (this.retired[`g:${group}`] ?? 0.0);
    }
    return this.groupReserved(group);
  }

  attrLoss(name) {
    const proto = this.campaign.attribute(name).protocol;
    const st = this.states[name];
    if (`a:${name}` in this.broken) return this.attrReserved(name);
    const retired = this.retired[`a:${name}`] ?? 0.0;
    if (!st) return (this.spentReports[name] ?? 0) * proto.epsFirst + retired;
    return L(proto, proto.memoizedCount(st)) + retired;
  }

  slots(name) {
    const st = this.states[name];
    const s = this.memoSlots[name] ?? 0;
    if (!st) return s;
    const count = this.campaign.attribute(name).protocol.memoizedCount(st); // Infinity: no tag table (refused)
    return count === Infinity ? s : Math.max(s, count);
  }

  attrReserved(name) {
    return this.versionReserved(`a:${name}`) + (this.retired[`a:${name}`] ?? 0.0);
  }

  goneLoss() {
    const scopes = this.scopes();
    let total = 0;
    for (const [k, v] of Object.entries(this.recorded)) if (!(k in scopes)) total += v;
    return total;
  }

  reserved(attribute = null, group = null) {
    if (attribute !== null) return this.attrReserved(attribute);
    if (group !== null) return this.groupReserved(group);
    let a = 0;
    for (const n of this.campaign.ungrouped) a += this.attrReserved(n);
    let g = 0;
    for (const n of this.campaign.groups.keys()) g += this.groupReserved(n);
    return a + g + this.goneLoss();
  }

  loss(attribute = null, group = null) {
    if (attribute !== null) return this.attrLoss(attribute);
    if (group !== null) return this.groupLoss(group);
    let a = 0;
    for (const n of this.campaign.ungrouped) a += this.attrLoss(n);
    let g = 0;
    for (const n of this.campaign.groups.keys()) g += this.groupLoss(n);
    return a + g + this.goneLoss();
  }

  fits(spent, cost) {
    return this.budgetEps === null || spent + cost <= this.budgetEps + TOL;
  }

  slotCost(name, slots) {
    const proto = this.campaign.attribute(name).protocol;
    if (slots >= proto.memoSize) return null;
    return L(proto, slots + 1) - L(proto, slots);
  }

  checkScope(attribute, group) {
    if (attribute !== null && group !== null) throw new LDPError('give an attribute or a group, not both');
    if (attribute !== null) this.own(attribute);
    if (group !== null) this.campaign.group(group);
  }

  /** Longitudinal epsilon actually spent: one attribute, one group ({group}) or the whole device. */
  privacyLoss(attribute = null, { group = null } = {}) {
    this.checkScope(attribute, group);
    return this.loss(attribute, group);
  }

  /** Longitudinal epsilon reserved (>= privacyLoss, <= budget), scoped as privacyLoss. */
  reservedLoss(attribute = null, { group = null } = {}) {
    this.checkScope(attribute, group);
    return this.reserved(attribute, group);
  }

  remainingBudget() {
    return this.budgetEps === null ? Infinity : this.budgetEps - this.reservedLoss();
  }

  memoizedCount(attribute) {
    this.own(attribute);
    this.usable(`a:${attribute}`);
    const st = this.states[attribute];
    return st ? this.campaign.attribute(attribute).protocol.memoizedCount(st) : 0;
  }

  /** The value the last report of a memoizing attribute randomized (what it freezes on), or null. */
  lastValue(attribute) {
    this.own(attribute);
    return this.lastValues[attribute] ?? null;
  }

  /** True if the next report of a value the attribute has not memoized would be frozen (local knowledge). */
  frozen(attribute) {
    this.own(attribute);
    this.usable(`a:${attribute}`);
    const st = this.states[attribute];
    if (!st) return false;
    const proto = this.campaign.attribute(attribute).protocol;
    const count = proto.memoizedCount(st);
    const slots = this.slots(attribute);
    if (count >= proto.memoSize) return false;
    const grow = this.slotCost(attribute, slots);
    if (count >= slots && (grow === null || !this.fits(this.reserved(), grow))) return true;
    const newCost = L(proto, count + 1) - L(proto, count);
    return !this.fits(this.loss(), newCost);
  }

  groupStepsReserved(group) {
    this.campaign.group(group);
    return this.groupSteps(group);
  }

  /** A numeric attribute's measurement: a finite number (outside the range it is clipped when randomized). */
  numericValue(attribute, value) {
    if (typeof value !== 'number') {
      throw new LDPError(`value ${typeof value === 'string' ? JSON.stringify(value) : String(value)} of numeric attribute '${attribute}' must be a number`);
    }
    if (!Number.isFinite(value)) throw new LDPError(`value ${value} of numeric attribute '${attribute}' is not a finite number`);
    return value;
  }

  /** How many values of numeric `attribute` this object clipped to the range before randomizing them (kept on the
   * device: the server never learns which reports were clipped). */
  clipped(attribute) {
    this.campaign.attribute(attribute);
    return this.clippedCounts[attribute] ?? 0;
  }

  /** An open-domain attribute's value as its 64-bit id (a BigInt): a string (type = "string", the first 8 bytes of its
   * SHA-256) or an integer in [0, 2^64) (type = "u64": a BigInt or a safe integer Number, itself); LDPError otherwise. */
  valueId(attribute, value) {
    const a = this.campaign.attribute(attribute);
    if (!a.openDomain) throw new LDPError(`attribute '${attribute}' is not open-domain (type '${a.valueType}')`);
    return a.valueId(value);
  }

  /** One value as the protocol's input: a domain index (categorical), a measurement (numeric, clipping counted) or
   * a 64-bit value id (open-domain: hashed here, the raw value goes no further). */
  inputValue(attribute, value) {
    const a = this.campaign.attribute(attribute);
    if (a.openDomain) return this.valueId(attribute, value);
    if (!a.numeric) return this.valueIndex(attribute, value);
    const v = this.numericValue(attribute, value);
    if (a.protocol.clipped(v)) this.clippedCounts[attribute] = (this.clippedCounts[attribute] ?? 0) + 1;
    return v;
  }

  /** The domain index of `value`: an index in [0, k) or one of the attribute's labels. */
  valueIndex(attribute, value) {
    const a = this.campaign.attribute(attribute);
    if (a.numeric) throw new LDPError(`attribute '${attribute}' is numeric: its values are measurements (numbers), not domain indices`);
    if (a.openDomain) throw new LDPError(`attribute '${attribute}' is open-domain (${a.valueType}): its values have no domain index (report the value itself)`);
    if (typeof value === 'string') {
      const i = a.labels.indexOf(value);
      if (i >= 0) return i;
      if (!a.labels.length) throw new LDPError(`attribute '${attribute}' has no labels in campaign '${this.campaign.id}': send an index in [0, ${a.k}), not '${value}'`);
      const shown = a.labels.slice(0, 8).map((l) => `'${l}'`).join(', ') + (a.labels.length > 8 ? ', ...' : '');
      throw new LDPError(`'${value}' is not a label of '${attribute}' (labels: ${shown})`);
    }
    if (typeof value !== 'number' || !Number.isInteger(value)) throw new LDPError(`value ${JSON.stringify(value)} of '${attribute}' must be an index or a label`);
    if (value < 0 || value >= a.k) throw new LDPError(`value ${value} of '${attribute}' is outside the domain [0, ${a.k})`);
    return value;
  }

  // ------------------------------------------------------------------ randomizing
  /** Randomize one value (report bytes; a numeric attribute's: a measurement, clipped to its range; an open-domain
   * attribute's: a string or a u64, hashed here), enforcing and recording the budget (may freeze; BudgetExceeded). */
  randomize(attribute, value) {
    const proto = this.own(attribute);
    const v = this.inputValue(attribute, value);
    this.usable(`a:${attribute}`);
    const st = this.states[attribute];
    const reserved = this.reserved();
    if (!st) {
      const cost = proto.epsFirst;
      if (!this.fits(reserved, cost)) throw new BudgetExceeded(attribute, reserved, cost, this.budgetEps ?? 0.0);
      const report = proto.randomize(v, { keys: this.keys });
      // spend first: a crash may over-count, never under-count
      this.saveBudget({ spent: { ...this.spentReports, [attribute]: (this.spentReports[attribute] ?? 0) + 1 } });
      return report;
    }
    return this.randomizeMemoized(attribute, proto, st, v, reserved);
  }

  randomizeMemoized(attribute, proto, st, v, reserved) {
    if (proto.memoizedCount(st) === Infinity) { // no tag table (an earlier release's slot bitset): refused
      throw new DeviceStateError(`the memo state of '${attribute}' cannot be accounted (it is no ${proto.name} memo tag `
        + `table: a memo state of an earlier release); nothing was sent. reset('${attribute}', { acceptPrivacyLoss: true }) starts it anew with its loss counted`);
    }
    const count = proto.memoizedCount(st);
    const slots = this.slots(attribute);
    // 1. reserve one more memo slot: decided on the schedule alone
    const grow = this.slotCost(attribute, slots);
    const canGrow = grow !== null && this.fits(reserved, grow);
    if (slots === 0 && !canGrow) throw new BudgetExceeded(attribute, reserved, grow ?? Infinity, this.budgetEps ?? 0.0);
    const newSlots = { ...this.memoSlots, [attribute]: canGrow ? slots + 1 : slots };
    const keyed = { ...this.keyed, [`a:${attribute}`]: keyId(st) }; // in the ledger before the first report leaves
    // 2. the value itself, if it is memoized or may be memoized now
    let trial = st.copy();
    let report = proto.randomize(v, { keys: this.keys, state: trial });
    const opened = this.campaign.attribute(attribute).openDomain;
    // the ledger's last value: an index, a measurement, or an open-domain attribute's memoized report (TreeHist:
    // never the value or its id, which a BigInt could not even write; frozen reports are drawn from it)
    const lastV = opened ? bytesToHex(proto.memoizedOutput(v, trial)) : v;
    if (proto.memoizedCount(trial) === count) { // already memoized: its PRR is reused, nothing spent
      this.saveBudget({ slots: newSlots, last: { ...this.lastValues, [attribute]: lastV }, keyed });
      return report;
    }
    const newCost = L(proto, count + 1) - L(proto, count);
    if (count < newSlots[attribute] && this.fits(this.loss(), newCost)) {
      if (proto.memoizedCount(trial) === Infinity) { // a new value the memo table cannot account for: refused
        throw new MemoTableFull(attribute, proto.memoTags ?? proto.memoSize);
      }
      this.saveBudget({ slots: newSlots, keyed }); // reserve first: a crash may over-count only
      this.saveMemo(attribute, trial);
      this.states[attribute] = trial;
      this.saveBudget({ last: { ...this.lastValues, [attribute]: lastV } });
      return report;
    }
    // 3. frozen: randomize the last reported value (memoized) instead of the new one
    const last = this.lastValues[attribute];
    if (last === undefined) {
      throw new BudgetExceeded(attribute, reserved, newCost, this.budgetEps ?? 0.0, 'no recorded last value to freeze on');
    }
    if (opened) { // the memoized report of the last value, the IRR drawn on top: nothing memoized
      report = proto.fromMemoized(hexToBytes(last), this.keys);
      this.saveBudget({ slots: newSlots, keyed });
      return report;
    }
    trial = st.copy();
    report = proto.randomize(last, { keys: this.keys, state: trial });
    if (proto.memoizedCount(trial) !== count) throw new DeviceStateError(`the last value of '${attribute}' in the ledger is not memoized: the state is inconsistent`);
    this.saveBudget({ slots: newSlots, keyed });
    return report;
  }

  /** The device's tuple for a group, in the solution's attribute order (labels accepted). */
  groupValues(group, values) {
    const names = group.attributes;
    let row;
    if (Array.isArray(values)) {
      if (values.length !== names.length) throw new LDPError(`group '${group.name}' needs ${names.length} values (for ${JSON.stringify(names)}), got ${values.length}`);
      row = values;
    } else if (values && typeof values === 'object') {
      const unknown = Object.keys(values).filter((a) => !names.includes(a));
      const missing = names.filter((a) => !(a in values));
      if (unknown.length || missing.length) {
        throw new LDPError(`group '${group.name}' reports the attributes ${JSON.stringify(names)}: ${[unknown.length ? `unknown ${JSON.stringify(unknown)}` : null, missing.length ? `missing ${JSON.stringify(missing)}` : null].filter(Boolean).join('; ')}`);
      }
      row = names.map((a) => values[a]);
    } else {
      throw new LDPError(`values of group '${group.name}' must be an object {attribute: value} or an array in the order ${JSON.stringify(names)}`);
    }
    return names.map((name, j) => this.valueIndex(name, row[j]));
  }

  /** Randomize the group's tuple: [[attribute, report bytes], ...] for the attributes the solution sends. */
  randomizeGroup(group, values) {
    const g = this.campaign.group(group);
    const v = this.groupValues(g, values);
    this.usable(`g:${group}`);
    const steps = this.groupSteps(group);
    const reserved = this.reserved();
    const cost = this.groupBound(group, steps + 1) - this.groupBound(group, steps);
    if (!this.fits(reserved, cost)) {
      throw new BudgetExceeded(group, reserved, cost, this.budgetEps ?? 0.0, `group '${group}' (${g.solution.name}): one more group step reserves its worst-case loss`);
    }
    const trial = this.groupStates[group].copy();
    const out = g.solution.randomize(v, { keys: this.keys, state: trial });
    // reserve first: a crash may over-count, never under-count
    this.saveBudget({ groups: { ...this.groupReports, [group]: steps + 1 }, keyed: { ...this.keyed, [`g:${group}`]: this.groupKeyId(group, trial) } });
    this.storage.set(this.groupName(group), JSON.stringify(trial.toJSON()));
    this.groupStates[group] = trial;
    return g.attributes.map((name, j) => [name, out[j]]).filter(([, r]) => r !== null);
  }

  /**
   * Start an attribute (or a group: {group: true}) anew with a fresh key / state from the CSPRNG: the only way
   * past a DeviceStateError of one scope. Its old reserved loss stays counted and the fresh key's first slot
   * (a group: its first step) is reserved at once. Returns the device's reserved loss.
   */
  reset(name, { group = false, acceptPrivacyLoss = false } = {}) {
    if (acceptPrivacyLoss !== true) {
      throw new RangeError('reset starts the attribute anew with a fresh key and counts its loss again: pass acceptPrivacyLoss: true');
    }
    let scope;
    let fingerprint;
    let proto = null;
    let g = null;
    if (group) {
      g = this.campaign.group(name);
      scope = `g:${name}`;
      fingerprint = g.solution.fingerprint;
    } else {
      proto = this.own(name);
      scope = `a:${name}`;
      fingerprint = proto.fingerprint;
    }
    const retired = { ...this.retired, [scope]: this.versionReserved(scope) + (this.retired[scope] ?? 0.0) };
    this.changedScopes.delete(scope);
    delete this.broken[scope];
    const keyed = { ...this.keyed };
    delete keyed[scope];
    if (group) {
      const st = g.solution.newState(this.keys);
      this.storage.set(this.groupName(name), JSON.stringify(st.toJSON())); // the state first
      this.groupStates[name] = st;
      keyed[scope] = this.groupKeyId(name, st);
      this.saveBudget({ groups: { ...this.groupReports, [name]: 1 }, keyed, retired });
    } else if (proto.memoSize) {
      const st = proto.newState(this.keys);
      this.saveMemo(name, st);
      this.states[name] = st;
      keyed[scope] = keyId(st);
      const last = { ...this.lastValues };
      delete last[name];
      this.saveBudget({ slots: { ...this.memoSlots, [name]: 1 }, last, keyed, retired });
    } else {
      this.states[name] = null;
      this.saveBudget({ spent: { ...this.spentReports, [name]: 0 }, keyed, retired });
    }
    if (this.fingerprints[scope] !== fingerprint) this.writeIdentity({ ...this.fingerprints, [scope]: fingerprint });
    return this.reserved();
  }
}
