// Typed API of ldp-stream-device (plain ES modules in src/, no build step).

// ---------------------------------------------------------------- randomness
/** A key source: a fresh 32-byte (256-bit) key per call, in the randomizer's draw order. */
export type KeySource = () => Uint8Array;

/** Stream domains (nonce word 0) of estimators/randomness.py. */
export declare const DOMAINS: Readonly<{
  PRR: number; NOISE: number; LH_SEED: number; BITFLIP_J: number; BITFLIP_BIT: number; NOISE_EXT: number;
  ONEBIT_ALPHA: number;
}>;

/** The ChaCha20 stream (key, domain, a): RFC 8439 keystream, nonce (domain, a mod 2^32, a >> 32), counter from 0. */
export declare class Stream {
  constructor(key: Uint8Array, domain: number, a?: number, prefetchWords?: number);
  lo(j: number): number;
  hi(j: number): number;
  byte(j: number, t: number): number;
  low24(j: number): number;
  /** (word j >> 11) * 2^-53: a uniform double in [0, 1) with 53 random bits. */
  unit(j: number): number;
  word(j: number): bigint;
}

/** A row's fresh-noise draws: its slot of (nkey, NOISE, 0), then (nkey, NOISE_EXT, 0). */
export declare class NoiseDraws {
  constructor(nkey: Uint8Array, slot: number);
  lo(j: number): number;
  unit(j: number): number;
  word(j: number): bigint;
  /** Words of the extension stream (nkey, NOISE_EXT, 0) read so far (diagnosis). */
  readonly extWords: number;
}

/** 32 bytes from crypto.getRandomValues. */
export declare function randomKey(): Uint8Array;
/** The key source of real devices: the platform CSPRNG. */
export declare const cryptoKeys: KeySource;
/** Replays recorded keys (hex) in order: test vectors only, never on a device (not private). */
export declare function keyTape(hexKeys: string[]): KeySource & { readonly left: number; drawn: number };
export declare function hexToBytes(hex: string): Uint8Array;
export declare function bytesToHex(bytes: Uint8Array): string;

// ---------------------------------------------------------------- numbers
export declare class LDPError extends Error {}
export declare class InfeasibleParameters extends LDPError {}
export declare function quantize32(p: number): number;
export declare function threshold32(p: number): number;
export declare function roundHalfEven(x: number): number;
/** json.dumps(params, sort_keys=True, separators=(",", ":")) as Python writes it. */
export declare function canonicalJson(params: unknown): string;
/** First 16 hex digits of sha256(canonicalJson(params)). */
export declare function fingerprintOf(params: unknown): string;
export declare function pyFloatRepr(x: number): string;
export declare function formatG(x: number, precision?: number): string;

// ---------------------------------------------------------------- protocols
/** A device's memo state for one protocol: its secret 256-bit key and its memoized cells. */
export declare class MemoState {
  constructor(fingerprint: string, key: Uint8Array, memoSize: number, seen?: Uint8Array | null);
  readonly fingerprint: string;
  readonly key: Uint8Array;
  readonly memoSize: number;
  seen: Uint8Array;
  has(cell: number): boolean;
  count(): number;
  cells(): number[];
  copy(): MemoState;
  toJSON(): { fingerprint: string; memo_size: number; key: string; cells: number[] };
  static fromJSON(obj: unknown): MemoState;
}

export interface RandomizeOptions {
  /** Key source for fresh noise (and nothing else): cryptoKeys on a device. */
  keys: KeySource;
  /** The device's memo state (memoizing protocols), updated in place (the memoized cell is marked). */
  state?: MemoState | null;
}

/** Protocol parameters as in the campaign TOML / estimators.make keywords. */
export type ProtocolParams = Record<string, number | bigint | string | boolean | null | undefined>;

export declare abstract class Protocol {
  readonly name: string;
  readonly k: number;
  readonly longitudinal: boolean;
  /** Canonical parameters (Python's proto.params()). */
  params(): Record<string, unknown>;
  readonly fingerprint: string;
  readonly epsFirst: number;
  readonly epsInf: number;
  readonly memoSize: number;
  readonly domainSize: number;
  readonly worstCaseLoss: number;
  longitudinalLoss(memoized: number): number;
  readonly reportItemsize: number;
  readonly reportDtype: string;
  readonly reportShape: number[];
  /** Bytes of one report (little-endian, as in the batch payload). */
  readonly reportNbytes: number;
  newState(keys: KeySource): MemoState | null;
  /** One report's bytes for value v in [0, k). */
  randomize(v: number, options: RandomizeOptions): Uint8Array;
  variance(n: number): number;
}

