// ldp-stream-device: the device side of ldp-stream in JavaScript (browsers and Node >= 20.19).
export { DOMAINS, Stream, NoiseDraws, randomKey, cryptoKeys, keyTape, hexToBytes, bytesToHex } from './chacha.js';
export {
  LDPError, InfeasibleParameters, quantize32, threshold32, roundHalfEven, fingerprintOf, canonicalJson, pyFloatRepr,
  formatG,
} from './util.js';
export { MemoState, Protocol } from './protocol.js';
export { make, fromParams, parameters, PROTOCOLS, makeOpen, OPEN_PROTOCOLS } from './registry.js';
export { OpenDomainProtocol, valueId, sketchHash, rowSeeds, spread, mix64 as sketchMix64, flipThreshold } from './sketch.js';
export { CMS, HCMS } from './cms.js';
export { TreeHist, grrThreshold53, levelSchedule, TAG as TREEHIST_TAG } from './treehist.js';
export { GRR, LGRR, grrProbabilities } from './direct.js';
export { SUE, OUE, LOUE, LSUE, LOSUE, LSOUE, ueChain } from './unary.js';
export { ADP, LADP } from './adaptive.js';
export { HR, FHR } from './hadamard.js';
export { BLH, OLH, LOLOHA, lhHash } from './hashing.js';
export { DBitFlipPM } from './bitflip.js';
export { SS } from './subset.js';
export { SHE, THE, theOptimalTheta } from './histogram.js';
export { NumericMechanism, Laplace, Duchi, PM, HM, SW, OneBitMean, MECHANISMS, makeNumeric, toUnit, readReport,
  EPS_STAR } from './numeric.js';
export { makeSolution, SOLUTIONS, MultiState, Solution, amplifiedEps } from './multidim.js';
export { Campaign, CampaignError, Attribute, Group, MAX_STEP, ATTRIBUTE_TYPES, MAX_TOP, MAX_CANDIDATES } from './campaign.js';
export { encodePayload, decodePayload, encodeSingleReport, base64Encode, base64Decode, checkStep, encodeCompact,
  COMPACT_CONTENT_TYPE } from './wire.js';
export { Ledger, BudgetExceeded, DeviceStateError, MemoTableFull, budgetPlan } from './ledger.js';
export { Device, IngestError, postReport, retryable, idempotencyKey } from './device.js';
export { MemoryStorage, LocalStorageStorage, FileStorage } from './storage.js';
