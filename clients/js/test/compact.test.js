// The compact binary body (application/x-ldp-reports) against the wire-format vectors (tests/data/wire-vectors.json):
// every valid body re-encoded byte for byte from its sections, with the fingerprints the client computes for the
// vectors' campaign (a group attribute's included), and sendBinary's request.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { Campaign, Device, MemoryStorage, encodeCompact, encodePayload, hexToBytes, bytesToHex } from '../src/index.js';

const WIRE = JSON.parse(readFileSync(fileURLToPath(new URL('../../../tests/data/wire-vectors.json', import.meta.url)), 'utf8'));
// the vectors' campaign TOML as JSON (tomllib's reading; tests/test_js_client.py checks it)
const campaign = Campaign.fromJSON(JSON.parse(readFileSync(fileURLToPath(new URL('../test-support/fixtures/wire-campaign.json', import.meta.url)), 'utf8')));

function sectionsOf(vector) {
  return vector.sections.map((s) => {
    const proto = campaign.reportProtocol(s.attribute);
    const bytes = new Uint8Array(s.count * proto.reportNbytes);
    const payload = encodePayload(bytes, s.count);
    return { campaign: s.campaign, attribute: s.attribute, fingerprint: s.fingerprint, t: s.t, payload, count: s.count };
  });
}

test('every valid wire vector is re-encoded byte for byte', () => {
  for (const v of WIRE.valid) {
    const body = hexToBytes(v.hex);
    // the payload bytes are the vector's own (the body's tail after each section's names)
    const sections = [];
    let o = 8;
    const dv = new DataView(body.buffer, body.byteOffset);
    for (const s of v.sections) {
      const cl = body[o + 21];
      const al = body[o + 22];
      const len = dv.getUint32(o + 16, true);
      const start = o + 24 + cl + al;
      sections.push({ campaign: s.campaign, attribute: s.attribute, fingerprint: campaign.wireFingerprint(s.attribute),
        t: s.t, payload: body.slice(start, start + len) });
      o = start + len;
    }
    assert.equal(bytesToHex(encodeCompact(sections)), v.hex, v.name);
  }
});

test('the client computes every attribute fingerprint of the vectors, a group attribute included', () => {
  const seen = new Set();
  for (const v of WIRE.valid) for (const s of v.sections) {
    assert.equal(campaign.wireFingerprint(s.attribute), s.fingerprint, s.attribute);
    seen.add(s.attribute);
  }
  assert.ok(seen.has('language') && seen.has('dark_mode'));
});

test('a body without a report payload or with a bad fingerprint is refused', () => {
  const [s] = sectionsOf(WIRE.valid[0]);
  assert.throws(() => encodeCompact([{ ...s, payload: new Uint8Array(3) }]), /holds no report payload/);
  assert.throws(() => encodeCompact([{ ...s, fingerprint: 'xyz' }]), /16 hex digits/);
  assert.throws(() => encodeCompact([]), /1 to 256 sections/);
});

test('sendBinary posts one compact body with the retries of send', async () => {
  const calls = [];
  const fetch = async (url, init) => {
    calls.push(init);
    return calls.length === 1 ? new Response('busy', { status: 503 }) : new Response('{"accepted": 2}', { status: 200 });
  };
  const dev = new Device(campaign, new MemoryStorage(), { ingestUrl: 'http://ingest/reports', fetch, backoffSeconds: 0 });
  const objs = [dev.report('grr', 1, 28000000), dev.report('olh', 3, 28000000)];
  assert.deepEqual(await dev.sendBinary(objs), { accepted: 2 });
  assert.equal(calls.length, 2);
  assert.equal(calls[0].headers['Content-Type'], 'application/x-ldp-reports');
  assert.deepEqual(calls[0].body, calls[1].body);
  assert.equal(calls[0].headers['Idempotency-Key'], calls[1].headers['Idempotency-Key']);
  assert.equal(bytesToHex(calls[0].body.slice(0, 8)), '4c44504301000200');
});
