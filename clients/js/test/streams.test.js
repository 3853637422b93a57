import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Stream, DOMAINS, hexToBytes, NoiseDraws } from '../src/chacha.js';
import { VECTORS } from '../test-support/vectors.js';

test('ChaCha20 stream words of every domain equal the vectors', () => {
  assert.equal(VECTORS.format, 'ldp-stream/randomizer-vectors');
  assert.equal(VECTORS.streams.length, Object.keys(DOMAINS).length);
  for (const s of VECTORS.streams) {
    assert.equal(DOMAINS[s.domain], s.domain_word, s.domain);
    const st = new Stream(hexToBytes(s.key), DOMAINS[s.domain], s.a);
    const words = s.words.map((_, j) => st.word(j).toString(16).padStart(16, '0'));
    assert.deepEqual(words, s.words, s.domain);
    // the halves, bytes and unit() agree with the 64-bit word
    for (let j = 0; j < s.words.length; j++) {
      const w = BigInt(`0x${s.words[j]}`);
      assert.equal(st.lo(j), Number(w & 0xffffffffn));
      assert.equal(st.hi(j), Number(w >> 32n));
      assert.equal(st.byte(j, 7), Number(w >> 56n));
      assert.equal(st.unit(j), Number(w >> 11n) * 2 ** -53);
    }
  }
});

test('RFC 8439 2.3.2 block vector (counter 1) through the stream API', () => {
  // key 00..1f, nonce 000000090000004a00000000, counter 1: the stream (domain 0x09000000, a = 0x4a000000) from word 8 on
  const key = Uint8Array.from({ length: 32 }, (_, i) => i);
  const st = new Stream(key, 0x09000000, 0x4a000000);
  const expected = '10f1e7e4d13b5915500fdd1fa32071c4c7d1f4c733c068030422aa9ac3d46c4e';
  let hex = '';
  for (let t = 0; t < 32; t++) hex += st.byte(8 + (t >> 3), t & 7).toString(16).padStart(2, '0');
  assert.equal(hex, expected);
});

test('noise draws: slot words from (key, NOISE, 0), then (key, NOISE_EXT, 0)', () => {
  const key = hexToBytes(VECTORS.streams[0].key);
  const d = new NoiseDraws(key, 3);
  const main = new Stream(key, DOMAINS.NOISE, 0);
  const ext = new Stream(key, DOMAINS.NOISE_EXT, 0);
  assert.equal(d.word(2), main.word(2));
  assert.equal(d.word(3), ext.word(0));
  assert.equal(d.word(12), ext.word(9));
});
