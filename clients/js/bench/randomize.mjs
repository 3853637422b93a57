// Reports per second of L-OSUE k=100 (eps_inf 4, eps_1 1) randomization on one core: one device, a fresh
// 256-bit noise key from the CSPRNG per report (as a real device), its memo key fixed, values cycling over
// 8 memoized values. `node bench/randomize.mjs [seconds] [k] [eps_inf] [eps_1]` (prints one JSON line)
import { make } from '../src/registry.js';
import { cryptoKeys } from '../src/chacha.js';

const [seconds, k, epsInf, eps1] = [2, 100, 4.0, 1.0].map((d, i) => Number(process.argv[2 + i] ?? d));
const proto = make('L-OSUE', { k, eps_inf: epsInf, eps_1: eps1 });
const state = proto.newState(cryptoKeys);

function run(ms) {
  const end = performance.now() + ms;
  let n = 0;
  let sink = 0;
  while (performance.now() < end) {
    for (let i = 0; i < 256; i++) sink ^= proto.randomize((n + i) & 7, { keys: cryptoKeys, state })[0];
    n += 256;
  }
  return [n, sink];
}

run(300); // warm-up (JIT)
const t0 = performance.now();
const [n] = run(seconds * 1000);
const dt = (performance.now() - t0) / 1000;
const rate = n / dt;
console.log(JSON.stringify({ protocol: proto.name, k: proto.k, eps_inf: epsInf, eps_1: eps1, reports: n, seconds: Number(dt.toFixed(3)),
  reports_per_second: Math.round(rate), report_bytes: proto.reportNbytes, node: process.version }));
