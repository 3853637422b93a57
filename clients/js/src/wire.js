// The wire formats a device produces (estimators/base.py FrequencyProtocol.encode, wire/single_report.py):
// the batch payload of one report ("LDPr", codec version 1, u32 LE count, the report bytes) and the
// single-report JSON object {campaign, attribute, t, payload: base64(payload)} that the ingest's POST /reports takes,
// and the compact binary body (application/x-ldp-reports, wire/compact.py; docs/wire-format.md section 3).
import { LDPError } from './util.js';
import { MAX_STEP } from './campaign.js';

export const MAGIC = [0x4c, 0x44, 0x50, 0x72]; // "LDPr"
export const CODEC_VERSION = 1;
export const HEADER_BYTES = 9;

/** The batch payload of `count` reports whose bytes are `reports` (concatenated). */
export function encodePayload(reports, count = 1) {
  const out = new Uint8Array(HEADER_BYTES + reports.length);
  out.set(MAGIC, 0);
  out[4] = CODEC_VERSION;
  new DataView(out.buffer).setUint32(5, count, true);
  out.set(reports, HEADER_BYTES);
  return out;
}

/** The report bytes of a one-report payload (checks the header); the inverse of encodePayload. */
export function decodePayload(payload, reportNbytes) {
  if (payload.length < HEADER_BYTES) throw new LDPError(`payload of ${payload.length} bytes is shorter than its header`);
  if (!MAGIC.every((b, i) => payload[i] === b)) throw new LDPError('payload does not start with the report magic');
  if (payload[4] !== CODEC_VERSION) throw new LDPError(`unsupported payload version ${payload[4]}`);
  const n = new DataView(payload.buffer, payload.byteOffset).getUint32(5, true);
  if (payload.length - HEADER_BYTES !== n * reportNbytes) throw new LDPError('payload body does not match its report count');
  return payload.subarray(HEADER_BYTES);
}

const B64 = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/';

/** Standard base64 with padding (what Python's base64.b64encode writes), on any platform. */
export function base64Encode(bytes) {
  let out = '';
  let i = 0;
  for (; i + 2 < bytes.length; i += 3) {
    const n = (bytes[i] << 16) | (bytes[i + 1] << 8) | bytes[i + 2];
    out += B64[n >> 18] + B64[(n >> 12) & 63] + B64[(n >> 6) & 63] + B64[n & 63];
  }
  if (i < bytes.length) {
    const n = (bytes[i] << 16) | ((i + 1 < bytes.length ? bytes[i + 1] : 0) << 8);
    out += B64[n >> 18] + B64[(n >> 12) & 63] + (i + 1 < bytes.length ? B64[(n >> 6) & 63] : '=') + '=';
  }
  return out;
}

export function base64Decode(text) {
  if (typeof text !== 'string' || text.length % 4 || /[^A-Za-z0-9+/=]/.test(text)) throw new LDPError('not base64');
  const pad = text.endsWith('==') ? 2 : text.endsWith('=') ? 1 : 0;
  const out = new Uint8Array((text.length / 4) * 3 - pad);
  let o = 0;
  for (let i = 0; i < text.length; i += 4) {
    const n = (B64.indexOf(text[i]) << 18) | (B64.indexOf(text[i + 1]) << 12)
      | ((text[i + 2] === '=' ? 0 : B64.indexOf(text[i + 2])) << 6) | (text[i + 3] === '=' ? 0 : B64.indexOf(text[i + 3]));
    if (o < out.length) out[o++] = (n >> 16) & 255;
    if (o < out.length) out[o++] = (n >> 8) & 255;
    if (o < out.length) out[o++] = n & 255;
  }
  return out;
}

/** t as an integer if the wire can carry it ([0, 2^32 - 1]), else LDPError. */
export function checkStep(t) {
  if (typeof t !== 'number' || !Number.isInteger(t) || t < 0 || t > MAX_STEP) {
    throw new LDPError(`time step must lie in [0, ${MAX_STEP}], got ${t}`);
  }
  return t;
}