export type ProtocolName = 'GRR' | 'SUE' | 'OUE' | 'ADP' | 'L-GRR' | 'L-SUE' | 'L-OUE' | 'L-OSUE' | 'L-SOUE' | 'L-ADP'
  | 'HR' | 'FHR' | 'BLH' | 'OLH' | 'LOLOHA' | 'dBitFlipPM' | 'SS' | 'SHE' | 'THE';

export declare const PROTOCOLS: Record<ProtocolName, [new (params: ProtocolParams) => Protocol, string[], string[]]>;
/** make("L-OSUE", {k: 100, eps_inf: 2.0, eps_1: 1.0}); unknown or missing keywords are refused. */
export declare function make(name: ProtocolName | string, params?: ProtocolParams): Protocol;
/** Inverse of proto.params(); parameters with a `mechanism` (and no `protocol`) give a numeric mechanism, an
 * open-domain protocol's name (CMS, HCMS) an OpenDomainProtocol. */
export declare function fromParams(params: Record<string, unknown>): Protocol;
export declare function parameters(name: string): string[];

export declare class GRR extends Protocol { constructor(p: { k: number; eps: number }); readonly p: number; readonly q: number; }
export declare class LGRR extends Protocol { constructor(p: { k: number; eps_inf: number; eps_1: number; calibration?: 'exact' | 'paper' }); }
export declare class SUE extends Protocol { constructor(p: { k: number; eps: number }); }
export declare class OUE extends Protocol { constructor(p: { k: number; eps: number }); }
export declare class LOUE extends Protocol { constructor(p: { k: number; eps_inf: number; eps_1: number; calibration?: 'exact' | 'paper' }); }
export declare class LSUE extends LOUE {}
export declare class LOSUE extends LOUE {}
export declare class LSOUE extends LOUE {}
export declare class ADP extends Protocol { constructor(p: { k: number; eps: number }); readonly chosen: Protocol; }
export declare class LADP extends Protocol { constructor(p: { k: number; eps_inf: number; eps_1: number; calibration?: 'exact' | 'paper' }); readonly chosen: Protocol; }
export declare class HR extends Protocol { constructor(p: { k: number; eps: number }); readonly K: number; }
export declare class FHR extends Protocol { constructor(p: { k: number; eps: number }); readonly K: number; }
export declare class BLH extends Protocol { constructor(p: { k: number; eps: number }); readonly g: number; }
export declare class OLH extends Protocol { constructor(p: { k: number; eps: number }); readonly g: number; }
export declare class LOLOHA extends Protocol { constructor(p: { k: number; eps_inf: number; eps_1: number; g?: number | null; calibration?: 'exact' | 'paper' }); readonly g: number; }
export declare class DBitFlipPM extends Protocol { constructor(p: { k: number; b: number; d: number; eps_inf: number }); readonly b: number; readonly d: number; }
export declare class SS extends Protocol { constructor(p: { k: number; eps: number; omega?: number | null; layout?: 'auto' | 'bits' | 'indices' }); readonly omega: number; readonly layout: 'bits' | 'indices'; }
export declare class SHE extends Protocol { constructor(p: { k: number; eps: number }); readonly s: number; readonly bound: number; readonly slot: number; }
export declare class THE extends Protocol { constructor(p: { k: number; eps: number; theta?: number | null }); readonly theta: number; }
export declare function grrProbabilities(eps: number, m: number): [number, number];
export declare function theOptimalTheta(eps: number): number;
export declare function lhHash(seed: number, v: number, g: number): number;
export declare function ueChain(x: number, k: number, t1p: number, t1q: number, t2p: number, t2q: number,
  state: MemoState | null, keys: KeySource): Uint8Array;

