#!/usr/bin/env node
// Read a worker's final estimates of one attribute and print the current answer of every step, as JSON lines.
//
//   node examples/consume-estimates.mjs --url http://127.0.0.1:6066 --campaign fleet-health --attribute opt_in \
//        [--every SECONDS]
//
// It reads GET /estimates/{campaign}/{attribute}/history (docs/estimates.md): the worker's retained finals, one
// per step (its highest revision). With --every it polls and prints a step again when a revision (late data)
// changed its answer. An answer whose status is "insufficient" (fewer reports than the campaign's min_n) has no
// frequencies. Documents of a schema_version it does not know are skipped; fields it does not know are ignored.
// (Reading the Kafka topic ldp.estimates itself needs a Kafka client, which this package does not depend on:
// examples/consume_estimates.py of the repository does it in Python.) Node >= 18 (fetch).
import { parseArgs } from 'node:util';

const KNOWN_VERSIONS = new Set([1]);

const { values: opts } = parseArgs({
  options: {
    url: { type: 'string' },
    campaign: { type: 'string' },
    attribute: { type: 'string' },
    every: { type: 'string' },
  },
});
if (!opts.url || !opts.campaign || !opts.attribute) {
  process.stderr.write('consume-estimates.mjs: --url, --campaign and --attribute are required\n');
  process.exit(2);
}

const seen = new Map(); // t -> revision printed

async function poll() {
  const path = `/estimates/${encodeURIComponent(opts.campaign)}/${encodeURIComponent(opts.attribute)}/history`;
  const res = await fetch(new URL(path, opts.url));
  const body = await res.json();
  if (!res.ok) throw new Error(`GET ${path}: HTTP ${res.status}: ${body.error}`);
  if (!KNOWN_VERSIONS.has(body.schema_version)) throw new Error(`unknown schema_version ${body.schema_version}`);
  for (const doc of body.estimates) {
    if (!KNOWN_VERSIONS.has(doc.schema_version) || !doc.final) continue;
    if (seen.has(doc.t) && seen.get(doc.t) >= doc.revision) continue; // nothing new for this step
    seen.set(doc.t, doc.revision);
    const answer = doc.status === 'ok' ? doc.frequencies : 'insufficient';
    process.stdout.write(`${JSON.stringify({ t: doc.t, revision: doc.revision, n: doc.n, answer })}\n`);
  }
}

await poll();
if (opts.every) {
  const ms = Number(opts.every) * 1000;
  for (;;) {
    await new Promise((resolve) => setTimeout(resolve, ms));
    await poll();
  }
}
