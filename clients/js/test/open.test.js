// Open-domain attributes (type = "string" / "u64"): the value ids, sketch hashes and every CMS / HCMS case of the
// randomizer vectors replayed byte for byte, campaign parsing (the reference's validation and seed default), and
// the device API (a string or a u64 hashed on the device, refusals, the ledger holding no value).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { bytesToHex, keyTape } from '../src/chacha.js';
import { Campaign, CampaignError } from '../src/campaign.js';
import { Device } from '../src/device.js';
import { BudgetExceeded, DeviceStateError, MemoTableFull } from '../src/ledger.js';
import { TreeHist } from '../src/treehist.js';
import { OPEN_PROTOCOLS, fromParams, makeOpen } from '../src/registry.js';
import { rowSeeds, sketchHash, spread, valueId } from '../src/sketch.js';
import { MemoryStorage } from '../src/storage.js';
import { base64Decode, decodePayload } from '../src/wire.js';
import { LDPError } from '../src/util.js';
import { VECTORS, close } from '../test-support/vectors.js';

const OPEN = VECTORS.open_domain;
const hex64 = (x) => x.toString(16).padStart(16, '0');
/** A case's parameters with the exact seed (JSON.parse rounds integers past 2^53: the vectors spell it in hex). */
const paramsOf = (c) => ({ ...c.params, seed: BigInt(`0x${c.seed_hex}`) });
const valueOf = (c, step) => (c.type === 'u64' ? BigInt(step.value) : step.value);

test('every open-domain protocol has a vector case, a CMS case draws past its slot', () => {
  assert.deepEqual([...new Set(OPEN.cases.map((c) => c.params.protocol))].sort(), Object.keys(OPEN_PROTOCOLS).sort());
  assert.ok(OPEN.cases.some((c) => c.params.protocol === 'CMS' && c.steps.some((s) => s.ext_words > 0)));
});

test('value ids: SHA-256 of the UTF-8 bytes (non-ASCII included), integers themselves', () => {
  for (const v of OPEN.value_ids) {
    const value = v.type === 'u64' ? BigInt(v.value) : v.value;
    assert.equal(hex64(valueId(value)), v.id, JSON.stringify(v));
    if (v.utf8 !== undefined) assert.equal(bytesToHex(new TextEncoder().encode(v.value)), v.utf8);
  }
  assert.throws(() => valueId(2 ** 53 + 2), LDPError); // an unsafe Number: not exact, refused
  assert.throws(() => valueId(-1), LDPError);
  assert.throws(() => valueId(1n << 64n), LDPError);
  assert.throws(() => valueId('\ud800'), LDPError); // no UTF-8 encoding
});

test('the public hash family: row seeds, spreads and h_j(id)', () => {
  for (const h of OPEN.sketch_hash) {
    const seeds = rowSeeds(BigInt(`0x${h.seed_hex}`), h.rows);
    assert.deepEqual(seeds.map(hex64), h.row_seeds);
    assert.deepEqual(seeds.map((s) => hex64(spread(s))), h.spreads);
    assert.deepEqual(h.ids.map((i) => seeds.map((s) => sketchHash(BigInt(`0x${i}`), s, h.m))), h.hashes);
  }
});

