import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Device } from '../src/device.js';
import { BudgetExceeded } from '../src/ledger.js';
import { MemoryStorage } from '../src/storage.js';
import { VECTORS, LEDGER_CAMPAIGN, close } from '../test-support/vectors.js';

test('the ledger campaign fixture names what the vectors\' TOML declares', () => {
  const toml = VECTORS.ledger[0].campaign;
  assert.ok(toml.includes(`id = "${LEDGER_CAMPAIGN.campaign.id}"`));
  for (const a of LEDGER_CAMPAIGN.attributes) assert.ok(toml.includes(`name = "${a.name}"`), a.name);
  for (const g of LEDGER_CAMPAIGN.groups) assert.ok(toml.includes(`name = "${g.name}"`), g.name);
});

/** producers.sdk Device over a schedule, as ldpstream_dev.randomizer_vectors.ledger_case records it. */
function ledgerSteps(budget, schedule) {
  const dev = new Device(LEDGER_CAMPAIGN, new MemoryStorage(), { budgetEps: budget });
  const steps = [];
  for (const { scope, value } of schedule) {
    const step = { scope, value };
    const group = scope.startsWith('group:') ? scope.slice('group:'.length) : null;
    try {
      if (group !== null) {
        dev.reportGroup(group, value, 1);
        step.outcome = 'reported';
      } else {
        const frozen = dev.frozen(scope);
        const before = dev.memoizedCount(scope);
        dev.report(scope, value, 1);
        step.outcome = frozen && dev.memoizedCount(scope) === before && dev.lastValue(scope) !== dev.valueIndex(scope, value)
          ? 'frozen' : 'reported';
        if (dev.campaign.attribute(scope).protocol.memoSize) {
          step.randomized = dev.lastValue(scope);
          step.memoized = dev.memoizedCount(scope);
        }
      }
    } catch (exc) {
      if (!(exc instanceof BudgetExceeded)) throw exc;
      step.outcome = 'refused';
    }
    step.reserved_loss = dev.reservedLoss();
    step.privacy_loss = dev.privacyLoss();
    step.scope_reserved = group ? dev.reservedLoss(null, { group }) : dev.reservedLoss(scope);
    step.scope_loss = group ? dev.privacyLoss(null, { group }) : dev.privacyLoss(scope);
    steps.push(step);
  }
  return { steps, plan: dev.budgetPlan };
}

for (const c of VECTORS.ledger) {
  test(`ledger ${c.case}: outcomes, randomized values, reserved and actual loss`, () => {
    const { steps, plan } = ledgerSteps(c.budget_eps, c.steps);
    assert.equal(plan, c.budget_plan);
    steps.forEach((got, i) => {
      const want = c.steps[i];
      const where = `step ${i} (${want.scope} ${JSON.stringify(want.value)})`;
      assert.equal(got.outcome, want.outcome, where);
      assert.equal(got.randomized, want.randomized, `${where}: randomized`);
      assert.equal(got.memoized, want.memoized, `${where}: memoized`);
      for (const f of ['reserved_loss', 'privacy_loss', 'scope_reserved', 'scope_loss']) {
        assert.ok(close(got[f], want[f], 1e-9), `${where}: ${f} ${got[f]} vs ${want[f]}`);
      }
    });
  });
}

test('a budget that cannot memoize one value of a memoizing attribute is refused at construction', () => {
  assert.throws(() => new Device(LEDGER_CAMPAIGN, new MemoryStorage(), { budgetEps: 1.2 }), /cannot memoize a single value of 'version'/);
  assert.throws(() => new Device(LEDGER_CAMPAIGN, new MemoryStorage(), { budgetEps: -1 }), /budgetEps must be >= 0/);
});
