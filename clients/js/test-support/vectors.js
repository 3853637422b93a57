// Shared by the tests (outside test/, so that `node --test` does not run it as a test file): the randomizer vectors of the Python reference (tests/data/randomizer-vectors.json).
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { dirname, join } from 'node:path';

const here = dirname(fileURLToPath(import.meta.url));
export const VECTORS_PATH = join(here, '..', '..', '..', 'tests', 'data', 'randomizer-vectors.json');
export const FIXTURES = join(here, 'fixtures');

/** Python's json writes Infinity / NaN as bare tokens: read them back as numbers. */
export function loadPythonJson(text) {
  const mark = '__python_float__';
  const marked = text.replace(/:\s*(-?Infinity|NaN)(?=\s*[,\n}\]])/g, `: "${mark}$1"`);
  return JSON.parse(marked, (k, v) => (typeof v === 'string' && v.startsWith(mark) ? Number(v.slice(mark.length)) : v));
}

export const VECTORS = loadPythonJson(readFileSync(VECTORS_PATH, 'utf8'));

/** Floats compared with a relative tolerance (the libm of numpy and of V8 may differ in the last ulp). */
export function close(a, b, rel = 1e-12) {
  if (a === b) return true;
  if (typeof a !== 'number' || typeof b !== 'number') return false;
  return Math.abs(a - b) <= rel * Math.max(Math.abs(a), Math.abs(b));
}

/** Deep comparison with close() for floats. */
export function deepClose(a, b, rel = 1e-12) {
  if (Array.isArray(a)) return Array.isArray(b) && a.length === b.length && a.every((x, i) => deepClose(x, b[i], rel));
  if (a && typeof a === 'object') {
    if (!b || typeof b !== 'object') return false;
    const ka = Object.keys(a).sort();
    const kb = Object.keys(b).sort();
    return JSON.stringify(ka) === JSON.stringify(kb) && ka.every((k) => deepClose(a[k], b[k], rel));
  }
  return close(a, b, rel);
}

/** The ledger campaign of the vectors as JSON (tomllib's reading of its TOML; tests/test_js_client.py checks it). */
export const LEDGER_CAMPAIGN = JSON.parse(readFileSync(join(FIXTURES, 'ledger-campaign.json'), 'utf8'));

/** The campaign of the numeric ledger vectors as JSON (tomllib's reading of its TOML; tests/test_js_client.py checks it). */
export const NUMERIC_LEDGER_CAMPAIGN = JSON.parse(readFileSync(join(FIXTURES, 'ledger-numeric-campaign.json'), 'utf8'));