for (const c of OPEN.cases) {
  test(`open-domain ${c.case}: report bytes of every step`, () => {
    const proto = fromParams(paramsOf(c));
    c.steps.forEach((step, i) => {
      const value = valueOf(c, step);
      assert.equal(hex64(valueId(value)), step.id, `step ${i}: id`);
      const tape = keyTape(step.keys);
      if (c.memo_key) return; // a memoized device: the test below
      assert.equal(bytesToHex(proto.randomizeValue(value, { keys: tape })), step.report, `step ${i} (${step.value})`);
      assert.equal(tape.left, 0, `step ${i}: the randomizer drew fewer keys than recorded`);
    });
  });

  if (c.memo_key !== undefined && c.memo_key !== null) {
    test(`open-domain ${c.case}: a memoized device (its level, PRR, memo tags)`, () => {
      const proto = fromParams(paramsOf(c));
      const state = proto.newState(keyTape([c.memo_key]));
      assert.equal(proto.deviceLevel(state), c.derived.level);
      c.steps.forEach((step, i) => {
        const value = valueOf(c, step);
        const tape = keyTape(step.keys);
        assert.equal(bytesToHex(proto.randomizeValue(value, { keys: tape, state })), step.report, `step ${i}`);
        assert.equal(tape.left, 0);
        const tags = Array.from({ length: proto.memoTags }, (_, t) => hex64(TreeHist.getTag(state.seen, t)));
        assert.deepEqual(tags, step.memoized, `step ${i}: memo tag table`);
        const count = proto.memoizedCount(state);
        assert.equal(count === Infinity ? 'inf' : count, step.memoized_count, `step ${i}: memoized prefixes`);
        assert.equal(bytesToHex(proto.memoizedOutput(valueId(value), state)), step.prr, `step ${i}: PRR`);
        assert.equal(hex64(proto.memoInput(valueId(value), state)), step.memo_input);
      });
    });
  }

  test(`open-domain ${c.case}: parameters, fingerprint, report layout and derived figures`, () => {
    const proto = fromParams(paramsOf(c));
    const { seed, ...rest } = proto.params();
    const { seed: _, ...want } = c.params;
    assert.deepEqual(rest, want);
    assert.equal(hex64(seed), c.seed_hex);
    assert.equal(proto.fingerprint, c.fingerprint);
    assert.equal(proto.reportDtype, c.report_dtype);
    assert.deepEqual(proto.reportShape, c.report_shape);
    assert.equal(proto.reportNbytes, c.steps[0].report.length / 2);
    const d = c.derived;
    assert.ok(close(proto.epsFirst, d.eps_first), `eps_first ${proto.epsFirst} vs ${d.eps_first}`);
    assert.ok(close(proto.epsInf, d.eps_inf));
    assert.equal(proto.memoSize, d.memo_size);
    const mine = { T: () => proto.T, q: () => proto.q, support_size: () => proto.supportSize,
      row_seeds: () => proto.seeds.map(hex64), rejection_limit: () => hex64(proto.limit), g: () => proto.g,
      t1: () => Number(proto.t1), t2: () => Number(proto.t2), prefix_bits: () => proto.prefixBits,
      memo_seed: () => hex64(proto.memoSeed), memo_tags: () => proto.memoTags };
    for (const [name, want] of Object.entries(d)) {
      if (name in mine) assert.deepEqual(mine[name](), want, name); // the protocol's own figures (CMS, HCMS: all)
    }
  });
}

const CAMPAIGN = {
  campaign: { id: 'open-test' },
  attributes: [
    { name: 'crash', type: 'string', protocol: 'HCMS', eps: 4.0, m: 256, k: 16, top: 5, candidates: ['a', 'b', 'c'] },
    { name: 'pid', type: 'u64', protocol: 'CMS', eps: 1.0, m: 100, k: 4, candidates: [1, (1n << 64n) - 1n] },
  ],
};

test('campaign: string / u64 attributes, the seed defaults to the id of the name, the reference\'s refusals', () => {
  const c = Campaign.fromJSON(CAMPAIGN);
  const crash = c.attribute('crash');
  assert.equal(crash.openDomain, true);
  assert.equal(crash.valueType, 'string');
  assert.equal(crash.k, 2 * 16 * 256);
  assert.equal(crash.protocol.seed, valueId('crash'));
  assert.equal(c.attribute('pid').k, 4 * 101);
  const bad = (attr, re) => assert.throws(() => Campaign.fromJSON({ ...CAMPAIGN, attributes: [{ ...CAMPAIGN.attributes[0], ...attr }] }),
    (e) => e instanceof CampaignError && re.test(e.message), re.source);
  bad({ protocol: 'GRR' }, /needs an open-domain protocol/);
  bad({ labels: ['x'] }, /has no labels/);
  bad({ defense: 'itemset' }, /only defense = "none"/);
  bad({ top: 0 }, /top must be an integer in \[1, 1000\]/);
  bad({ candidates: ['a', 'a'] }, /listed twice/);
  bad({ candidates: [3] }, /candidate 3 is not a string/);
  bad({ m: 100 }, /power of 2/);
  bad({ range: [0, 1] }, /not range or mechanism/);
  bad({ type: 'u64', candidates: [2 ** 60] }, /give it as a BigInt/);
  bad({ seed: 2 ** 60 }, /pass it as a BigInt/);
  assert.throws(() => makeOpen('TreeHist?', {}), /unknown open-domain protocol/);
});

