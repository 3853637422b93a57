import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from 'node:fs';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { tmpdir } from 'node:os';
import { Device, IngestError } from '../src/device.js';
import { DeviceStateError, BudgetExceeded } from '../src/ledger.js';
import { MemoryStorage, LocalStorageStorage, FileStorage } from '../src/storage.js';
import { base64Decode, decodePayload } from '../src/wire.js';
import { LEDGER_CAMPAIGN } from '../test-support/vectors.js';

const CAMPAIGN = {
  campaign: { id: 'js-device', time_step_seconds: 60.0 },
  attributes: [
    { name: 'app_version', k: 100, protocol: 'L-OSUE', eps_inf: 2.0, eps_1: 1.0 },
    { name: 'opt_in', k: 2, protocol: 'GRR', eps: 0.5, labels: ['no', 'yes'] },
    { name: 'dark_mode', k: 2, labels: ['off', 'on'] },
    { name: 'country', k: 10 },
  ],
  groups: [{ name: 'device', attributes: ['dark_mode', 'country'], solution: 'L-SMP', protocol: 'L-GRR', eps_inf: 1.0, eps_1: 0.5 }],
};

test('labels are accepted wherever indices are', () => {
  const dev = new Device(CAMPAIGN, new MemoryStorage());
  const yes = dev.report('opt_in', 'yes', 1);
  assert.deepEqual(Object.keys(yes), ['campaign', 'attribute', 't', 'payload']);
  assert.equal(yes.campaign, 'js-device');
  assert.equal(yes.attribute, 'opt_in');
  assert.equal(yes.t, 1);
  assert.equal(dev.valueIndex('opt_in', 'yes'), 1);
  assert.equal(dev.valueIndex('opt_in', 1), 1);
  assert.throws(() => dev.report('opt_in', 'maybe'), /'maybe' is not a label of 'opt_in' \(labels: 'no', 'yes'\)/);
  assert.throws(() => dev.report('app_version', 'v1'), /'app_version' has no labels/);
  assert.throws(() => dev.report('opt_in', 2), /outside the domain/);
  assert.throws(() => dev.report('dark_mode', 'on'), /randomized with the other attributes of group 'device'/);
  const objs = dev.reportGroup('device', { dark_mode: 'on', country: 3 }, 1);
  assert.equal(objs.length, 1); // L-SMP: the sampled attribute only
  assert.ok(['dark_mode', 'country'].includes(objs[0].attribute));
  assert.throws(() => dev.reportGroup('device', { dark_mode: 'dim', country: 3 }, 2), /not a label of 'dark_mode'/);
  assert.throws(() => dev.reportGroup('device', { dark_mode: 'on' }, 2), /missing \["country"\]/);
  assert.equal(dev.reportGroup('device', ['off', 4], 2).length, 1);
});

test('the payload is the batch payload of one report: "LDPr", version 1, count 1, the report bytes', () => {
  const dev = new Device(CAMPAIGN, new MemoryStorage());
  const obj = dev.report('app_version', 42, 7);
  const blob = base64Decode(obj.payload);
  assert.deepEqual([...blob.subarray(0, 9)], [0x4c, 0x44, 0x50, 0x72, 1, 1, 0, 0, 0]);
  assert.equal(decodePayload(blob, 13).length, 13);
  assert.equal(blob[8 + 13] & 0xf0, 0); // k = 100: the 4 pad bits of the last byte are 0
  assert.throws(() => dev.report('app_version', 1, -1), /time step must lie in/);
  assert.throws(() => dev.report('app_version', 1, 2 ** 32), /time step must lie in/);
});

test('storage round trip: the memo key, the memoized cells and the ledger survive a new Device', () => {
  const storage = new MemoryStorage();
  const a = new Device(CAMPAIGN, storage, { budgetEps: 10.0 });
  a.report('app_version', 5, 1);
  a.report('app_version', 6, 1);
  a.report('opt_in', 'no', 1);
  a.reportGroup('device', { dark_mode: 'on', country: 2 }, 1);
  const key = JSON.parse(storage.get('app_version.memo.json')).key;
  const reserved = a.reservedLoss();
  const loss = a.privacyLoss();
  a.close();
  const b = new Device(CAMPAIGN, storage, { budgetEps: 10.0 });
  assert.equal(JSON.parse(storage.get('app_version.memo.json')).key, key);
  assert.equal(b.memoizedCount('app_version'), 2);
  assert.equal(b.lastValue('app_version'), 6);
  assert.equal(b.reservedLoss(), reserved);
  assert.equal(b.privacyLoss(), loss);
  assert.equal(b.groupStepsReserved('device'), 1);
  b.report('app_version', 5, 2); // memoized: no new memoization
  assert.equal(b.memoizedCount('app_version'), 2);
  // a memo state the ledger recorded, then lost: the attribute refuses (DeviceStateError), the others go on
  storage.remove('app_version.memo.json');
  const c = new Device(CAMPAIGN, storage, { budgetEps: 10.0 });
  assert.throws(() => c.report('app_version', 1, 3), DeviceStateError);
  c.report('opt_in', 'yes', 3);
  const before = c.reservedLoss();
  const after = c.reset('app_version', { acceptPrivacyLoss: true });
  assert.ok(after > before, 'the reset key\'s first slot is reserved at once, the old loss stays counted');
  c.report('app_version', 1, 3);
  // another campaign in the same storage is refused
  assert.throws(() => new Device({ ...CAMPAIGN, campaign: { id: 'other', time_step_seconds: 60 } }, storage), /campaign 'js-device'/);
});

