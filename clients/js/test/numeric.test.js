// Numeric attributes: every numeric case of the randomizer vectors replayed byte for byte (reports, keys drawn,
// extension words, memoized points, derived figures), the numeric ledger vectors, campaign parsing, and the
// device API (clipping, refusals, 1BitMean memo persistence, the compact body).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { bytesToHex, keyTape } from '../src/chacha.js';
import { Campaign } from '../src/campaign.js';
import { Device } from '../src/device.js';
import { BudgetExceeded } from '../src/ledger.js';
import { MECHANISMS, makeNumeric, toUnit } from '../src/numeric.js';
import { fromParams } from '../src/registry.js';
import { MemoryStorage } from '../src/storage.js';
import { base64Decode, decodePayload, encodeCompact } from '../src/wire.js';
import { VECTORS, NUMERIC_LEDGER_CAMPAIGN, close } from '../test-support/vectors.js';

/** Replay one numeric case: its memo key (1BitMean) and each step's keys through the JS mechanism. */
function replayNumeric(c) {
  const mech = fromParams(c.params);
  const state = c.memo_key === null ? null : mech.newState(keyTape([c.memo_key]));
  return c.steps.map((step) => {
    const tape = keyTape(step.keys);
    const [x, clipped] = toUnit(step.value, mech.lo, mech.hi);
    const report = bytesToHex(mech.randomize(step.value, { keys: tape, state }));
    return { x, clipped, report, left: tape.left, extWords: mech.lastExtWords, memoized: state === null ? null : state.cells() };
  });
}

test('every numeric mechanism has a vector case (1BitMean with and without output perturbation)', () => {
  assert.deepEqual([...new Set(VECTORS.numeric.map((c) => c.mechanism))].sort(), Object.keys(MECHANISMS).sort());
  const gammas = VECTORS.numeric.filter((c) => c.mechanism === '1BitMean').map((c) => c.params.gamma > 0);
  assert.ok(gammas.includes(true) && gammas.includes(false));
  assert.ok(VECTORS.numeric.some((c) => c.steps.some((s) => s.ext_words > 0)), 'a case draws past its slot');
});

for (const c of VECTORS.numeric) {
  test(`numeric ${c.case}: reports, keys, extension words and memoized points of every step`, () => {
    replayNumeric(c).forEach((got, i) => {
      const want = c.steps[i];
      const where = `step ${i} (value ${want.value})`;
      assert.equal(got.x, want.x, `${where}: x`);
      assert.equal(got.clipped, want.clipped, `${where}: clipped`);
      assert.equal(got.left, 0, `${where}: the randomizer drew fewer keys than recorded`);
      assert.equal(got.report, want.report, where);
      assert.equal(got.extWords, want.ext_words, `${where}: extension words`);
      assert.deepEqual(got.memoized, want.memoized, `${where}: memoized points`);
    });
  });

  test(`numeric ${c.case}: parameters, fingerprint, report layout and derived figures`, () => {
    const mech = fromParams(c.params);
    assert.equal(mech.name, c.mechanism);
    assert.deepEqual(mech.params(), c.params);
    assert.equal(mech.fingerprint, c.fingerprint);
    assert.equal(mech.reportDtype, c.report_dtype);
    assert.deepEqual(mech.reportShape, c.report_shape);
    assert.equal(mech.reportNbytes, c.steps[0].report.length / 2);
    const got = mech.derived();
    assert.deepEqual(Object.keys(got).sort(), Object.keys(c.derived).sort());
    for (const [name, want] of Object.entries(c.derived)) {
      if (typeof want === 'number' && !Number.isInteger(want)) assert.ok(close(got[name], want), `${name}: ${got[name]} vs ${want}`);
      else assert.equal(got[name], want, name); // sizes and 64-bit integers (decimal strings): exact
    }
  });
}

// ---------------------------------------------------------------- the ledger with numeric attributes
test('the numeric ledger campaign fixture names what the vectors\' TOML declares', () => {
  const toml = VECTORS.numeric_ledger[0].campaign;
  assert.ok(toml.includes(`id = "${NUMERIC_LEDGER_CAMPAIGN.campaign.id}"`));
  for (const a of NUMERIC_LEDGER_CAMPAIGN.attributes) assert.ok(toml.includes(`name = "${a.name}"`), a.name);
});