test('device: a string or a u64 is hashed on the device, reported, and never stored; other values are refused', () => {
  const storage = new MemoryStorage();
  const dev = new Device(CAMPAIGN, storage, { budgetEps: 10.0 });
  const obj = dev.report('crash', 'NullPointerException in café ☕', 5);
  assert.deepEqual(Object.keys(obj).sort(), ['attribute', 'campaign', 'payload', 't']);
  assert.equal(decodePayload(base64Decode(obj.payload), 8).length, 8); // one HCMS report: a uint64
  dev.report('pid', (1n << 64n) - 1n, 5);
  dev.report('pid', 12345, 5);
  for (const [attr, value] of [['crash', 3], ['crash', 3n], ['pid', '3'], ['pid', -1], ['pid', 1n << 64n], ['pid', 2 ** 60],
    ['pid', true], ['pid', 2.5]]) {
    assert.throws(() => dev.report(attr, value, 5), (e) => e instanceof LDPError && /takes (strings|integers)/.test(e.message),
      `${attr} ${String(value)}`);
  }
  assert.deepEqual(dev.spentReports, { crash: 1, pid: 2 });
  assert.ok(close(dev.privacyLoss(), dev.campaign.attribute('crash').protocol.epsFirst + 2 * dev.campaign.attribute('pid').protocol.epsFirst));
  dev.report('crash', 'again', 5); // 4 + 1 + 1 + 4 <= 10: each report of a memoryless sketch spends its eps
  assert.throws(() => dev.report('crash', 'once more', 5), BudgetExceeded); // 14 > 10: refused
  const stored = JSON.stringify([...storage.map.entries()]);
  assert.ok(stored.includes('spent_reports'));
  assert.ok(!stored.includes('NullPointer') && !stored.includes('caf'));
});

const TREEHIST = {
  campaign: { id: 'treehist-test' },
  attributes: [
    { name: 'url', type: 'string', protocol: 'TreeHist', eps: 2.0, rows: 16, memo_slots: 256 },
    { name: 'pid', type: 'u64', protocol: 'TreeHist', eps: 2.0, eps_1: 1.0, bits: 64, step: 16, start_bits: 0, rows: 8 },
  ],
};

test('TreeHist device: memoized across restarts, one eps_inf per new prefix, frozen, no value stored', () => {
  const c = Campaign.fromJSON(TREEHIST);
  const url = c.attribute('url').protocol;
  assert.equal(url.seed, valueId('url'));
  assert.deepEqual(url.prefixBits, [5, 8, 11, 14, 17, 20, 23, 26, 29, 32]); // the reference's defaults
  assert.equal(url.params().k_prime, 32);
  const storage = new MemoryStorage();
  const vals = ['https://example.com/a?q=café', 'https://example.com/b', 'https://other.org/', 'p', 'q', 'r', 's'];
  let dev = new Device(TREEHIST, storage, { budgetEps: null });
  const first = bytesToHex(dev.randomize('url', vals[0]));
  assert.equal(first.length, 10);
  assert.equal(bytesToHex(dev.randomize('url', vals[0])), first); // memoized, no IRR: the same bytes
  assert.equal(dev.memoizedCount('url'), 1);
  assert.ok(close(dev.privacyLoss('url'), url.epsInf));
  dev.randomize('pid', (1n << 64n) - 1n);
  dev = new Device(TREEHIST, storage, { budgetEps: null }); // restarted: memo key and slots restored
  assert.equal(bytesToHex(dev.randomize('url', vals[0])), first);
  assert.equal(dev.memoizedCount('url'), 1);
  const stored = JSON.stringify([...storage.map.entries()]);
  const id = valueId(vals[0]);
  assert.ok(!stored.includes('example.com') && !stored.includes(String(id)) && !stored.includes(hex64(id)));
  assert.ok(!stored.includes(String((1n << 64n) - 1n)) && !stored.includes('ffffffffffffffff'));
  const budgeted = new Device(TREEHIST, new MemoryStorage(), { budgetEps: 2 * url.epsInf + 1e-9 });
  const reps = [];
  let froze = false;
  for (const v of vals) {
    reps.push(bytesToHex(budgeted.randomize('url', v)));
    if (budgeted.memoizedCount('url') === 2 && budgeted.frozen('url') && reps.length > 2 && reps.at(-1) === reps.at(-2)) {
      froze = true;
      break;
    }
  }
  assert.ok(froze, 'no report froze');
  assert.ok(budgeted.privacyLoss() <= budgeted.reservedLoss() + 1e-12);
  assert.throws(() => budgeted.randomize('pid', 5), BudgetExceeded);
  // the frozen draw is randomize's, byte for byte (the IRR of eps_1 included)
  const pid = c.attribute('pid').protocol;
  const st = pid.newState(keyTape([bytesToHex(new Uint8Array(32).fill(7))]));
  for (let i = 0; i < 20; i++) {
    const v = [0n, 1n, (1n << 64n) - 1n, 1n << 63n][i % 4];
    const k = bytesToHex(crypto.getRandomValues(new Uint8Array(32)));
    const want = bytesToHex(pid.randomize(v, { keys: keyTape([k]), state: st.copy() }));
    assert.equal(bytesToHex(pid.fromMemoized(pid.memoizedOutput(v, st), keyTape([k]))), want);
  }
});