// ---------------------------------------------------------------- multidimensional solutions
export declare class MultiState {
  fingerprint: string;
  /** The sampled attribute (sample / fake layouts), null for split solutions. */
  sampled: number | null;
  memos: (MemoState | null)[];
  /** The fixed fake inputs (longitudinal fake-data solutions), else null. */
  fake: number[] | null;
  /** Real-data reports per attribute (saturating at 255). */
  reported: number[];
  copy(): MultiState;
  toJSON(): Record<string, unknown>;
  static fromJSON(obj: unknown): MultiState;
}

export declare abstract class Solution {
  readonly name: string;
  readonly longitudinal: boolean;
  readonly layout: 'split' | 'sample' | 'fake';
  readonly ks: number[];
  readonly d: number;
  readonly channels: Protocol[];
  readonly sampling: 'fixed' | 'per-step' | null;
  params(): Record<string, unknown>;
  readonly fingerprint: string;
  readonly epsFirst: number;
  readonly epsInf: number;
  lossBound(memoized: number): number;
  longitudinalLoss(state: MultiState): number;
  newState(keys: KeySource): MultiState;
  /** One step: per attribute its report bytes, or null where the device sends nothing. */
  randomize(values: number[], options: { keys: KeySource; state?: MultiState | null }): (Uint8Array | null)[];
}

export type SolutionName = 'SPL' | 'SMP' | 'L-SPL' | 'L-SMP' | 'RS+FD' | 'ALLOMFREE' | 'L-RS+FD';
export declare const SOLUTIONS: Record<SolutionName, [new (params: Record<string, unknown>) => Solution, string[], string[]]>;
export declare function makeSolution(params: { solution: SolutionName | string; ks: number[]; [k: string]: unknown }): Solution;
export declare function amplifiedEps(eps: number, d: number): number;

// ---------------------------------------------------------------- open-domain protocols (type = "string" / "u64")
/** An open-domain value: a string (type "string"), or an integer in [0, 2^64) (type "u64": a BigInt, or a
 * non-negative safe integer Number). */
export type OpenValue = string | bigint | number;
/** The 64-bit id of a value: a string's little-endian first 8 bytes of the SHA-256 of its UTF-8 bytes (a string
 * with a lone surrogate is refused), an integer itself. */
export declare function valueId(value: OpenValue | Uint8Array): bigint;
/** The public seeds of `rows` hash functions: mix64(seed + j + 1). */
export declare function rowSeeds(seed: bigint | number, rows: number): bigint[];
/** mix64(seed * 0x9E3779B97F4A7C15 + 0x5348). */
export declare function spread(seed: bigint | number): bigint;
/** The SplitMix64 finalizer of z mod 2^64. */
export declare function sketchMix64(z: bigint): bigint;
/** h_rowSeed(id) = ((mix64(id ^ spread(rowSeed)) >> 32) * m) >> 32, in [0, m). */
export declare function sketchHash(id: bigint, rowSeed: bigint, m: number): number;
/** T = ceil(2^bits / (e^eps + 1)), at least 1. */
export declare function flipThreshold(eps: number, bits: number): number;

/** The device side of an open-domain protocol: ONE 64-bit value id per report (CMS, HCMS: fresh noise, no memo
 * state; TreeHist: memoizes with a memo state). */
export declare abstract class OpenDomainProtocol extends Protocol {
  readonly openDomain: true;
  readonly eps: number;
  readonly seed: bigint;
  /** The support size (a campaign attribute's k). */
  readonly supportSize: number;
  /** The report of a value id (BigInt, or a safe integer Number). */
  randomize(v: bigint | number, options: RandomizeOptions): Uint8Array;
  /** The report of a value: a string, or an integer id in [0, 2^64). */
  randomizeValue(value: OpenValue, options: { keys: KeySource; state?: MemoState | null }): Uint8Array;
}
/** What CMS and HCMS share. */
declare abstract class CountMeanSketch extends OpenDomainProtocol {
  readonly m: number;
  /** The sketch rows (Apple's k). */
  readonly k: number;
  readonly seeds: bigint[];
  /** The flip threshold and probability (T / 2^32 for CMS, T / 2^53 for HCMS). */
  readonly T: number;
  readonly q: number;
}
export interface SketchParams { eps: number; m: number; k: number; seed: bigint | number }
/** Apple's Count Mean Sketch: report uint8 [2 + ceil(m/8)], the row (uint16 LE) then m bits. */
export declare class CMS extends CountMeanSketch { constructor(p: SketchParams); }
/** Apple's Hadamard Count Mean Sketch (m a power of 2): report uint64 LE, ((j m + l) << 1) | bit. */
export declare class HCMS extends CountMeanSketch { constructor(p: SketchParams); }
/** TreeHist's keywords (estimators/sketch/treehist.py; the same defaults). */
export interface TreeHistParams { eps: number; bits?: number; step?: number; start_bits?: number | null; rows?: number;
  oracle?: 'lh'; k_prime?: number; seed?: bigint | number; eps_1?: number | null; memo_slots?: number }
