import { test } from 'node:test';
import assert from 'node:assert/strict';
import { bytesToHex, keyTape } from '../src/chacha.js';
import { fromParams, make, PROTOCOLS } from '../src/registry.js';
import { VECTORS, close } from '../test-support/vectors.js';

const FIELDS = { eps_first: 'epsFirst', eps_inf: 'epsInf', memo_size: 'memoSize' };

/** The protocol's own figure for a `derived` entry of the vectors (the chosen protocol's for ADP / L-ADP). */
function derivedOf(proto, name) {
  if (name === 'chosen') return proto.chosen.name;
  const own = FIELDS[name];
  if (own) return proto[own];
  return (proto.chosen ?? proto)[name];
}

/** Replay one protocol case: its recorded memo key and per-step keys through the JS randomizer. */
export function replayProtocol(c) {
  const proto = fromParams(c.params);
  const state = c.memo_key === null ? null : proto.newState(keyTape([c.memo_key]));
  return c.steps.map((step) => {
    const tape = keyTape(step.keys);
    const report = bytesToHex(proto.randomize(step.value, { keys: tape, state }));
    return { value: step.value, keys: step.keys, report, memoized: state === null ? null : state.cells(), left: tape.left };
  });
}

test('every registered protocol has a vector case', () => {
  const covered = new Set(VECTORS.protocols.map((c) => c.params.protocol));
  assert.deepEqual([...covered].sort(), Object.keys(PROTOCOLS).sort());
});

for (const c of VECTORS.protocols) {
  test(`protocol ${c.case}: report bytes and memo cells of every step`, () => {
    const steps = replayProtocol(c);
    steps.forEach((got, i) => {
      const want = c.steps[i];
      assert.equal(got.left, 0, `step ${i}: the randomizer drew fewer keys than recorded`);
      assert.equal(got.report, want.report, `step ${i} (value ${want.value})`);
      assert.deepEqual(got.memoized, want.memoized, `step ${i} memo cells`);
    });
  });

  test(`protocol ${c.case}: parameters, fingerprint, report layout and calibration`, () => {
    const proto = fromParams(c.params);
    assert.deepEqual(proto.params(), c.params);
    assert.equal(proto.fingerprint, c.fingerprint);
    assert.deepEqual(proto.reportShape, c.report_shape);
    if (!c.report_dtype.startsWith('void')) assert.equal(proto.reportDtype, c.report_dtype);
    assert.equal(c.steps[0].report.length / 2, proto.reportNbytes);
    for (const [name, want] of Object.entries(c.derived)) {
      const got = derivedOf(proto, name);
      assert.ok(close(got, want), `${name}: ${got} vs ${want}`);
    }
  });
}

test('calibration from the campaign parameters alone (the defaults the vectors spell out)', () => {
  // THE's theta (scipy's bounded Brent search), SS's omega and layout, LOLOHA's g, ADP's choice
  const the = VECTORS.protocols.find((c) => c.params.protocol === 'THE');
  assert.equal(make('THE', { k: 10, eps: 1.0 }).theta, the.params.theta);
  const ss = VECTORS.protocols.find((c) => c.case === 'SS k=10');
  assert.deepEqual(make('SS', { k: 10, eps: 1.0 }).params(), ss.params);
  const lol = VECTORS.protocols.find((c) => c.case === 'LOLOHA k=50');
  assert.equal(make('LOLOHA', { k: 50, eps_inf: 2.0, eps_1: 1.0 }).g, lol.params.g);
  assert.equal(make('ADP', { k: 50, eps: 1.0 }).chosen.name, 'OUE');
  assert.equal(make('ADP', { k: 5, eps: 2.0 }).chosen.name, 'GRR');
});

test('one flipped key bit changes the report bytes', () => {
  const flip = (hex, bit) => {
    const b = Number.parseInt(hex.slice(2 * (bit >> 3), 2 * (bit >> 3) + 2), 16) ^ (1 << (bit & 7));
    return hex.slice(0, 2 * (bit >> 3)) + b.toString(16).padStart(2, '0') + hex.slice(2 * (bit >> 3) + 2);
  };
  for (const name of ['L-OSUE k=1000', 'SHE k=5', 'SS k=64 bits', 'OUE k=1000']) {
    const c = VECTORS.protocols.find((x) => x.case === name);
    const step = c.steps[0];
    const mutated = { ...c, steps: [{ ...step, keys: step.keys.map((k, i) => (i === 0 ? flip(k, 77) : k)) }] };
    const [got] = replayProtocol(mutated);
    assert.notEqual(got.report, step.report, `${name}: a flipped noise-key bit left the report unchanged`);
  }
  const memo = VECTORS.protocols.find((x) => x.case === 'dBitFlipPM d=6 (selection)');
  const [got] = replayProtocol({ ...memo, memo_key: flip(memo.memo_key, 3), steps: memo.steps.slice(0, 1) });
  assert.notEqual(got.report, memo.steps[0].report, 'a flipped memo-key bit left the memoized response unchanged');
});

test('a value outside the domain and a missing memo state are refused', () => {
  const p = make('L-GRR', { k: 5, eps_inf: 2.0, eps_1: 1.0 });
  assert.throws(() => p.randomize(5, { keys: keyTape([]), state: p.newState(keyTape(['00'.repeat(32)])) }), /outside the domain/);
  assert.throws(() => p.randomize(1, { keys: keyTape([]) }), /memoizes/);
  assert.throws(() => make('GRR', { k: 5 }), /GRR needs eps/);
  assert.throws(() => make('GRR', { k: 5, eps: 1, g: 2 }), /does not take g/);
  assert.throws(() => make('L-OUE', { k: 10, eps_inf: 1.0, eps_1: 0.95 }), /cannot reach/);
});
