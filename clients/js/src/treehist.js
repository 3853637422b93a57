// TreeHist on the device (estimators/sketch/treehist.py; the draws of estimators/sketch/treehist_kernels.py, byte
// for byte): heavy hitters over the top `bits` bits of 64-bit value ids, one prefix-tree level per device, a public
// hash row per report, GRR over g = round(e^eps + 1) buckets.
//
// Levels: l_i = min(bits, start_bits + (i + 1) step), L = ceil((bits - start_bits) / step). Public seeds:
// rowSeeds(seed, L R + 1): level l, row j hashes with seeds[l R + j]; the last is unused (it placed a memoized input in a memo
// slot. Report: 5 bytes, the level (uint8), the row (uint16 LE), the bucket (uint16 LE).
// Draws (uniform integers by rejection against rejectionLimit; keep decisions (z >> 11) < T, T a 53-bit threshold:
// T1 the largest integer with T1 (g - 1) / (2^53 - T1) <= e^eps, T2 = floor(p2 2^53), 2^53 without IRR):
//   without a memo state: the noise slot of 6 words (noise key, NOISE, 0): 0 level, 1 row, 2 keep?, 3 other bucket,
//     4 and 5 the IRR's keep? and other bucket; rejections from the extension stream, one counter, in draw order;
//   with a memo state (key K): the level for life is the first accepted of words 0..7 of (K, "THVL", 0) (word 7 if
//     all are rejected) mod L; a = the smallest id of the device's level prefix; row, keep?, other bucket are words
//     0, 1, 2 of (K, PRR, a) (rejections: words 3, 4, ..): the first GRR is memoized per prefix; the IRR from words
//     4 and 5 of the noise slot (a noise key is drawn for every report).
// Memo accounting (the reference's tag table, byte for byte): the state's memo_slots bits (a multiple of 64) are
// T = memo_slots / 64 little-endian uint64 tags. The tag of a is word 0 of (K, "THTG", a) with its low bit set (the
// all-ones word replaced by 0xFF..FD), inserted by linear probing from slot tag mod T: found, a repeat (no new loss);
// else the first empty slot, one eps_inf. A full table meeting a new prefix writes the all-ones sentinel in slot 0:
// memoizedCount is then Infinity (the device refuses such a value instead: MemoTableFull); so is a state holding a
// nonzero word with its low bit clear (no tag table: an earlier release's slot bitset; the device refuses it).
import { NoiseDraws, Stream, DOMAINS } from './chacha.js';
import { expRatio, floorDiv, lnRatio } from './bigmath.js';
import { olhG } from './hashing.js';
import { MemoState, Rounds, grrChainEpsFirst, grrChainP2 } from './protocol.js';
import { OpenDomainProtocol, M64, rejectionLimit, rowSeeds, sketchHash, valueId } from './sketch.js';
import { LDPError, checkEps } from './util.js';

export const LEVEL = 0x4c564854; // "THVL": a TreeHist device's fixed level, a = 0
export const TAG = 0x47544854; // "THTG": the memo tag of a memoized prefix, a = the prefix's smallest id
export const OVERFLOW = (1n << 64n) - 1n; // slot 0 of an overflowed tag table
export const SLOT = 6;
export const REPORT_BYTES = 5;
const TWO53 = 1n << 53n;
const DEFAULT_START_BITS = 2;
const MAX_FIRST_LEVEL_BITS = 24;
const MAX_ROWS = 65536;

function integer(name, x) {
  if (typeof x !== 'number' || !Number.isInteger(x)) throw new LDPError(`TreeHist: ${name} must be an integer, got ${String(x)}`);
  return x;
}

/** The largest T (BigInt) with T (g - 1) / (2^53 - T) <= e^eps: floor(2^53 e / (e + g - 1)), e exact. */
export function grrThreshold53(eps, g) {
  const [num, den] = expRatio(eps);
  return floorDiv(TWO53 * num, num + BigInt(g - 1) * den);
}

