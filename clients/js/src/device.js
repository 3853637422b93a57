// The device: its ledger (memo states, lifetime budget) plus the single-report JSON and sending to the ingest
// (producers/sdk.py Device.report / send / report_group / send_group).
//
// A report is randomized ONCE, on the device, from the platform CSPRNG (memo keys, one fresh 256-bit noise key
// per report) through ChaCha20 streams; what leaves the device is {campaign, attribute, t, payload} where the
// payload holds only the randomized report bytes. send() POSTs it with one Idempotency-Key and sends the very
// same bytes again after a network error, a 5xx or a 409 (exponential backoff): never a second randomization.
import { Campaign } from './campaign.js';
import { Ledger } from './ledger.js';
import { cryptoKeys, bytesToHex, randomBytes } from './chacha.js';
import { FileStorage } from './storage.js';
import { LDPError } from './util.js';
import { COMPACT_CONTENT_TYPE, base64Decode, checkStep, encodeCompact, encodeSingleReport } from './wire.js';

/** The ingest did not accept a request (`status` null if it could not be reached). */
export class IngestError extends LDPError {
  constructor(message, status = null, body = '') {
    super(message);
    this.name = 'IngestError';
    this.status = status;
    this.body = body;
  }
}

/** A failure after which the same request may be sent again: no answer, a 5xx, or 409 (still in progress). */
export function retryable(exc) {
  return exc.status === null || exc.status >= 500 || exc.status === 409;
}

/** 128 random bits as 32 hex digits (one per request; the same on its retries). */
export function idempotencyKey() {
  return bytesToHex(randomBytes(16));
}

/**
 * POST one report object, or a list of them (one request), as JSON; IngestError unless the answer is 2xx.
 * `body` may be given as the exact string to send (retries send the same bytes).
 */
export async function postReport(url, obj, { timeoutSeconds = 10, token = null, idempotencyKey: key = null,
  fetch: fetchFn = globalThis.fetch } = {}) {
  const binary = obj instanceof Uint8Array;
  const body = binary || typeof obj === 'string' ? obj : JSON.stringify(obj);
  const headers = { 'Content-Type': binary ? COMPACT_CONTENT_TYPE : 'application/json', Accept: 'application/json' };
  if (token) headers.Authorization = `Bearer ${token}`;
  if (key) headers['Idempotency-Key'] = key;
  const ctl = typeof AbortController === 'function' ? new AbortController() : null;
  const timer = ctl ? setTimeout(() => ctl.abort(), timeoutSeconds * 1000) : null;
  let resp;
  let text;
  try {
    resp = await fetchFn(url, { method: 'POST', headers, body, signal: ctl?.signal });
    text = await resp.text();
  } catch (exc) {
    throw new IngestError(`cannot reach ingest endpoint ${url}: ${exc?.cause?.code ?? exc?.message ?? exc}`);
  } finally {
    if (timer) clearTimeout(timer);
  }
  if (!resp.ok) {
    throw new IngestError(`ingest endpoint ${url} rejected the report: HTTP ${resp.status}: ${text.slice(0, 500)}`, resp.status, text);
  }
  try {
    return text.trim() ? JSON.parse(text) : { status: resp.status };
  } catch {
    return { status: resp.status, body: text };
  }
}

const sleep = (s) => new Promise((r) => setTimeout(r, s * 1000));

/**
 * One device of a campaign (a Campaign or its JSON object) whose state lives in `storage`
 * (MemoryStorage, LocalStorageStorage, FileStorage, or any {get, set} of strings).
 */