test('TreeHist device: one eps_inf per distinct prefix (tags, not slots), kept across restarts, a full table refuses', () => {
  // one tag (memo_slots = 64): the first prefix is charged once however often it repeats; a second is refused
  const small = { campaign: { id: 'treehist-tags' },
    attributes: [{ name: 'u', type: 'u64', protocol: 'TreeHist', eps: 2.0, bits: 64, step: 16, start_bits: 0, rows: 4,
      memo_slots: 64 }] };
  const proto = Campaign.fromJSON(small).attribute('u').protocol;
  assert.equal(proto.memoTags, 1);
  const storage = new MemoryStorage();
  let dev = new Device(small, storage, { budgetEps: null });
  for (let i = 0; i < 3; i++) dev.randomize('u', 0n);
  assert.equal(dev.memoizedCount('u'), 1);
  assert.ok(close(dev.privacyLoss('u'), proto.epsInf));
  dev = new Device(small, storage, { budgetEps: null }); // restarted: the tag restored, the repeat still free
  dev.randomize('u', 0n);
  assert.equal(dev.memoizedCount('u'), 1);
  assert.throws(() => dev.randomize('u', (1n << 64n) - 1n), MemoTableFull); // another prefix at every level
  assert.equal(dev.memoizedCount('u'), 1);
  assert.ok(close(dev.privacyLoss('u'), proto.epsInf));
  // the library level: a full table meeting a new prefix overflows (Infinity), a repeat does not
  const st = proto.newState(keyTape([bytesToHex(new Uint8Array(32).fill(3))]));
  assert.equal(proto.markTag(5n, st), 1);
  assert.equal(proto.markTag(5n, st), 0);
  assert.equal(proto.memoizedCount(st), 1);
  assert.equal(proto.markTag(6n, st), -1);
  assert.equal(proto.memoizedCount(st), Infinity);
  assert.equal(proto.longitudinalLoss(proto.memoizedCount(st)), Infinity);
  // a memo state of an earlier release (slot bits: a word with its low bit clear) is refused until reset
  const legacy = proto.newState(keyTape([bytesToHex(new Uint8Array(32).fill(4))]));
  legacy.seen[2] = 0x10;
  assert.equal(proto.memoizedCount(legacy), Infinity);
  const key = [...storage.map.keys()].find((k) => k.includes('u') && k.includes('memo'));
  assert.ok(key, `no memo entry in ${[...storage.map.keys()]}`);
  const obj = JSON.parse(storage.map.get(key));
  obj.cells = [20];
  storage.map.set(key, JSON.stringify(obj));
  dev = new Device(small, storage, { budgetEps: null });
  assert.throws(() => dev.randomize('u', 0n), DeviceStateError);
  dev.reset('u', { acceptPrivacyLoss: true });
  dev.randomize('u', 0n);
  assert.equal(dev.memoizedCount('u'), 1);
});