/** The prefix lengths min(bits, start_bits + i step), i = 1 .. L (estimators.sketch.prefix.level_schedule). */
export function levelSchedule(bits, startBits, step) {
  integer('step', step);
  integer('start_bits', startBits);
  if (step < 1) throw new LDPError(`TreeHist: step must be a positive integer, got ${step}`);
  if (startBits < 0 || startBits >= bits) throw new LDPError(`TreeHist: start_bits must lie in [0, bits), got ${startBits}`);
  const L = Math.ceil((bits - startBits) / step);
  const out = [];
  for (let i = 1; i <= L; i++) out.push(Math.min(bits, startBits + i * step));
  if (out[0] > MAX_FIRST_LEVEL_BITS) {
    throw new LDPError(`TreeHist: the first level enumerates 2^${out[0]} prefixes; lower start_bits + step`);
  }
  return out;
}

function uniform(z, limit, m, draw, j) {
  while (z > limit) {
    z = draw(j);
    j += 1;
  }
  return [Number(z % BigInt(m)), j];
}

/** TreeHist (module comment): report uint8 [5], the level, the row (uint16 LE), the bucket (uint16 LE). */
export class TreeHist extends OpenDomainProtocol {
  constructor({ eps, bits = 32, step = 3, start_bits = null, rows = 1024, oracle = 'lh', k_prime = 32, seed = 0n,
    eps_1 = null, memo_slots = 4096 } = {}) {
    super();
    this.eps = checkEps('eps', eps);
    integer('bits', bits);
    if (bits < 1 || bits > 64) throw new LDPError(`TreeHist: bits must be an integer in [1, 64], got ${bits}`);
    this.bits = bits;
    if (oracle !== 'lh') throw new LDPError(`TreeHist: oracle must be one of ('lh',), got ${String(oracle)}`);
    this.oracle = oracle;
    integer('k_prime', k_prime);
    if (k_prime < 1) throw new LDPError(`TreeHist: k_prime must be a positive integer, got ${k_prime}`);
    this.kPrime = k_prime;
    const s0 = start_bits === null || start_bits === undefined ? (bits > DEFAULT_START_BITS ? DEFAULT_START_BITS : 0) : start_bits;
    this.prefixBits = levelSchedule(bits, s0, step);
    this.step = step;
    this.startBits = s0;
    this.L = this.prefixBits.length;
    integer('rows', rows);
    if (rows < 1 || rows > MAX_ROWS) throw new LDPError(`TreeHist: rows must be an integer in [1, ${MAX_ROWS}], got ${rows}`);
    this.R = rows;
    if (typeof seed === 'number' && !Number.isSafeInteger(seed)) {
      throw new LDPError(`seed ${seed} is not exact as a Number: pass it as a BigInt`);
    }
    if (typeof seed !== 'bigint' && typeof seed !== 'number') throw new LDPError(`TreeHist: seed must be an integer, got ${String(seed)}`);
    const big = BigInt(seed);
    if (big < 0n || big > M64) throw new LDPError(`TreeHist: seed must be an integer in [0, 2^64), got ${big}`);
    this.seed = big;
    integer('memo_slots', memo_slots);
    if (memo_slots < 64 || memo_slots % 64 !== 0) {
      throw new LDPError(`TreeHist: memo_slots must be a positive multiple of 64 (bits of memo state: memo_slots / 64 tags of 64 bits), got ${memo_slots}`);
    }
    this.memoSlots = memo_slots;
    this.g = olhG(this.eps);
    if (this.g > 65536) throw new LDPError(`TreeHist: eps = ${this.eps} needs g = ${this.g} > 2^16 buckets`);
    const seeds = rowSeeds(big, this.L * this.R + 1);
    this.memoSeed = seeds.pop();
    this.seeds = seeds;
    const g = this.g;
    this.t1 = grrThreshold53(this.eps, g);
    const p1 = Number(this.t1) / 2 ** 53;
    const q1 = (1.0 - p1) / (g - 1);
    this.eps1 = eps_1 === null || eps_1 === undefined ? null : checkEps('eps_1', eps_1);
    if (this.eps1 === null) {
      this.t2 = TWO53;
      this.rounds = new Rounds(p1, q1, 1.0, 0.0);
    } else {
      const p2 = grrChainP2(p1, q1, g, this.eps1, this.epsInf, 'exact', 'TreeHist');
      this.t2 = BigInt(Math.trunc(p2 * 2 ** 53));
      const p2q = Number(this.t2) / 2 ** 53;
      this.rounds = new Rounds(p1, q1, p2q, (1.0 - p2q) / (g - 1));
    }
    this.limL = rejectionLimit(this.L);
    this.limR = rejectionLimit(this.R);
    this.limG = rejectionLimit(g - 1);
  }

