"""Table 2's DB_MT column (Arcolezi et al., EDBT 2023) under the memoization of the authors' first dBitFlipPM
client (multi-freq-ldpy): one memoized report PER BUCKET VALUE, so a change between two buckets the user did not
sample redraws the sampled bit. Not the library's dBitFlipPM (which memoizes one report per pattern of the sampled
bits, d + 1 cases): a simulation that explains why the paper's d = 1 detection rates are higher than ours.

    .venv/bin/python docs/figures/longitudinal_db_mt_table2/per_bucket_memo.py   # writes per_bucket_memo.csv here

Simulation mode (seeded, not private); d = 1, b = floor(k/4), 20 runs, the share of the users with at least one
bucket change for whom every bucket change gave a new report.
"""
from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from ldpstream_cli.experiments.datasets import load_db_mt

RUNS = 20
EPS_INF = (0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0)


def detected_all(buckets: np.ndarray, b: int, eps_inf: float, rng: np.random.Generator) -> tuple[int, int]:
    """(users whose every bucket change changed the report, users with a bucket change) of one run."""
    tau, n = buckets.shape
    p = np.exp(eps_inf / 2) / (np.exp(eps_inf / 2) + 1)
    sampled = rng.integers(0, b, n)
    reports = np.empty((tau, n), dtype=np.int8)
    for user in range(n):
        memo: dict[int, int] = {}
        for t in range(tau):
            bucket = int(buckets[t, user])
            if bucket not in memo:  # first time in this bucket: a fresh draw, memoized for the bucket
                memo[bucket] = int(rng.random() < (p if bucket == sampled[user] else 1 - p))
            reports[t, user] = memo[bucket]
    moved = buckets[1:] != buckets[:-1]
    new_report = reports[1:] != reports[:-1]
    changed = moved.any(axis=0)
    return int(np.sum((~moved | new_report).all(axis=0) & changed)), int(np.sum(changed))


def main() -> None:
    data = load_db_mt()
    buckets = (np.asarray(data.values()) / (data.k / data.bitflip_b)).astype(np.int64)
    rng = np.random.default_rng(2023)
    rows = []
    for eps in EPS_INF:
        det = tot = 0
        for _ in range(RUNS):
            d, t = detected_all(buckets, data.bitflip_b, eps, rng)
            det, tot = det + d, tot + t
        rows.append({"eps_inf": eps, "detected_all": det, "users_with_a_change": tot,
                     "detected_all_pct": 100.0 * det / tot})
        print(f"eps_inf {eps:g}: {100.0 * det / tot:.4f}% ({det} of {tot} user-runs)", flush=True)
    with open(Path(__file__).with_name("per_bucket_memo.csv"), "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()
