import { test } from 'node:test';
import assert from 'node:assert/strict';
import { bytesToHex, keyTape } from '../src/chacha.js';
import { makeSolution, SOLUTIONS } from '../src/multidim.js';
import { VECTORS, deepClose } from '../test-support/vectors.js';

const stateOf = (st) => ({ sampled: st.sampled, fake: st.fake, reported: st.reported,
  memoized: st.memos.map((m) => (m === null ? null : m.cells())) });

test('every registered solution has a vector case', () => {
  assert.deepEqual([...new Set(VECTORS.solutions.map((c) => c.params.solution))].sort(), Object.keys(SOLUTIONS).sort());
});

for (const c of VECTORS.solutions) {
  test(`solution ${c.case}: state, reports of every attribute and state after every step`, () => {
    const sol = makeSolution(c.params);
    assert.equal(sol.fingerprint, c.fingerprint);
    assert.deepEqual(sol.params(), c.params);
    c.channels.forEach((ch, j) => {
      // channel budgets derived from the solution's (eps/d, amplified eps') agree to the last ulp or so
      assert.ok(deepClose(sol.channels[j].params(), ch.params), `channel ${j}: ${JSON.stringify(sol.channels[j].params())}`);
      assert.deepEqual(sol.channels[j].reportShape, ch.report_shape);
    });
    let st = null;
    if (c.initial_state !== null) {
      const tape = keyTape(c.state_keys);
      st = sol.newState(tape);
      assert.equal(tape.left, 0, 'newState drew fewer keys than recorded');
      assert.deepEqual(stateOf(st), c.initial_state);
    } else {
      assert.equal(c.state_keys.length, 0);
    }
    c.steps.forEach((step, i) => {
      const tape = keyTape(step.keys);
      const reports = sol.randomize(step.values, { keys: tape, state: st }).map((r) => (r === null ? null : bytesToHex(r)));
      assert.equal(tape.left, 0, `step ${i}: drew fewer keys than recorded`);
      assert.deepEqual(reports, step.reports, `step ${i}`);
      if (step.state !== undefined) assert.deepEqual(stateOf(st), step.state, `step ${i} state`);
    });
  });
}