/** The JSON object of one randomized report of attribute `attribute` at step t (wire.single_report). */
export function encodeSingleReport(campaign, attribute, t, reportBytes) {
  const proto = campaign.reportProtocol(attribute);
  if (reportBytes.length !== proto.reportNbytes) {
    throw new LDPError(`a report of '${attribute}' has ${proto.reportNbytes} bytes, got ${reportBytes.length}`);
  }
  return { campaign: campaign.id, attribute, t: checkStep(t), payload: base64Encode(encodePayload(reportBytes, 1)) };
}

export const COMPACT_CONTENT_TYPE = 'application/x-ldp-reports';
export const MAX_SECTIONS = 256;
export const MAX_REPORTS = 100000;
const SECTION_BYTES = 24;
const T_RECEIVED = 0x01;

function nameBytes(text, what) {
  const b = new TextEncoder().encode(text);
  if (!(b.length >= 1 && b.length <= 255)) throw new LDPError(`${what} ${JSON.stringify(text.slice(0, 20))} must be 1 to 255 utf-8 bytes`);
  return b;
}

/**
 * The compact binary body of `sections`, each {campaign, attribute, fingerprint (16 hex digits), t (null: the
 * receiving step), payload (a batch payload, Uint8Array)}: "LDPC" | version 1 | flags 0 | u16 sections, then per
 * section fingerprint 8 bytes | t u32 | count u32 | payload length u32 | flags u8 | campaign length u8 |
 * attribute length u8 | 0, the names and the payload (little-endian).
 */
export function encodeCompact(sections) {
  if (!(sections.length >= 1 && sections.length <= MAX_SECTIONS)) {
    throw new LDPError(`a body holds 1 to ${MAX_SECTIONS} sections, got ${sections.length}`);
  }
  const parts = [];
  let total = 0;
  sections.forEach((sec, i) => {
    const payload = sec.payload;
    const count = payload.length >= HEADER_BYTES ? new DataView(payload.buffer, payload.byteOffset).getUint32(5, true) : 0;
    if (payload.length < HEADER_BYTES || !MAGIC.every((b, j) => payload[j] === b) || payload[4] !== CODEC_VERSION || count < 1) {
      throw new LDPError(`section ${i} (${JSON.stringify(sec.attribute)}) holds no report payload`);
    }
    if (!/^[0-9a-f]{16}$/.test(sec.fingerprint)) throw new LDPError(`fingerprint must be 16 hex digits, got ${sec.fingerprint}`);
    const c = nameBytes(sec.campaign, 'campaign id');
    const a = nameBytes(sec.attribute, 'attribute name');
    const head = new Uint8Array(SECTION_BYTES);
    const dv = new DataView(head.buffer);
    for (let j = 0; j < 8; j++) head[j] = parseInt(sec.fingerprint.substr(2 * j, 2), 16);
    dv.setUint32(8, sec.t === null || sec.t === undefined ? 0 : checkStep(sec.t), true);
    dv.setUint32(12, count, true);
    dv.setUint32(16, payload.length, true);
    head[20] = sec.t === null || sec.t === undefined ? T_RECEIVED : 0;
    head[21] = c.length;
    head[22] = a.length;
    parts.push(head, c, a, payload);
    total += count;
  });
  if (total > MAX_REPORTS) throw new LDPError(`a body holds at most ${MAX_REPORTS} reports, got ${total}`);
  const size = 8 + parts.reduce((n, p) => n + p.length, 0);
  const out = new Uint8Array(size);
  out.set([0x4c, 0x44, 0x50, 0x43, 1, 0], 0); // "LDPC", version 1, flags 0
  new DataView(out.buffer).setUint16(6, sections.length, true);
  let o = 8;
  for (const p of parts) {
    out.set(p, o);
    o += p.length;
  }
  return out;
}
