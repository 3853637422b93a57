// Exact integer and high-precision arithmetic behind the numeric mechanisms' parameters (estimators/numeric):
// Python computes their integer thresholds with Fraction (exact rationals of doubles) and Decimal (60 or 80
// digits of exp and ln), then floors or ceils them. Here: BigInt rationals and BigInt fixed point with
// Q = 400 fractional bits (120 digits), so every floor / ceil agrees with Python's unless the exact value lies
// within 10^-60 of an integer (it never does: e^eps is transcendental for a rational eps != 0).

const Q = 400n; // fractional bits of the fixed point
const ONE = 1n << Q;

/** The double x as an exact rational [num, den] (den a power of two); x finite. */
export function ratioOf(x) {
  if (!Number.isFinite(x)) throw new RangeError(`not a finite number: ${x}`);
  if (x === 0) return [0n, 1n];
  const dv = new DataView(new ArrayBuffer(8));
  dv.setFloat64(0, x);
  const hi = dv.getUint32(0);
  const lo = dv.getUint32(4);
  const sign = hi >>> 31 ? -1n : 1n;
  const exp = (hi >>> 20) & 0x7ff;
  let mant = (BigInt(hi & 0xfffff) << 32n) | BigInt(lo);
  let e;
  if (exp === 0) e = -1074; // subnormal
  else {
    mant |= 1n << 52n;
    e = exp - 1075;
  }
  return e >= 0 ? [sign * (mant << BigInt(e)), 1n] : [sign * mant, 1n << BigInt(-e)];
}

/** floor(a / b) for BigInts, b > 0. */
export function floorDiv(a, b) {
  const q = a / b;
  return (a % b !== 0n && a < 0n) ? q - 1n : q;
}

/** ceil(a / b) for BigInts, b > 0. */
export function ceilDiv(a, b) {
  const q = a / b;
  return (a % b !== 0n && a > 0n) ? q + 1n : q;
}

export function bigMin(a, b) { return a < b ? a : b; }
export function bigMax(a, b) { return a > b ? a : b; }

/** a / b correctly rounded to a double (Python's int / int), a >= 0, b > 0. */
export function divToNumber(a, b) {
  if (a === 0n) return 0;
  // a quotient of at least 64 significant bits plus a sticky bit rounds once, correctly
  const shift = BigInt(Math.max(0, 66 - (a.toString(2).length - b.toString(2).length)));
  const num = a << shift;
  const q = num / b;
  const sticky = num % b !== 0n ? 1n : 0n;
  return Number((q << 1n) | sticky) / 2 ** (Number(shift) + 1);
}

let LN2 = null;

/** ln 2 in fixed point: 2 atanh(1/3). */
function ln2Fixed() {
  if (LN2 === null) LN2 = 2n * atanhFixed(ONE / 3n);
  return LN2;
}

/** atanh(y) = sum y^(2i+1) / (2i+1) in fixed point, |y| <= 1/3. */
function atanhFixed(y) {
  if (y < 0n) return -atanhFixed(-y); // odd; the series below runs on y >= 0 (>> floors)
  const y2 = (y * y) >> Q;
  let pow = y;
  let sum = 0n;
  for (let i = 1n; pow !== 0n; i += 2n) {
    sum += pow / i;
    pow = (pow * y2) >> Q;
  }
  return sum;
}

/**
 * e^x of the double x as a rational [num, den] (relative error below 2^-390): x = n ln2 + r, |r| <= 0.35,
 * e^r by its Taylor series in fixed point, times 2^n.
 */
export function expRatio(x) {
  const [xn, xd] = ratioOf(x);
  const n = Math.round(x / Math.LN2);
  const r = (xn << Q) / xd - BigInt(n) * ln2Fixed();
  let term = ONE;
  let sum = ONE;
  for (let i = 1n; term !== 0n; i++) {
    term = (term * r >> Q) / i;
    sum += term;
  }
  return n >= 0 ? [sum << BigInt(n), ONE] : [sum, ONE << BigInt(-n)];
}

/** ln(num / den) of positive BigInts, correctly rounded to a double (Python's Decimal ln at 60 digits). */
export function lnRatio(num, den) {
  if (num <= 0n || den <= 0n) throw new RangeError('lnRatio of a non-positive number');
  const k = num.toString(2).length - den.toString(2).length;
  const a = k >= 0 ? num : num << BigInt(-k);
  const b = k >= 0 ? den << BigInt(k) : den; // a / b in (1/2, 2)
  const y = ((a - b) << Q) / (a + b); // (r - 1) / (r + 1), |y| < 1/3
  const fixed = BigInt(k) * ln2Fixed() + 2n * atanhFixed(y);
  return Number(fixed) / 2 ** Number(Q);
}
