// Numbers as Python computes them: the 2^-32 grid, integer dtypes, Python's float repr and 'g' format,
// and the protocol fingerprints (sha256 of the canonical JSON of the parameters).
import { sha256 } from '@noble/hashes/sha2.js';
import { bytesToHex } from './chacha.js';

export class LDPError extends Error {
  constructor(message) {
    super(message);
    this.name = 'LDPError';
  }
}

export class InfeasibleParameters extends LDPError {
  constructor(message) {
    super(message);
    this.name = 'InfeasibleParameters';
  }
}

export const SCALE32 = 4294967296;

/** Python's round(x) for a double: the nearest integer, ties to even. */
export function roundHalfEven(x) {
  const f = Math.floor(x);
  const d = x - f;
  if (d > 0.5) return f + 1;
  if (d < 0.5) return f;
  return f % 2 === 0 ? f : f + 1;
}

/** p rounded to the 2^-32 grid on which 32-bit uniforms are compared (randomness.quantize32). */
export function quantize32(p) {
  return roundHalfEven(p * SCALE32) / SCALE32;
}

/** Integer threshold T with P(u32 < T) = quantize32(p) (randomness.threshold32), a Number <= 2^32. */
export function threshold32(p) {
  return roundHalfEven(p * SCALE32);
}

/** [hi, rest] with t = hi 2^24 + rest and hi <= 255 (t = 2^32 gives rest 2^24). */
export function splitThreshold(t) {
  const hi = Math.min(Math.floor(t / 16777216), 255);
  return [hi, t - hi * 16777216];
}

/** The smallest unsigned integer type holding [0, n): 1, 2 or 4 bytes (base.uint_dtype). */
export function uintBytes(n) {
  return n <= 256 ? 1 : n <= 65536 ? 2 : 4;
}

export function uintName(nbytes) {
  return { 1: 'uint8', 2: 'uint16', 4: 'uint32' }[nbytes];
}

/** Write an unsigned integer of `size` bytes little-endian. */
export function writeUint(buf, offset, size, v) {
  if (size === 1) buf[offset] = v;
  else if (size === 2) { buf[offset] = v & 0xff; buf[offset + 1] = (v >>> 8) & 0xff; }
  else { buf[offset] = v & 0xff; buf[offset + 1] = (v >>> 8) & 0xff; buf[offset + 2] = (v >>> 16) & 0xff; buf[offset + 3] = (v >>> 24) & 0xff; }
}

export function readUint(buf, offset, size) {
  if (size === 1) return buf[offset];
  if (size === 2) return buf[offset] | (buf[offset + 1] << 8);
  return (buf[offset] | (buf[offset + 1] << 8) | (buf[offset + 2] << 16)) + buf[offset + 3] * 16777216;
}

export function checkEps(name, eps) {
  const e = Number(eps);
  if (typeof eps === 'boolean' || !Number.isFinite(e) || e <= 0) {
    throw new LDPError(`${name} must be a finite positive number, got ${eps}`);
  }
  return e;
}

export function checkDomain(k, minimum = 2) {
  if (typeof k !== 'number' || !Number.isInteger(k) || k < minimum) {
    throw new LDPError(`k must be an integer >= ${minimum}, got ${k}`);
  }
  return k;
}

export function checkInt(name, value, lo, hi = null) {
  if (typeof value !== 'number' || !Number.isInteger(value) || value < lo || (hi !== null && value > hi)) {
    const span = hi !== null ? `in [${lo}, ${hi}]` : `>= ${lo}`;
    throw new LDPError(`${name} must be an integer ${span}, got ${value}`);
  }
  return value;
}

// ---------------------------------------------------------------- Python's float text
function digitsAndExponent(x) {
  // shortest round-trip digits (the same digits as Python's repr) and the decimal exponent
  const [mant, exp] = Math.abs(x).toExponential().split('e');
  return [mant.replace('.', ''), parseInt(exp, 10)];
}