/**
 * TreeHist: heavy hitters over the top `bits` bits of value ids, a prefix-tree level per device, a public hash row
 * per report, GRR over g = round(e^eps + 1) buckets. Report: uint8 [5], the level, the row (uint16 LE), the bucket
 * (uint16 LE). With a memo state the level is fixed by the memo key and the row and first GRR are memoized per level
 * prefix; eps_1 adds an IRR; one eps_inf per marked memo slot (memo_slots of them).
 */
export declare class TreeHist extends OpenDomainProtocol {
  constructor(p: TreeHistParams);
  readonly bits: number;
  readonly step: number;
  readonly startBits: number;
  readonly prefixBits: number[];
  readonly L: number;
  readonly R: number;
  readonly g: number;
  readonly eps1: number | null;
  readonly memoSlots: number;
  readonly seeds: bigint[];
  readonly memoSeed: bigint;
  /** The 53-bit keep thresholds of the first GRR and of the IRR (2^53: none). */
  readonly t1: bigint;
  readonly t2: bigint;
  /** The device's level for life, from its memo key. */
  deviceLevel(state: MemoState): number;
  /** The memoized input of a value id: the smallest id of the device's level prefix. */
  memoInput(id: bigint, state: MemoState): bigint;
  /** The device's memoized report of a value id (no IRR, nothing marked, no key drawn). */
  memoizedOutput(v: bigint | number, state: MemoState): Uint8Array;
  /** A report from a memoized one: randomize's bytes for any value of that memoized input (one key drawn). */
  fromMemoized(prr: Uint8Array, keys: KeySource): Uint8Array;
}
/** The largest T with T (g - 1) / (2^53 - T) <= e^eps. */
export declare function grrThreshold53(eps: number, g: number): bigint;
/** TreeHist's prefix lengths min(bits, start_bits + i step), i = 1 .. L. */
export declare function levelSchedule(bits: number, startBits: number, step: number): number[];
export type OpenProtocolName = 'CMS' | 'HCMS' | 'TreeHist';
export declare const OPEN_PROTOCOLS: Record<OpenProtocolName, [new (params: any) => OpenDomainProtocol, string[], string[]]>;
/** makeOpen("HCMS", {eps: 4.0, m: 256, k: 16, seed: valueId("crash")}); unknown or missing keywords are refused. */
export declare function makeOpen(name: OpenProtocolName | string, params?: Record<string, unknown>): OpenDomainProtocol;

// ---------------------------------------------------------------- numeric mechanisms
export type MechanismName = 'Laplace' | 'Duchi' | 'PM' | 'HM' | 'SW' | '1BitMean';