  get name() { return 'TreeHist'; }

  get longitudinal() { return true; }

  params() {
    return { protocol: this.name, eps: this.eps, bits: this.bits, step: this.step, start_bits: this.startBits,
      rows: this.R, oracle: this.oracle, k_prime: this.kPrime, seed: this.seed, eps_1: this.eps1,
      memo_slots: this.memoSlots };
  }

  /** ln(T1 (g - 1) / (2^53 - T1)), correctly rounded. */
  get epsInf() { return lnRatio(this.t1 * BigInt(this.g - 1), TWO53 - this.t1); }

  get epsFirst() { return this.eps1 === null ? this.epsInf : grrChainEpsFirst(this.rounds); }

  get memoSize() { return this.memoSlots; }

  /** One eps_inf per distinct memoized prefix (Infinity for an overflowed table). */
  longitudinalLoss(m) { return m * this.epsInf; }

  /** Tags in the device's table: at most this many distinct memoized prefixes are accounted. */
  get memoTags() { return this.memoSlots / 64; }

  static getTag(seen, s) {
    let t = 0n;
    for (let b = 7; b >= 0; b--) t = (t << 8n) | BigInt(seen[8 * s + b]);
    return t;
  }

  static setTag(seen, s, t) {
    for (let b = 0; b < 8; b++) seen[8 * s + b] = Number((t >> BigInt(8 * b)) & 0xffn);
  }

  /** Distinct memoized prefixes: the nonzero tags of the table; Infinity once it overflowed, or when a nonzero word
   * has its low bit clear (no tag table: the slot bitset of an earlier release). */
  memoizedCount(state) {
    if (TreeHist.getTag(state.seen, 0) === OVERFLOW) return Infinity;
    let c = 0;
    for (let s = 0; s < this.memoTags; s++) {
      const t = TreeHist.getTag(state.seen, s);
      if (t !== 0n && (t & 1n) === 0n) return Infinity;
      if (t !== 0n) c++;
    }
    return c;
  }

  /** The tag of the memoized input a: word 0 of (K, TAG, a), low bit set, never all ones. */
  memoTag(a, state) {
    const t = new Stream(state.key, TAG, a, 8).word(0) | 1n;
    return t === OVERFLOW ? OVERFLOW ^ 2n : t;
  }

  /** Insert a's tag (module comment): 1 new, 0 a repeat, -1 an overflowed table. */
  markTag(a, state) {
    const T = this.memoTags;
    if (TreeHist.getTag(state.seen, 0) === OVERFLOW) return -1;
    const t = this.memoTag(a, state);
    const h = Number(t % BigInt(T));
    for (let k = 0; k < T; k++) {
      const s = (h + k) % T;
      const c = TreeHist.getTag(state.seen, s);
      if (c === t) return 0;
      if (c === 0n) {
        TreeHist.setTag(state.seen, s, t);
        return 1;
      }
    }
    TreeHist.setTag(state.seen, 0, OVERFLOW);
    return -1;
  }

  get worstCaseLoss() { return this.longitudinalLoss(this.memoSlots); }

  get supportSize() { return this.L * (1 + this.R * this.g); }

  get reportItemsize() { return 1; }

  get reportDtype() { return 'uint8'; }

  get reportShape() { return [REPORT_BYTES]; }

  /** The device's level for life, from its memo key. */
  deviceLevel(state) {
    const s = new Stream(state.key, LEVEL, 0, 8);
    let w = s.word(7);
    for (let j = 0; j < 8; j++) {
      if (s.word(j) <= this.limL) {
        w = s.word(j);
        break;
      }
    }
    return Number(w % BigInt(this.L));
  }