/** repr(float) of Python (what json.dumps writes for a float). */
export function pyFloatRepr(x) {
  if (Number.isNaN(x)) return 'NaN';
  if (x === Infinity) return 'Infinity';
  if (x === -Infinity) return '-Infinity';
  if (x === 0) return Object.is(x, -0) ? '-0.0' : '0.0';
  const sign = x < 0 ? '-' : '';
  const [digits, exp] = digitsAndExponent(x);
  if (exp < -4 || exp >= 16) {
    const m = digits.length > 1 ? `${digits[0]}.${digits.slice(1)}` : digits;
    return `${sign}${m}e${exp < 0 ? '-' : '+'}${String(Math.abs(exp)).padStart(2, '0')}`;
  }
  if (exp < 0) return `${sign}0.${'0'.repeat(-exp - 1)}${digits}`;
  if (digits.length <= exp + 1) return `${sign}${digits}${'0'.repeat(exp + 1 - digits.length)}.0`;
  return `${sign}${digits.slice(0, exp + 1)}.${digits.slice(exp + 1)}`;
}

/** Python's format(x, '.{precision}g'). */
export function formatG(x, precision = 6) {
  if (Number.isNaN(x)) return 'nan';
  if (x === Infinity) return 'inf';
  if (x === -Infinity) return '-inf';
  const p = precision === 0 ? 1 : precision;
  if (x === 0) return Object.is(x, -0) ? '-0' : '0';
  const sign = x < 0 ? '-' : '';
  const [m, e] = Math.abs(x).toExponential(p - 1).split('e');
  const exp = parseInt(e, 10);
  const digits = m.replace('.', '');
  let out;
  if (exp < -4 || exp >= p) {
    let mm = digits.length > 1 ? `${digits[0]}.${digits.slice(1)}` : digits;
    if (mm.includes('.')) mm = mm.replace(/0+$/, '').replace(/\.$/, '');
    out = `${mm}e${exp < 0 ? '-' : '+'}${String(Math.abs(exp)).padStart(2, '0')}`;
  } else {
    if (exp < 0) out = `0.${'0'.repeat(-exp - 1)}${digits}`;
    else if (digits.length <= exp + 1) out = digits + '0'.repeat(exp + 1 - digits.length);
    else out = `${digits.slice(0, exp + 1)}.${digits.slice(exp + 1)}`;
    if (out.includes('.')) out = out.replace(/0+$/, '').replace(/\.$/, '');
  }
  return sign + out;
}

// ---------------------------------------------------------------- canonical JSON and fingerprints
/** Parameters that are Python floats (written "1.0", not "1"): budgets and thresholds. */
export const FLOAT_KEYS = new Set(['eps', 'eps_inf', 'eps_1', 'theta', 'variance_factor']);

/** A number to be written as a Python float whatever its value. */
export class PyFloat {
  constructor(value) {
    this.value = Number(value);
  }
}

function pyJson(value, key, sortKeys, sep) {
  if (value === null || value === undefined) return 'null';
  if (value instanceof PyFloat) return pyFloatRepr(value.value);
  if (typeof value === 'boolean') return value ? 'true' : 'false';
  if (typeof value === 'bigint') return value.toString(); // a 64-bit integer (an open-domain protocol's seed)
  if (typeof value === 'number') {
    if (FLOAT_KEYS.has(key) || !Number.isInteger(value)) return pyFloatRepr(value);
    return String(value);
  }
  if (typeof value === 'string') return JSON.stringify(value).replace(/[\u007f-\uffff]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`);
  if (Array.isArray(value)) return `[${value.map((v) => pyJson(v, key, sortKeys, sep)).join(sep[0])}]`;
  const keys = Object.keys(value);
  if (sortKeys) keys.sort();
  return `{${keys.map((k) => `${JSON.stringify(k)}${sep[1]}${pyJson(value[k], k, sortKeys, sep)}`).join(sep[0])}}`;
}

/** json.dumps(params, sort_keys=True, separators=(",", ":")) as Python writes it. */
export function canonicalJson(params) {
  return pyJson(params, null, true, [',', ':']);
}

/** Protocol / solution fingerprint: the first 16 hex digits of sha256(canonical JSON of the parameters). */
export function fingerprintOf(params) {
  return bytesToHex(sha256(new TextEncoder().encode(canonicalJson(params)))).slice(0, 16);
}

export function sha256Hex(bytes) {
  return bytesToHex(sha256(bytes));
}