/** A numeric value's randomizer (estimators/numeric): a measurement of [lo, hi] in, ONE integer report out. */
export declare abstract class NumericMechanism extends Protocol {
  readonly numeric: true;
  /** "mean" (the server aggregates sums) or "distribution" (SW: cell counts, EMS). */
  readonly aggregate: 'mean' | 'distribution';
  readonly eps: number;
  readonly lo: number;
  readonly hi: number;
  /** The support size (what the server aggregates per step), as Python's NumericProtocol.k. */
  readonly k: number;
  readonly reportDtype: 'int32' | 'int8' | 'uint16' | 'uint32' | 'uint8';
  /** {mechanism, eps, lo, hi, ...own}; the fingerprint writes lo, hi (and gamma) as Python floats. */
  params(): Record<string, number | string>;
  /** The calibrated figures of the randomizer vectors' `derived` (64-bit integers as decimal strings). */
  derived(): Record<string, number | string>;
  /** Whether v lies outside [lo, hi] (it is clipped to the nearest end before randomizing). */
  clipped(v: number): boolean;
  /** [x in [-1, 1], clipped] (base.to_unit). */
  prepare(v: number): [number, boolean];
  /** One report's bytes for the measurement v (a finite number; NaN and infinities refused). */
  randomize(v: number, options: RandomizeOptions): Uint8Array;
  /** The report's integer from its bytes. */
  decodeReport(bytes: Uint8Array): number;
  /** Extension-stream words the last randomize drew (diagnosis). */
  readonly lastExtWords: number;
}
export declare class Laplace extends NumericMechanism { constructor(p: { eps: number; lo?: number; hi?: number; grid_bits?: number }); }
export declare class Duchi extends NumericMechanism { constructor(p: { eps: number; lo?: number; hi?: number }); }
export declare class PM extends NumericMechanism { constructor(p: { eps: number; lo?: number; hi?: number; grid_bits?: number }); }
export declare class HM extends NumericMechanism { constructor(p: { eps: number; lo?: number; hi?: number; grid_bits?: number }); }
export declare class SW extends NumericMechanism { constructor(p: { eps: number; lo?: number; hi?: number; d_in?: number; d_out?: number }); }
/** 1BitMean with alpha-point rounding: memoizes s + 1 points (pass the device's memo state; without one every
 * report is a fresh device), eps_memo per distinct point; gamma > 0 flips each report with fresh noise. */
export declare class OneBitMean extends NumericMechanism {
  constructor(p: { eps: number; lo?: number; hi?: number; s?: number; gamma?: number });
  readonly s: number;
  readonly gamma: number;
  readonly epsMemo: number;
  /** The device's rounding point alpha in [0, 1), fixed by its memo key. */
  alpha(state: MemoState): number;
}
export declare const MECHANISMS: Record<MechanismName, [new (params: Record<string, number>) => NumericMechanism, string[]]>;
/** makeNumeric("PM", {eps: 1.0, lo: 0.0, hi: 600.0}); unknown keywords are refused. */
export declare function makeNumeric(name: MechanismName | string, params?: Record<string, number>): NumericMechanism;
export declare function toUnit(v: number, lo: number, hi: number): [number, boolean];
export declare function readReport(dtype: string, bytes: Uint8Array): number;
export declare const EPS_STAR: number;

// ---------------------------------------------------------------- campaigns and the wire
/** The campaign TOML as JSON: {campaign: {id, time_step_seconds, ...}, attributes: [...], groups?: [...]}. */
export interface CampaignJSON {
  campaign: { id: string; time_step_seconds?: number; lateness_seconds?: number; max_batch_reports?: number;
    retention_steps?: number; max_steps_ahead?: number; min_n?: number; description?: string };
  attributes: Array<{ name: string; k: number; protocol?: string; labels?: string[]; defense?: string; type?: 'categorical'; [param: string]: unknown }
    | { name: string; type: 'numeric'; range: [number, number]; mechanism: MechanismName; eps: number; [param: string]: unknown }
    | { name: string; type: 'string'; protocol: OpenProtocolName; eps: number; m?: number; k?: number; seed?: bigint | number;
        top?: number; candidates?: string[]; retention_steps?: number; [param: string]: unknown }
    | { name: string; type: 'u64'; protocol: OpenProtocolName; eps: number; m?: number; k?: number; seed?: bigint | number;
        top?: number; candidates?: Array<bigint | number>; retention_steps?: number; [param: string]: unknown }>;
  groups?: Array<{ name: string; attributes: string[]; solution: string; [param: string]: unknown }>;
}

export declare class CampaignError extends LDPError {}
export declare const MAX_STEP: number;
export declare const ATTRIBUTE_TYPES: ['categorical', 'numeric', 'string', 'u64'];
export declare const MAX_TOP: number;
export declare const MAX_CANDIDATES: number;