test('refusals are decided on the reserved loss only; memoizing attributes freeze instead', () => {
  const dev = new Device(LEDGER_CAMPAIGN, new MemoryStorage(), { budgetEps: 1.5 });
  dev.report('version', 1, 1); // reserves 1.5: all of it
  assert.throws(() => dev.report('opt_in', 'yes', 1), BudgetExceeded);
  assert.throws(() => dev.report('model', 0, 1), BudgetExceeded); // its first slot does not fit
  dev.report('version', 2, 1); // frozen on 1: still reported
  assert.equal(dev.lastValue('version'), 1);
  assert.equal(dev.memoizedCount('version'), 1);
  assert.ok(dev.privacyLoss() <= dev.reservedLoss() + 1e-12 && dev.reservedLoss() <= 1.5 + 1e-9);
});

test('FileStorage: atomic writes in a private directory, one Device at a time, state survives a restart', async () => {
  const dir = mkdtempSync(path.join(tmpdir(), 'ldp-js-'));
  try {
    const stateDir = path.join(dir, 'state');
    const dev = await Device.open(CAMPAIGN, stateDir, { budgetEps: 20 });
    assert.equal(statSync(stateDir).mode & 0o777, 0o700);
    dev.report('app_version', 9, 1);
    assert.throws(() => new Device(CAMPAIGN, new FileStorage(stateDir, { fs, path })), /in use by process/);
    dev.close();
    const names = readdirSync(stateDir).sort();
    assert.deepEqual(names, ['app_version.memo.json', 'budget.json', 'device.group.json', 'device.json']);
    for (const n of names) assert.equal(statSync(path.join(stateDir, n)).mode & 0o777, 0o600, n);
    const again = new Device(CAMPAIGN, new FileStorage(stateDir, { fs, path }), { budgetEps: 20 });
    assert.equal(again.memoizedCount('app_version'), 1);
    assert.equal(JSON.parse(readFileSync(path.join(stateDir, 'budget.json'), 'utf8')).memo_slots.app_version, 1);
    again.close();
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('LocalStorageStorage keeps the state under its prefix', () => {
  const items = new Map();
  const fake = { getItem: (k) => (items.has(k) ? items.get(k) : null), setItem: (k, v) => items.set(k, v), removeItem: (k) => items.delete(k) };
  const dev = new Device(CAMPAIGN, new LocalStorageStorage('dev1/', fake));
  dev.report('app_version', 3, 1);
  assert.ok([...items.keys()].every((k) => k.startsWith('dev1/')));
  const again = new Device(CAMPAIGN, new LocalStorageStorage('dev1/', fake));
  assert.equal(again.memoizedCount('app_version'), 1);
});

function mockFetch(answers) {
  const calls = [];
  const fn = async (url, init) => {
    calls.push({ url, init });
    const a = answers.shift();
    if (a instanceof Error) throw a;
    return new Response(JSON.stringify(a.body), { status: a.status });
  };
  fn.calls = calls;
  return fn;
}

test('send: one Idempotency-Key, the same bytes on every retry (network error, 5xx, 409), never randomized again', async () => {
  const fetch = mockFetch([new TypeError('fetch failed'), { status: 503, body: {} }, { status: 409, body: {} }, { status: 200, body: { accepted: 1 } }]);
  const dev = new Device(CAMPAIGN, new MemoryStorage(), { budgetEps: 10, ingestUrl: 'http://ingest/reports', token: 'tok',
    retries: 3, backoffSeconds: 0.001, fetch });
  const reply = await dev.send('app_version', 42, 5);
  assert.deepEqual(reply, { accepted: 1 });
  assert.equal(fetch.calls.length, 4);
  const bodies = new Set(fetch.calls.map((c) => c.init.body));
  const keys = new Set(fetch.calls.map((c) => c.init.headers['Idempotency-Key']));
  assert.equal(bodies.size, 1);
  assert.equal(keys.size, 1);
  assert.match([...keys][0], /^[0-9a-f]{32}$/);
  assert.equal(fetch.calls[0].init.headers.Authorization, 'Bearer tok');
  assert.equal(dev.memoSlots.app_version, 1); // one report reserved, once
  const obj = JSON.parse([...bodies][0]);
  assert.equal(obj.attribute, 'app_version');
  assert.equal(obj.t, 5);
});

test('send: a refusal a retry cannot mend raises IngestError at once; retries are bounded', async () => {
  const refused = mockFetch([{ status: 404, body: { error: 'no' } }]);
  const dev = new Device(CAMPAIGN, new MemoryStorage(), { ingestUrl: 'http://ingest/x', backoffSeconds: 60, fetch: refused });
  await assert.rejects(dev.send('opt_in', 'yes', 1), (e) => e instanceof IngestError && e.status === 404);
  assert.equal(refused.calls.length, 1);
  const down = mockFetch([new TypeError('x'), new TypeError('x'), new TypeError('x')]);
  const dev2 = new Device(CAMPAIGN, new MemoryStorage(), { ingestUrl: 'http://ingest/x', retries: 2, backoffSeconds: 0.001, fetch: down });
  await assert.rejects(dev2.sendGroup('device', { dark_mode: 'off', country: 1 }, 1), (e) => e instanceof IngestError && e.status === null);
  assert.equal(down.calls.length, 3);
  await assert.rejects(new Device(CAMPAIGN, new MemoryStorage()).send('opt_in', 1), /no ingestUrl/);
});