  /** The memoized input of a value id (BigInt): the smallest id of the device's level prefix. */
  memoInput(id, state) {
    const shift = BigInt(64 - this.prefixBits[this.deviceLevel(state)]);
    return (BigInt(id) >> shift) << shift;
  }

  grr(x, keep, other, t53, draw, j) {
    if ((keep >> 11n) < t53) return [x, j];
    const [o, j2] = uniform(other, this.limG, this.g - 1, draw, j);
    return [o >= x ? o + 1 : o, j2];
  }

  /** One report: with `state` the memoized PRR (and the IRR with eps_1), inserting its memo tag; without it fresh
   * noise only. A noise key is drawn for every report. */
  randomize(v, { keys, state = null }) {
    const id = this.checkValue(v);
    if (state) this.checkState(state);
    return this.report(id, keys(), state, true);
  }

  randomizeValue(value, { keys, state = null }) {
    return this.randomize(valueId(value), { keys, state });
  }

  /** The device's PRR report of `v` (no IRR, nothing marked, no key drawn). */
  memoizedOutput(v, state) {
    if (!state) throw new LDPError('TreeHist.memoizedOutput needs a memo state');
    this.checkState(state);
    return this.report(this.checkValue(v), null, state, false);
  }

  /** A report from the device's memoized report `prr` (memoizedOutput of a value, 5 bytes): what randomize gives
   * for any value of that memoized input, one noise key drawn (the IRR on top with eps_1), nothing marked. A frozen
   * device reports its last value this way: its ledger records prr, never the value (producers/sdk.py). */
  fromMemoized(prr, keys) {
    if (!(prr instanceof Uint8Array) || prr.length !== REPORT_BYTES) throw new LDPError(`a TreeHist report has ${REPORT_BYTES} bytes`);
    const l = prr[0];
    const j = prr[1] | (prr[2] << 8);
    let y = prr[3] | (prr[4] << 8);
    if (l >= this.L || j >= this.R || y >= this.g) throw new LDPError('not a TreeHist report of these parameters');
    const nkey = keys();
    if (this.t2 < TWO53) {
      const nd = new NoiseDraws(nkey, SLOT);
      [y] = this.grr(y, nd.word(4), nd.word(5), this.t2, (i) => nd.word(i), SLOT);
    }
    return new Uint8Array([l, j & 0xff, j >> 8, y & 0xff, y >> 8]);
  }

  checkState(state) {
    if (!(state instanceof MemoState) || state.fingerprint !== this.fingerprint) {
      throw new LDPError(`memo state belongs to another protocol configuration (state ${state?.fingerprint}, protocol ${this.fingerprint})`);
    }
  }

  report(id, nkey, state, fresh) {
    const nd = nkey === null ? null : new NoiseDraws(nkey, SLOT);
    const nw = (j) => nd.word(j);
    let jn = SLOT;
    let l, j, jp, a, prr;
    if (state) {
      l = this.deviceLevel(state);
      const shift = BigInt(64 - this.prefixBits[l]);
      a = (id >> shift) << shift;
      prr = new Stream(state.key, DOMAINS.PRR, a, 8);
      [j, jp] = uniform(prr.word(0), this.limR, this.R, (i) => prr.word(i), 3);
    } else {
      [l, jn] = uniform(nd.word(0), this.limL, this.L, nw, jn);
      [j, jn] = uniform(nd.word(1), this.limR, this.R, nw, jn);
    }
    const x = sketchHash(id >> BigInt(64 - this.prefixBits[l]), this.seeds[l * this.R + j], this.g);
    let y;
    if (state) {
      [y, jp] = this.grr(x, prr.word(1), prr.word(2), this.t1, (i) => prr.word(i), jp);
      if (fresh) this.markTag(a, state);
    } else {
      [y, jn] = this.grr(x, nd.word(2), nd.word(3), this.t1, nw, jn);
    }
    if (fresh && this.t2 < TWO53) [y, jn] = this.grr(y, nd.word(4), nd.word(5), this.t2, nw, jn);
    return new Uint8Array([l, j & 0xff, j >> 8, y & 0xff, y >> 8]);
  }
}