export declare class Attribute {
  readonly name: string;
  readonly k: number;
  /** The attribute's own protocol; null for an attribute of a group. */
  readonly protocol: Protocol | null;
  readonly labels: string[];
  readonly group: string | null;
  readonly index: number | null;
  /** A numeric attribute (type = "numeric"): its protocol is a NumericMechanism and its values are numbers. */
  readonly numeric: boolean;
  /** 'categorical', 'numeric', 'string' or 'u64'. */
  readonly valueType: 'categorical' | 'numeric' | 'string' | 'u64';
  /** An open-domain attribute (type = "string" or "u64"): its protocol is an OpenDomainProtocol, k its support size. */
  readonly openDomain: boolean;
  /** An open-domain attribute's top-K size and candidates (server-side; validated as the reference does). */
  readonly top: number;
  readonly candidates: Array<string | bigint | number>;
  /** An open-domain value's id (CampaignError for a value of another type). */
  valueId(value: OpenValue): bigint;
  label(v: number): string;
}

export declare class Group {
  readonly name: string;
  readonly solution: Solution;
  readonly attributes: string[];
}

export declare class Campaign {
  readonly id: string;
  readonly attributes: Map<string, Attribute>;
  readonly groups: Map<string, Group>;
  readonly timeStepSeconds: number;
  readonly ungrouped: string[];
  attribute(name: string): Attribute;
  group(name: string): Group;
  reportProtocol(attribute: string): Protocol;
  /** The fingerprint a compact body's section carries for the attribute (a group attribute: its view of the solution). */
  wireFingerprint(attribute: string): string;
  stepAt(nowSeconds?: number): number;
  static fromJSON(data: CampaignJSON | string): Campaign;
}

/** What the ingest's POST /reports takes (wire/single_report.py). */
export interface SingleReport {
  campaign: string;
  attribute: string;
  t: number;
  /** base64 of the batch payload: "LDPr", codec version 1, u32 LE count (1), the report bytes. */
  payload: string;
}

export declare function encodePayload(reports: Uint8Array, count?: number): Uint8Array;
export declare function decodePayload(payload: Uint8Array, reportNbytes: number): Uint8Array;
export declare function encodeSingleReport(campaign: Campaign, attribute: string, t: number, reportBytes: Uint8Array): SingleReport;
export declare function base64Encode(bytes: Uint8Array): string;
/** One section of a compact binary body: `t` null means the ingest's receiving step. */
export interface CompactSection {
  campaign: string; attribute: string; fingerprint: string; t: number | null; payload: Uint8Array;
}
export declare const COMPACT_CONTENT_TYPE: 'application/x-ldp-reports';
/** The compact binary body (application/x-ldp-reports; docs/wire-format.md section 3). */
export declare function encodeCompact(sections: CompactSection[]): Uint8Array;
export declare function base64Decode(text: string): Uint8Array;
export declare function checkStep(t: number): number;

// ---------------------------------------------------------------- storage
/** Where a device keeps its state (memo keys, memoized cells, ledger): strings by name. */
export interface Storage {
  get(name: string): string | null;
  set(name: string, value: string): void;
  remove?(name: string): void;
  lock?(): void;
  unlock?(): void;
}

export declare class MemoryStorage implements Storage {
  constructor(entries?: Record<string, string>);
  get(name: string): string | null;
  set(name: string, value: string): void;
  remove(name: string): void;
  list(): string[];
}

export declare class LocalStorageStorage implements Storage {
  constructor(prefix?: string, store?: { getItem(k: string): string | null; setItem(k: string, v: string): void; removeItem(k: string): void });
  get(name: string): string | null;
  set(name: string, value: string): void;
  remove(name: string): void;
}

/** Node: one file per name in a 0700 directory, atomic writes (temp file, fsync, rename), a pid lock. */
export declare class FileStorage implements Storage {
  constructor(dir: string, modules?: { fs?: unknown; path?: unknown });
  static open(dir: string): Promise<FileStorage>;
  get(name: string): string | null;
  set(name: string, value: string): void;
  remove(name: string): void;
  list(): string[];
  lock(): void;
  unlock(): void;
}

// ---------------------------------------------------------------- the device
export declare class BudgetExceeded extends LDPError {
  readonly attribute: string;
  readonly spent: number;
  readonly cost: number;
  readonly budget: number;
}
export declare class DeviceStateError extends LDPError {}
export declare class IngestError extends LDPError {
  /** HTTP status, or null when the ingest could not be reached. */
  readonly status: number | null;
  readonly body: string;
}

