#!/usr/bin/env node
// Send one report per device for N devices through an ldp-stream ingest, and print a JSON summary.
//
//   node examples/send.mjs --campaign campaign.json --ingest http://127.0.0.1:8080/reports --state DIR \
//        --devices 30 --attribute app_version --value 3 --value 42 [--t STEP] [--budget EPS] [--token T]
//   node examples/send.mjs ... --attribute session_seconds --value 12.5 --value=-4   # a numeric attribute
//   node examples/send.mjs ... --group device --values '{"dark_mode": "on", "country": 3}'
//
// campaign.json: the campaign TOML as JSON (python -c 'import json,sys,tomllib;
//   print(json.dumps(tomllib.load(open(sys.argv[1], "rb"))))' campaign.toml > campaign.json).
// Device i keeps its state (memo keys, ledger) in DIR/device-<i> and reports values[i mod len(values)].
// The summary lists each device's report objects (their base64 payloads: the randomized report bytes, what
// left the device) and the ingest's answer. Exit status 0 iff every report was accepted.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { Campaign, Device, IngestError } from '../src/index.js';

const { values: opts } = parseArgs({
  options: {
    campaign: { type: 'string' },
    ingest: { type: 'string' },
    state: { type: 'string' },
    devices: { type: 'string', default: '1' },
    t: { type: 'string' },
    attribute: { type: 'string' },
    value: { type: 'string', multiple: true },
    group: { type: 'string' },
    values: { type: 'string' },
    budget: { type: 'string' },
    token: { type: 'string' },
    'token-file': { type: 'string' },
    concurrency: { type: 'string', default: '8' },
    retries: { type: 'string', default: '3' },
  },
});

function usage(msg) {
  process.stderr.write(`send.mjs: ${msg}\n`);
  process.exit(2);
}

if (!opts.campaign || !opts.ingest || !opts.state) usage('--campaign, --ingest and --state are required');
if (!opts.group === !opts.attribute) usage('give --attribute with --value ..., or --group with --values');
const campaign = Campaign.fromJSON(JSON.parse(readFileSync(opts.campaign, 'utf8')));
const n = Number(opts.devices);
if (!Number.isInteger(n) || n < 1) usage(`--devices must be a positive integer, got ${opts.devices}`);
const t = opts.t === undefined ? campaign.stepAt() : Number(opts.t);
const token = opts.token ?? (opts['token-file'] ? readFileSync(opts['token-file'], 'utf8').trim() : null);
const budgetEps = opts.budget === undefined ? null : Number(opts.budget);
// a value is an index (digits) or a label; a numeric attribute's value a number (12.5, -3, 1e3)
const numeric = Boolean(opts.attribute) && campaign.attribute(opts.attribute).numeric;
const parseValue = (s) => (numeric ? Number(s) : /^\d+$/.test(s) ? Number(s) : s);
let values;
if (opts.attribute) {
  if (!opts.value?.length) usage('--attribute needs at least one --value');
  values = opts.value.map(parseValue);
} else {
  if (!opts.values) usage('--group needs --values (a JSON object or array)');
  const v = JSON.parse(opts.values);
  values = [v];
}

async function one(i) {
  const dev = await Device.open(campaign, join(opts.state, `device-${i}`), {
    budgetEps, ingestUrl: opts.ingest, token, retries: Number(opts.retries), backoffSeconds: 0.2,
  });
  const value = values[i % values.length];
  const out = { device: i, value, t };
  try {
    const reports = opts.attribute ? [dev.report(opts.attribute, value, t)] : dev.reportGroup(opts.group, value, t);
    out.reports = reports;
    out.reply = await dev.post(opts.attribute ? reports[0] : reports);
    out.ok = true;
  } catch (exc) {
    out.ok = false;
    out.error = `${exc.name}: ${exc.message}`;
    if (exc instanceof IngestError) out.status = exc.status;
  } finally {
    dev.close();
  }
  return out;
}

const results = new Array(n);
let next = 0;
const workers = Array.from({ length: Math.max(1, Math.min(Number(opts.concurrency), n)) }, async () => {
  while (next < n) {
    const i = next++;
    results[i] = await one(i);
  }
});
const started = performance.now();
await Promise.all(workers);
const accepted = results.reduce((a, r) => a + (r.ok ? Number(r.reply?.accepted ?? 0) : 0), 0);
const summary = {
  campaign: campaign.id,
  scope: opts.attribute ?? `group:${opts.group}`,
  t,
  devices: n,
  sent: results.filter((r) => r.ok).length,
  accepted,
  failed: results.filter((r) => !r.ok).length,
  seconds: Number(((performance.now() - started) / 1000).toFixed(3)),
  results,
};
process.stdout.write(`${JSON.stringify(summary, null, 1)}\n`);
process.exit(summary.failed ? 1 : 0);
