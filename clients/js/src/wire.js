// The wire formats a device produces (estimators/base.py FrequencyProtocol.encode, wire/single_report.py):
// the batch payload of one report ("LDPr", codec version 1, u32 LE count, the report bytes) and the
// single-report JSON object {campaign, attribute, t, payload: base64(payload)} that the ingest's POST /reports takes.
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