/** An index or a label, a numeric attribute's measurement, or an open-domain attribute's string / u64 (bigint). */
export type Value = number | string | bigint;
export type GroupValues = Record<string, Value> | Value[];

export declare function budgetPlan(campaign: Campaign, budgetEps: number | null): string;

/** The ledger of one device (producers.sdk.Device without the HTTP part). */
export declare class Ledger {
  constructor(campaign: Campaign, storage: Storage, options?: { budgetEps?: number | null; keys?: KeySource });
  readonly campaign: Campaign;
  readonly budgetEps: number | null;
  /** What the budget memoizes, and why (the Python SDK's text). */
  readonly budgetPlan: string;
  close(): void;
  valueIndex(attribute: string, value: Value): number;
  /** An open-domain attribute's value as its 64-bit id: a string ("string") or an integer in [0, 2^64) ("u64"); hashed
   * on the device (LDPError otherwise). */
  valueId(attribute: string, value: OpenValue): bigint;
  /** A numeric attribute's measurement checked: a finite number (LDPError otherwise). */
  numericValue(attribute: string, value: unknown): number;
  /** Values of numeric `attribute` this object clipped to the range (kept on the device, never sent or stored). */
  clipped(attribute: string): number;
  /** One report's bytes (a numeric attribute: value is a measurement, clipped to its range; an open-domain one: a
   * string or a u64, hashed here, each report spending eps; freezes past the budget; BudgetExceeded on
   * data-independent grounds only). */
  randomize(attribute: string, value: Value): Uint8Array;
  randomizeGroup(group: string, values: GroupValues): Array<[string, Uint8Array]>;
  privacyLoss(attribute?: string | null, options?: { group?: string | null }): number;
  reservedLoss(attribute?: string | null, options?: { group?: string | null }): number;
  remainingBudget(): number;
  memoizedCount(attribute: string): number;
  /** The value last randomized (an index, or a numeric attribute's measurement), or null. */
  /** A memoizing open-domain attribute (TreeHist): the hex of its memoized report of the last value, never the value. */
  lastValue(attribute: string): number | string | null;
  frozen(attribute: string): boolean;
  groupStepsReserved(group: string): number;
  reset(name: string, options: { group?: boolean; acceptPrivacyLoss: true }): number;
}

export interface DeviceOptions {
  /** Lifetime longitudinal epsilon over all attributes (null: no limit). */
  budgetEps?: number | null;
  /** The ingest's POST /reports URL. */
  ingestUrl?: string | null;
  /** The device token (`ldp tokens issue`), sent as Authorization: Bearer. */
  token?: string | null;
  timeoutSeconds?: number;
  /** Retries of one request (same bytes, same Idempotency-Key) after network errors, 5xx and 409. */
  retries?: number;
  /** First backoff; doubles on each retry. */
  backoffSeconds?: number;
  /** The key source: leave it (the platform CSPRNG) on real devices. */
  keys?: KeySource;
  fetch?: typeof globalThis.fetch | null;
}

export declare class Device extends Ledger {
  constructor(campaign: Campaign | CampaignJSON, storage: Storage, options?: DeviceOptions);
  /** Node: state in a directory (FileStorage). */
  static open(campaign: Campaign | CampaignJSON, dir: string, options?: DeviceOptions): Promise<Device>;
  currentStep(): number;
  report(attribute: string, value: Value, t?: number | null): SingleReport;
  reportGroup(group: string, values: GroupValues, t?: number | null): SingleReport[];
  send(attribute: string, value: Value, t?: number | null): Promise<Record<string, unknown>>;
  sendGroup(group: string, values: GroupValues, t?: number | null): Promise<Record<string, unknown>>;
  /** The report objects as ONE compact binary body, retried like send(). */
  sendBinary(objs: SingleReport | SingleReport[]): Promise<Record<string, unknown>>;
  post(objs: SingleReport | SingleReport[] | Uint8Array): Promise<Record<string, unknown>>;
}

export declare function postReport(url: string, obj: SingleReport | SingleReport[] | string | Uint8Array, options?: {
  timeoutSeconds?: number; token?: string | null; idempotencyKey?: string | null; fetch?: typeof globalThis.fetch;
}): Promise<Record<string, unknown>>;
export declare function retryable(exc: IngestError): boolean;
export declare function idempotencyKey(): string;