export class Device extends Ledger {
  constructor(campaign, storage, { budgetEps = null, ingestUrl = null, token = null, timeoutSeconds = 10.0, retries = 3,
    backoffSeconds = 0.5, keys = cryptoKeys, fetch = null } = {}) {
    const c = campaign instanceof Campaign ? campaign : Campaign.fromJSON(campaign);
    if (!(retries >= 0) || !(backoffSeconds >= 0)) throw new RangeError(`retries and backoffSeconds must be >= 0, got ${retries} and ${backoffSeconds}`);
    super(c, storage, { budgetEps, keys });
    this.ingestUrl = ingestUrl;
    this.token = token; // the device's ingest token (`ldp tokens issue`), sent as Authorization: Bearer
    this.timeoutSeconds = timeoutSeconds;
    this.retries = Math.trunc(retries);
    this.backoffSeconds = Number(backoffSeconds);
    this.fetch = fetch;
  }

  /** Node: a Device whose state lives in the directory `dir` (FileStorage, atomic writes, locked). */
  static async open(campaign, dir, options = {}) {
    return new Device(campaign, await FileStorage.open(dir), options);
  }

  /** The time step of now: floor(unix time / time_step_seconds). */
  currentStep() {
    return this.campaign.stepAt();
  }

  /** The single-report JSON object of one randomized report (value: an index or a label, a numeric attribute's
   * measurement, or an open-domain attribute's string / u64 (a BigInt or a safe integer), hashed on the device). */
  report(attribute, value, t = null) {
    this.own(attribute); // an unknown or grouped attribute fails before anything is spent
    const step = checkStep(t === null ? this.currentStep() : t);
    return encodeSingleReport(this.campaign, attribute, step, this.randomize(attribute, value));
  }

  /** One report object per attribute the group's solution sends, in the group's attribute order. */
  reportGroup(group, values, t = null) {
    const g = this.campaign.group(group);
    this.groupValues(g, values); // clear errors before anything is reserved
    const step = checkStep(t === null ? this.currentStep() : t);
    return this.randomizeGroup(group, values).map(([name, bytes]) => encodeSingleReport(this.campaign, name, step, bytes));
  }

  /** Randomize once and POST to the ingest (retried with the same bytes and key); the ingest's JSON answer. */
  async send(attribute, value, t = null) {
    if (!this.ingestUrl) throw new IngestError('no ingestUrl configured for this device');
    return this.post(this.report(attribute, value, t));
  }

  /** reportGroup and POST its objects as one request (the ingest accepts or refuses it whole). */
  async sendGroup(group, values, t = null) {
    if (!this.ingestUrl) throw new IngestError('no ingestUrl configured for this device');
    return this.post(this.reportGroup(group, values, t));
  }

  /** POST report objects (of report / reportGroup) as ONE compact binary body (application/x-ldp-reports), with the
   * retries of send(); each section carries its attribute's fingerprint, and a null `t` the receiving step. */
  async sendBinary(objs) {
    if (!this.ingestUrl) throw new IngestError('no ingestUrl configured for this device');
    const items = Array.isArray(objs) ? objs : [objs];
    const sections = items.map((o) => {
      if (o?.campaign !== this.campaign.id) {
        throw new LDPError(`report of campaign ${JSON.stringify(o?.campaign)}, this device reports '${this.campaign.id}'`);
      }
      const attribute = String(o.attribute);
      return { campaign: this.campaign.id, attribute, fingerprint: this.campaign.wireFingerprint(attribute),
        t: o.t ?? null, payload: base64Decode(o.payload) };
    });
    return this.post(encodeCompact(sections));
  }

  /** POST report objects (a JSON body) or a compact body (Uint8Array) with one Idempotency-Key and the retries of
   * send(). */
  async post(objs) {
    const key = idempotencyKey();
    const body = objs instanceof Uint8Array ? objs : JSON.stringify(objs); // the same bytes on every attempt
    for (let attempt = 0; ; attempt++) {
      try {
        return await postReport(this.ingestUrl, body, { timeoutSeconds: this.timeoutSeconds, token: this.token,
          idempotencyKey: key, fetch: this.fetch ?? globalThis.fetch });
      } catch (exc) {
        if (!(exc instanceof IngestError) || attempt >= this.retries || !retryable(exc)) throw exc;
        await sleep(this.backoffSeconds * 2 ** attempt);
      }
    }
  }
}