for (const c of VECTORS.numeric_ledger) {
  test(`numeric ledger ${c.case}: outcomes, randomized values, clipped counts, reserved and actual loss`, () => {
    const dev = new Device(NUMERIC_LEDGER_CAMPAIGN, new MemoryStorage(), { budgetEps: c.budget_eps });
    assert.equal(dev.budgetPlan, c.budget_plan);
    c.steps.forEach((want, i) => {
      const { scope, value } = want;
      const where = `step ${i} (${scope} ${JSON.stringify(value)})`;
      const attr = dev.campaign.attribute(scope);
      const memo = attr.protocol.memoSize > 0;
      let outcome;
      try {
        const frozen = memo && dev.frozen(scope);
        const before = memo ? dev.memoizedCount(scope) : 0;
        dev.report(scope, value, 1);
        const given = attr.numeric ? value : dev.valueIndex(scope, value);
        outcome = frozen && dev.memoizedCount(scope) === before && dev.lastValue(scope) !== given ? 'frozen' : 'reported';
      } catch (exc) {
        if (!(exc instanceof BudgetExceeded)) throw exc;
        outcome = 'refused';
      }
      assert.equal(outcome, want.outcome, where);
      if ('randomized' in want) {
        assert.equal(dev.lastValue(scope), want.randomized, `${where}: randomized`);
        assert.equal(dev.memoizedCount(scope), want.memoized, `${where}: memoized`);
      }
      if ('clipped' in want) assert.equal(dev.clipped(scope), want.clipped, `${where}: clipped`);
      for (const [f, got] of [['reserved_loss', dev.reservedLoss()], ['privacy_loss', dev.privacyLoss()],
        ['scope_reserved', dev.reservedLoss(scope)], ['scope_loss', dev.privacyLoss(scope)]]) {
        assert.ok(close(got, want[f], 1e-9), `${where}: ${f} ${got} vs ${want[f]}`);
      }
    });
  });
}

// ---------------------------------------------------------------- campaigns
const CAMPAIGN = {
  campaign: { id: 'js-numeric', time_step_seconds: 60.0 },
  attributes: [
    { name: 'session_seconds', type: 'numeric', range: [0, 600], mechanism: 'PM', eps: 1 },
    { name: 'battery', type: 'numeric', range: [0.0, 100.0], mechanism: '1BitMean', eps: 1.0, s: 4, gamma: 0.1 },
    { name: 'opt_in', type: 'categorical', k: 2, protocol: 'GRR', eps: 0.5, labels: ['no', 'yes'] },
  ],
};

test('a numeric attribute parses to its mechanism, with the fingerprint of Python\'s float parameters', () => {
  const c = Campaign.fromJSON(CAMPAIGN);
  const a = c.attribute('session_seconds');
  assert.ok(a.numeric && !c.attribute('opt_in').numeric);
  assert.deepEqual(a.protocol.params(), { mechanism: 'PM', eps: 1, lo: 0, hi: 600, grid_bits: 16 });
  // json.dumps(..., sort_keys=True, separators=(",", ":")) of {"eps": 1.0, "grid_bits": 16, "hi": 600.0, "lo": 0.0, ...}
  assert.equal(a.protocol.fingerprint, makeNumeric('PM', { eps: 1.0, lo: 0.0, hi: 600.0 }).fingerprint);
  const pm = VECTORS.numeric.find((v) => v.case === 'PM');
  assert.equal(a.protocol.fingerprint, pm.fingerprint); // the vector's attribute is this one: eps 1, [0, 600]
  assert.equal(c.wireFingerprint('session_seconds'), pm.fingerprint);
  assert.equal(a.k, 2); // the support size (Σc, Σc²)
});

test('numeric attributes refuse what Python refuses', () => {
  const bad = (extra, re) => {
    const attrs = [{ name: 'x', type: 'numeric', range: [0, 1], mechanism: 'PM', eps: 1.0, ...extra }];
    assert.throws(() => Campaign.fromJSON({ campaign: { id: 'c' }, attributes: attrs }), re);
  };
  bad({ labels: ['a'] }, /'x' is numeric: it has no labels/);
  bad({ defense: 'itemset' }, /only defense = "none"/);
  bad({ k: 4 }, /has a range and a mechanism, not 'k'/);
  bad({ protocol: 'GRR' }, /has a range and a mechanism, not 'protocol'/);
  bad({ range: [0] }, /needs range = \[lo, hi\]/);
  bad({ range: [0, '1'] }, /needs range = \[lo, hi\]/);
  bad({ range: [1, 0] }, /attribute 'x': the range must be finite with lo < hi/);
  bad({ mechanism: 'Gauss' }, /needs a mechanism, one of Laplace, Duchi, PM, HM, SW, 1BitMean; got "Gauss"/);
  bad({ d_in: 4 }, /attribute 'x': PM does not take d_in/);
  bad({ eps: undefined }, /PM needs eps/);
  bad({ grid_bits: 3 }, /grid_bits must be an integer in \[4, 24\]/);
  bad({ type: 'ordinal' }, /type must be one of categorical, numeric/);
  bad({ mechanism: '1BitMean', gamma: 0.5 }, /gamma \(output perturbation\) must lie in \[0, 0\.5\)/);
  assert.throws(() => Campaign.fromJSON({
    campaign: { id: 'c' },
    attributes: [{ name: 'x', type: 'numeric', range: [0, 1], mechanism: 'PM', eps: 1.0 }, { name: 'y', k: 2 }],
    groups: [{ name: 'g', attributes: ['x', 'y'], solution: 'SMP', protocol: 'GRR', eps: 1.0 }],
  }), /'x' is numeric: it cannot belong to group 'g'/);
});

// ---------------------------------------------------------------- the device
test('a device reports numbers: clipped to the range and counted, NaN, infinities and non-numbers refused', () => {
  const dev = new Device(CAMPAIGN, new MemoryStorage());
  const obj = dev.report('session_seconds', 123.4, 5);
  assert.deepEqual(Object.keys(obj), ['campaign', 'attribute', 't', 'payload']);
  const report = decodePayload(base64Decode(obj.payload), 2);
  assert.equal(report.length, 2); // one uint16 cell
  assert.ok(report[0] + 256 * report[1] < 65536);
  assert.equal(dev.clipped('session_seconds'), 0);
  dev.report('session_seconds', -3, 5);
  dev.report('session_seconds', 601, 5);
  dev.report('session_seconds', 600, 5);
  assert.equal(dev.clipped('session_seconds'), 2);
  for (const v of [NaN, Infinity, -Infinity]) assert.throws(() => dev.report('session_seconds', v, 5), /is not a finite number/);
  for (const v of ['12', null, true, 5n]) assert.throws(() => dev.report('session_seconds', v, 5), /must be a number/);
  assert.throws(() => dev.valueIndex('session_seconds', 3), /is numeric: its values are measurements/);
  assert.equal(dev.reservedLoss('session_seconds'), 4 * dev.campaign.attribute('session_seconds').protocol.epsFirst);
  assert.throws(() => makeNumeric('SW', { eps: 1 }).randomize(0.5, { keys: keyTape([]), state: null }), /drew more keys/);
});

test('1BitMean: memoized points and a measured last value survive a new Device; the budget counts eps_memo per point', () => {
  const storage = new MemoryStorage();
  const a = new Device(CAMPAIGN, storage, { budgetEps: 20.0 });
  const mech = a.campaign.attribute('battery').protocol;
  assert.equal(mech.memoSize, 5);
  for (const v of [12.5, 12.5, 80.0, 130.0]) a.report('battery', v, 1);
  const count = a.memoizedCount('battery');
  assert.ok(count >= 2 && count <= 4);
  assert.equal(a.clipped('battery'), 1);
  assert.ok(close(a.privacyLoss('battery'), count * mech.epsMemo));
  assert.ok(close(a.reservedLoss('battery'), 4 * mech.epsMemo)); // a slot per report
  const memo = JSON.parse(storage.get('battery.memo.json'));
  assert.equal(memo.memo_size, 5);
  a.close();
  const b = new Device(CAMPAIGN, storage, { budgetEps: 20.0 });
  assert.equal(b.lastValue('battery'), 130.0);
  assert.equal(b.memoizedCount('battery'), count);
  assert.equal(b.clipped('battery'), 0); // per Device object, never stored
  b.report('battery', 100.0, 2); // rounds to the last point, already memoized
  assert.equal(b.memoizedCount('battery'), count);
  assert.equal(JSON.parse(storage.get('battery.memo.json')).key, memo.key);
  // a fractional last value is read back as is (not truncated)
  b.report('battery', 37.25, 3);
  b.close();
  assert.equal(new Device(CAMPAIGN, storage, { budgetEps: 20.0 }).lastValue('battery'), 37.25);
});

test('numeric reports travel in the compact binary body with their attribute fingerprints', async () => {
  const calls = [];
  const fetch = async (url, init) => {
    calls.push(init);
    return new Response('{"accepted": 3}', { status: 200 });
  };
  const dev = new Device(CAMPAIGN, new MemoryStorage(), { ingestUrl: 'http://ingest/reports', fetch });
  const objs = [dev.report('session_seconds', 42, 7), dev.report('battery', 55.5, 7), dev.report('opt_in', 'yes', 7)];
  assert.deepEqual(await dev.sendBinary(objs), { accepted: 3 });
  const body = calls[0].body;
  const want = encodeCompact(objs.map((o) => ({ campaign: o.campaign, attribute: o.attribute, t: o.t,
    fingerprint: dev.campaign.wireFingerprint(o.attribute), payload: base64Decode(o.payload) })));
  assert.equal(bytesToHex(body), bytesToHex(want));
  assert.equal(bytesToHex(body.slice(8, 16)), dev.campaign.attribute('session_seconds').protocol.fingerprint);
});
