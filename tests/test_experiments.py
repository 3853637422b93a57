"""``ldp experiment``: the ``--quick`` runs reproduce the papers' qualitative results.

Each experiment runs once (module-scoped fixtures, fixed seeds) through the CLI into a temporary folder;
the tests read its CSVs. Statistical tolerances come from the variance: the MSE of ``m`` estimated
frequencies is an average of ``m`` squared errors of relative standard deviation ``sqrt(2)`` (Gaussian
estimates), so over ``r`` repetitions its relative standard error is at most ``sqrt(2 / m) / sqrt(r)``,
even when the errors are fully correlated across collections (memoization); the tests allow 4 of them.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from ldpstream_cli.cli import app
from ldpstream_cli.experiments.runner import read_csv, run_tasks

pytestmark = pytest.mark.timeout(300)
SIGMAS = 4.0


def _run(args: list[str]) -> None:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output + repr(result.exception)


def _experiment(factory: pytest.TempPathFactory, name: str, *options: str) -> Path:
    """Run ``ldp experiment NAME OPTIONS`` into a fresh folder; return the folder. In this process
    (``--workers 1`` unless given): the suite's test processes already use every core, and a pool's two
    spawned interpreters cost more CPU than they save (``test_results_do_not_depend_on_the_number_of_workers``
    covers the pool)."""
    out = factory.mktemp(name)
    workers = () if "--workers" in options or name == "numerical" else ("--workers", "1")  # numerical: no pool
    _run(["experiment", name, *options, *workers, "--out", str(out)])
    return out


def _relative_tolerance(values: int, reps: int) -> float:
    return SIGMAS * math.sqrt(2.0 / values) / math.sqrt(reps)


# ====================================================================== the group
def test_every_experiment_is_registered() -> None:
    result = CliRunner().invoke(app, ["experiment", "--help"])
    assert result.exit_code == 0
    for name in ("poisoning", "longitudinal", "allomfree", "numerical", "calibration"):
        assert name in result.output


def _square(task: tuple[int, np.random.SeedSequence]) -> float:
    return float(np.random.default_rng(task[1]).random()) + task[0]


def _numba_threads(_: int) -> int:
    import numba

    return numba.get_num_threads()


def test_one_worker_runs_its_tasks_on_one_numba_thread() -> None:
    """``workers=1`` runs the tasks in this process on one numba thread (OpenMP threads spinning between small
    parallel kernel calls tripled the CPU), and gives the process its threads back afterwards."""
    import numba

    before = numba.get_num_threads()
    assert run_tasks(_numba_threads, [0, 1, 2], "threads", workers=1) == [1, 1, 1]
    assert numba.get_num_threads() == before


def test_results_do_not_depend_on_the_number_of_workers() -> None:
    from ldpstream_cli.experiments.runner import child_seeds

    tasks = list(enumerate(child_seeds(7, "test", 6)))
    assert run_tasks(_square, tasks, "one", workers=1) == run_tasks(_square, tasks, "two", workers=2)


# ====================================================================== longitudinal (EDBT 2023)
@pytest.fixture(scope="module")
def longitudinal(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _experiment(tmp_path_factory, "longitudinal", "--quick")


def _by(rows: list[dict], protocol: str) -> dict[tuple[float, float], dict]:
    return {(r["eps_inf"], r["alpha"]): r for r in rows if r["protocol"] == protocol}


def test_longitudinal_writes_its_files(longitudinal: Path) -> None:
    for name in ("config.json", "longitudinal.csv", "loss_over_time.csv", "detection.csv", "mse_avg.png",
                 "eps_avg.png", "loss_over_time.png"):
        assert (longitudinal / name).stat().st_size > 0, name
    import json

    config = json.loads((longitudinal / "config.json").read_text())
    assert config["k"] == 360 and config["p_change"] == 0.25 and config["wall_time_s"] > 0


def test_bilolooha_loss_is_at_most_two_eps_inf_while_rappor_grows_with_the_changes(longitudinal: Path) -> None:
    rows = read_csv(longitudinal / "longitudinal.csv")
    bi, rappor = _by(rows, "BiLOLOHA"), _by(rows, "RAPPOR")
    assert bi and rappor
    for key, r in bi.items():
        assert r["eps_avg"] <= 2 * r["eps_inf_true"] * (1 + 1e-9)
        # RAPPOR leaks one ε∞ per distinct memoized value: 1 + (number of changes), minus revisits
        q = rappor[key]
        assert q["eps_avg"] == pytest.approx(q["eps_inf_true"] * q["mean_memoized"], rel=1e-9)
        assert q["mean_memoized"] >= 0.9 * (1 + q["mean_changes"])
        assert q["eps_avg"] > 3 * r["eps_avg"]
    curves = read_csv(longitudinal / "loss_over_time.csv")
    for (e, a) in rappor:
        sel = sorted((c for c in curves if c["protocol"] == "RAPPOR" and c["eps_inf"] == e and c["alpha"] == a),
                     key=lambda c: c["t"])
        losses, changes = np.array([c["eps_avg"] for c in sel]), np.array([c["mean_changes"] for c in sel])
        assert len(sel) >= 5 and np.all(np.diff(losses) > 0) and np.all(np.diff(changes) > 0)
        # ... linearly: the loss per change stays near ε∞
        slope = np.diff(losses) / np.diff(changes)
        assert np.all(slope > 0.9 * e) and np.all(slope <= e * (1 + 1e-6))
        bi_sel = [c["eps_avg"] for c in curves if c["protocol"] == "BiLOLOHA" and c["eps_inf"] == e
                  and c["alpha"] == a]
        assert max(bi_sel) <= 2 * e * (1 + 1e-6)


def test_ololoha_is_within_1_2x_of_l_osue(longitudinal: Path) -> None:
    rows = read_csv(longitudinal / "longitudinal.csv")
    o, l = _by(rows, "OLOLOHA"), _by(rows, "L-OSUE")
    assert o and set(o) == set(l)
    for key in o:
        assert o[key]["mse_avg"] <= 1.2 * l[key]["mse_avg"], key


def test_longitudinal_mse_matches_the_variance(longitudinal: Path) -> None:
    rows = read_csv(longitudinal / "longitudinal.csv")
    assert len({r["protocol"] for r in rows}) == 7
    for r in rows:
        tol = _relative_tolerance(r["domain_size"], r["reps"])
        assert abs(r["mse_over_variance"] - 1) <= tol, (r["protocol"], r["eps_inf"], r["alpha"],
                                                         r["mse_over_variance"], tol)


def test_bitflip_change_detection_table_2(longitudinal: Path) -> None:
    """EDBT 2023, Table 2 on Syn: 0% of the users for d = 1, 100% for d = b (users with a bucket change)."""
    for r in read_csv(longitudinal / "detection.csv"):
        assert r["1BitFlipPM_detected_all_pct"] < 1.0
        assert r["bBitFlipPM_detected_all_pct"] > 99.0


# ====================================================================== allomfree (DCN 2022)
@pytest.fixture(scope="module")
def allomfree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _experiment(tmp_path_factory, "allomfree", "--quick")


def test_allomfree_beats_l_sue_and_l_oue_at_every_eps(allomfree: Path) -> None:
    rows = read_csv(allomfree / "allomfree.csv")
    ours = _by([{**r, "protocol": r["solution"]} for r in rows], "ALLOMFREE")
    assert len(ours) >= 6
    for ref in ("L-SUE", "L-OUE"):
        theirs = _by([{**r, "protocol": r["solution"]} for r in rows], ref)
        for key, r in ours.items():
            assert r["mse_avg"] < theirs[key]["mse_avg"], (ref, key)
    gains = read_csv(allomfree / "gains.csv")
    assert len(gains) == len(ours)
    for g in gains:  # Eq. 17, from the same CSV
        ref = theirs[(g["eps_inf"], g["alpha"])]
        assert g["U_L-OUE_pct"] == pytest.approx(
            100 * (ref["mse_avg"] - ours[(g["eps_inf"], g["alpha"])]["mse_avg"]) / ref["mse_avg"])
        assert 0 < g["U_L-SUE_pct"] < 100 and 0 < g["U_L-OUE_pct"] < 100


def test_allomfree_mse_matches_the_variance(allomfree: Path) -> None:
    rows = [r for r in read_csv(allomfree / "allomfree.csv") if r["reps"]]
    assert {r["solution"] for r in rows} >= {"ALLOMFREE", "L-SUE", "L-OUE", "ALLOMFREE+fake data"}
    for r in rows:
        assert abs(r["mse_over_variance"] - 1) <= SIGMAS * r["mse_rel_se_bound"], r
    # pooled over the grid the errors average out: a much tighter check of the same claim
    ratio = np.mean([r["mse_over_variance"] for r in rows])
    assert abs(ratio - 1) <= SIGMAS * np.sqrt(np.mean([r["mse_rel_se_bound"] ** 2 for r in rows]) / len(rows))


def test_allomfree_files_and_loss(allomfree: Path) -> None:
    for name in ("config.json", "allomfree.csv", "mse_over_time.csv", "gains.csv", "mse_avg.png",
                 "mse_over_time.png"):
        assert (allomfree / name).stat().st_size > 0, name
    rows = read_csv(allomfree / "allomfree.csv")
    for r in rows:  # fixed sampling: one attribute per device, at most its k values memoized
        assert 0 < r["eps_avg"] <= r["worst_case_loss"]


# ====================================================================== numerical (DCN 2022, EDBT 2023)
@pytest.fixture(scope="module")
def numerical(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _experiment(tmp_path_factory, "numerical")


def test_numerical_reproduces_table_1_and_shows_the_calibration_changes(numerical: Path) -> None:
    table1 = read_csv(numerical / "table1.csv")
    assert len(table1) == 24 * 7
    for r in table1:
        # the paper calibration reproduces the printed cell (rounded or truncated to its digits)
        assert abs(r["paper_calibration"] - r["printed"]) < 10.0 ** -r["printed_digits"], r
        if r["protocol"] != "L-GRR" or r["k"] == 2:
            assert r["exact_calibration"] == pytest.approx(r["paper_calibration"], rel=1e-9)
        else:  # the exact calibration only ever lowers L-GRR's variance for k > 2
            assert r["exact_over_paper"] < 1
    cross = read_csv(numerical / "lgrr_crossover.csv")
    assert all(r["max_k_lgrr_exact"] >= r["max_k_lgrr_paper"] >= 2 for r in cross)
    assert sum(r["max_k_lgrr_exact"] > r["max_k_lgrr_paper"] for r in cross) > len(cross) // 2
    g = read_csv(numerical / "fig1_optimal_g.csv")
    assert all(r["g_eq6"] >= 2 for r in g) and any(r["g_best_exact"] != r["g_eq6"] for r in g)
    # Eq. 6 is the optimum under the paper's calibration up to its integer rounding
    assert sum(r["g_best_paper"] == r["g_eq6"] for r in g) >= 0.8 * len(g)
    for name in ("fig1_optimal_g.png", "fig2_variance.png", "table1_calibration.png", "table2.csv"):
        assert (numerical / name).stat().st_size > 0


# ====================================================================== calibration (MSE against variance)
@pytest.fixture(scope="module")
def calibration(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _experiment(tmp_path_factory, "calibration", "--quick")


def test_calibration_mse_matches_the_variance_for_every_protocol(calibration: Path) -> None:
    import estimators

    rows = [r for r in read_csv(calibration / "calibration.csv") if r["reps"]]
    assert {r["protocol"] for r in rows} == set(estimators.PROTOCOLS)
    bounds = []
    for r in rows:
        # correlated estimates (sum to one, shared hash functions) at most double the variance of the MSE
        bound = math.sqrt(2.0) * _relative_tolerance(r["domain_size"], r["reps"]) / SIGMAS
        bounds.append(bound)
        assert abs(r["mse_over_variance"] - 1) <= SIGMAS * bound, r
    pooled = np.mean([r["mse_over_variance"] for r in rows])
    assert abs(pooled - 1) <= SIGMAS * math.sqrt(np.mean(np.square(bounds)) / len(rows))
    assert len(list(calibration.glob("calibration_*.png"))) == 6


# ====================================================================== numeric (Wang et al., Li et al., DKY)
def test_numeric_quick_checks_the_papers_orderings(tmp_path_factory: pytest.TempPathFactory) -> None:
    """``ldp experiment numeric --quick``: PM below Duchi in the worst case above ε ≈ 1.29 and HM below both
    (Wang et al., ICDE 2019; the survey of Wang, Zhang, Feng & Yang), SW+EMS below the debiased PM histogram
    in W1, 1BitMean's memoized loss below re-randomizing's; every check within the repetitions' standard errors."""
    out = _experiment(tmp_path_factory, "numeric", "--quick")
    checks = read_csv(out / "checks.csv")
    failed = [c for c in checks if not c["holds"]]
    assert not failed, failed
    claims = {c["claim"] for c in checks}
    for claim in ("worst-case crossover of PM and Duchi ≈ 1.29", "worst case: PM not above Duchi above ε ≈ 1.29",
                  "worst case: PM significantly below Duchi at the largest ε",
                  "worst case: HM not above min(PM, Duchi)", "data: HM never worse than both PM and Duchi",
                  "W1: SW+EMS significantly below PM debiased", "W1: SW+EMS not above PM+EMS",
                  "1BitMean: a device whose value stays put costs one ε_memo",
                  "1BitMean: memoized loss ≤ (s+1) ε_memo < re-randomizing", "MSE = variance of the implemented law"):
        assert claim in claims, claim
    cross = {r["dataset"]: r for r in read_csv(out / "crossover.csv")}
    assert round(cross["worst case"]["eps_crossover_paper"], 2) == 1.29
    for r in read_csv(out / "onebit.csv"):
        assert r["memo_loss_max"] <= r["memo_bound"] < r["rerandomize_loss"] == pytest.approx(100 * r["eps_first"])
    for name in ("config.json", "mean.csv", "worst_case.csv", "wasserstein.csv", "onebit_loss.csv", "worst_case.png",
                 "mse_vs_eps.png", "wasserstein.png", "onebit.png"):
        assert (out / name).stat().st_size > 0, name


# ====================================================================== heavy hitters (Wang, Li & Jha, TDSC 2021)
def test_heavy_hitters_quick_finds_the_top_of_zipf_and_of_the_words(tmp_path_factory: pytest.TempPathFactory) -> None:
    """``ldp experiment heavy-hitters --quick`` (n = 10^4, ε = 2 and 6, one repetition): every protocol returns K
    items; at ε = 6 PEM and CMS find the true top 5 of Zipf(1.1) (each item above 1.6 % of the devices) and of the
    word list (seeds 0-5 all do); PEM's recall and every PEM-like protocol's MSE improve from ε = 2 to 6."""
    out = _experiment(tmp_path_factory, "heavy-hitters", "--quick")
    for name in ("config.json", "runs.csv", "summary.csv", "data.csv", "vs_eps.png", "vs_n.png", "data.png"):
        assert (out / name).stat().st_size > 0, name
    runs = read_csv(out / "runs.csv")
    import importlib.util

    peer = importlib.util.find_spec("pure_ldp") is not None  # the bench extra (installed by `make test`)
    assert {r["protocol"] for r in runs} >= {"PEM", "CMS", "HCMS"} | ({"pure-ldp PEM"} if peer else set())
    for r in runs:
        assert r["found"] == r["k"] == 20 and r["top_k_size"] >= 20, r
        assert 0.0 <= r["recall"] <= r["precision"] <= 1.0 and 0.0 <= r["recall_top5"] <= 1.0, r
        assert 0.0 < r["mse"] < 0.01, r
    cell = {(r["dataset"], r["protocol"], r["eps"]): r for r in read_csv(out / "summary.csv") if r["n"] == 10_000}
    for dataset in ("zipf", "words"):
        for protocol in ("PEM", "CMS"):
            assert cell[(dataset, protocol, 6.0)]["recall_top5"] == 1.0, (dataset, protocol)
        assert not peer or cell[(dataset, "pure-ldp PEM", 6.0)]["recall_top5"] >= 0.6
        assert cell[(dataset, "PEM", 6.0)]["recall"] > cell[(dataset, "PEM", 2.0)]["recall"]
        for protocol in ("PEM", "CMS", "pure-ldp PEM", "TreeHist"):
            if (dataset, protocol, 6.0) not in cell:
                continue  # pure-ldp or TreeHist not installed
            assert cell[(dataset, protocol, 6.0)]["mse"] < cell[(dataset, protocol, 2.0)]["mse"] / 5, protocol
    words = [r for r in read_csv(out / "data.csv") if r["dataset"] == "words"]
    assert words[0]["value"] == "the" and words[0]["probability"] > words[19]["probability"] > 0.003


# ====================================================================== real data sets (issue 25)
def _real_data(*files: str) -> None:
    """Skip unless the shared data folder (../shared/data, $LDP_DATA_DIR) holds ``files``."""
    from ldpstream_cli.experiments.datasets import resolve_data_dir

    folder = resolve_data_dir()
    missing = [f for f in files if not (folder / f).is_file()]
    if missing:
        pytest.skip(f"real data set(s) {', '.join(missing)} not in {folder} (set LDP_DATA_DIR)")


def _table_2(out: Path) -> None:
    """Arcolezi et al., EDBT 2023, Table 2: the server detects every bucket change of under 1 % of the users
    with 1BitFlipPM (d = 1) and of at least 99.9 % with bBitFlipPM (d = b)."""
    rows = read_csv(out / "detection.csv")
    assert rows
    for r in rows:
        assert r["1BitFlipPM_detected_all_pct"] < 1.0, r
        assert r["bBitFlipPM_detected_all_pct"] >= 99.9, r


def _both_metrics(out: Path) -> list[dict]:
    rows = read_csv(out / "longitudinal.csv")
    for r in rows:
        assert r["mse_avg"] > 0 and r["mse_avg_clip_norm"] > 0, r
    for name in ("mse_avg.png", "mse_avg_clip_norm.png"):
        assert (out / name).stat().st_size > 0, name
    return rows


def test_longitudinal_on_adult_and_db_mt_table_2(tmp_path_factory: pytest.TempPathFactory) -> None:
    """``--dataset adult`` (hours-per-week, k = 96, permuted) and ``--dataset db_mt`` (PWGTP columns,
    k = 1,412, b = ⌊k/4⌋), quick sizes cut further (1,000 users, 8 collections): Table 2 holds and both
    MSEs (raw, clipped-renormalized) are written."""
    import json

    _real_data("adult.data.gz", "adult.test.gz", "PWGTP_Montana.csv.gz")
    for dataset, eps in (("adult", "1,5"), ("db_mt", "2")):
        out = _experiment(tmp_path_factory, "longitudinal", "--dataset", dataset, "--quick", "--n", "1000",
                          "--tau", "8", "--eps-inf", eps, "--workers", "1")
        _table_2(out)
        rows = _both_metrics(out)
        config = json.loads((out / "config.json").read_text())
        assert config["dataset"] == dataset and config["n"] == 1000 and config["tau"] == 8
        assert config["k"] == {"adult": 96, "db_mt": 1412}[dataset]
        assert config["b"] == {"adult": 0, "db_mt": 353}[dataset]
        assert "45,221" in config["data_note"] if dataset == "adult" else "PWGTP" in config["data_note"]
        # clipping and renormalizing can only help the small-ε, large-k estimates of L-GRR
        grr = [r for r in rows if r["protocol"] == "L-GRR"]
        assert grr[0]["mse_avg_clip_norm"] < grr[0]["mse_avg"]


def test_allomfree_on_nursery_gains_over_l_sue_and_l_oue(tmp_path_factory: pytest.TempPathFactory) -> None:
    """``--dataset nursery`` (9 attributes, one collection, Arcolezi et al., DCN 2022, Tables 3-4's setting
    ε1 = 0.3 and 0.6 ε∞): ALLOMFREE's gains over L-SUE and L-OUE are positive at every ε∞."""
    _real_data("nursery.data.gz")
    out = _experiment(tmp_path_factory, "allomfree", "--dataset", "nursery", "--quick", "--reps", "1",
                      "--workers", "1")
    gains = read_csv(out / "gains.csv")
    assert {g["alpha"] for g in gains} == {0.3, 0.6} and len(gains) == 6
    for g in gains:
        assert g["U_L-SUE_pct"] > 0 and g["U_L-OUE_pct"] > 0, g
        assert math.isfinite(g["U_L-SUE_clip_norm_pct"]) and math.isfinite(g["U_L-OUE_clip_norm_pct"]), g
    rows = read_csv(out / "allomfree.csv")
    assert all(r["mse_avg"] > 0 and r["mse_avg_clip_norm"] > 0 for r in rows)
    assert (out / "mse_avg_clip_norm.png").stat().st_size > 0


def test_longitudinal_on_a_users_csv_file(tmp_path: Path) -> None:
    """A user's own CSV file, a column per collection: the experiment runs and writes both metrics."""
    rng = np.random.default_rng(3)
    values = rng.integers(0, 6, size=(400, 5))
    path = tmp_path / "mine.csv"
    path.write_text("c1,c2,c3,c4,c5\n" + "\n".join(",".join(f"v{x}" for x in row) for row in values) + "\n")
    out = tmp_path / "out"
    _run(["experiment", "longitudinal", "--dataset", str(path), "--eps-inf", "2", "--alphas", "0.5", "--reps", "1",
          "--workers", "1", "--out", str(out)])
    rows = _both_metrics(out)
    assert {r["protocol"] for r in rows} >= {"RAPPOR", "L-GRR", "BiLOLOHA"}
    assert all(r["domain_size"] == 6 and r["dataset"] == "mine.csv" for r in rows)
    assert len(read_csv(out / "detection.csv")) == 1


def test_dataset_loaders_and_their_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Missing files say where they were looked for and how to point elsewhere; a column with too many
    distinct values is refused; one column is permuted τ times, several are one collection each."""
    from ldpstream_cli.experiments import datasets as ds

    monkeypatch.setenv("LDP_DATA_DIR", str(tmp_path / "nowhere"))
    assert ds.resolve_data_dir() == tmp_path / "nowhere"
    assert ds.resolve_data_dir(tmp_path) == tmp_path
    for load in (ds.load_adult, ds.load_db_mt, ds.load_nursery):
        with pytest.raises(ds.DatasetError, match="looked for .*nowhere.*--data-dir DIR or the LDP_DATA_DIR"):
            load()
    with pytest.raises(ds.DatasetError, match="looked for .*absent.csv"):
        ds.load_csv_collections(tmp_path / "absent.csv")
    with pytest.raises(ds.DatasetError, match="unknown data set 'foo'"):
        ds.load_collections("foo")
    path = tmp_path / "d.csv"
    path.write_text("id,colour,size\n" + "".join(f"{i},{'rgb'[i % 3]},{i % 4}\n" for i in range(300)))
    with pytest.raises(ds.DatasetError, match="column 'id' .* not categorical: 300 distinct values"):
        ds.load_csv_collections(path)
    with pytest.raises(ds.DatasetError, match="more than --max-k 2"):
        ds.load_csv_collections(path, ["colour"], max_k=2)
    with pytest.raises(ds.DatasetError, match="no column 'weight'"):
        ds.load_csv_collections(path, ["weight"])
    one = ds.load_csv_collections(path, ["colour"], tau=4)
    assert (one.k, one.labels, one.tau, one.n) == (3, ("b", "g", "r"), 4, 300)
    steps = one.values(seed=1)
    assert steps.shape == (4, 300) and all(np.array_equal(np.bincount(s), [100, 100, 100]) for s in steps)
    two = ds.load_csv_collections(path, ["size", "colour"])
    assert (two.tau, two.k) == (2, 7) and two.values().shape == (2, 300)
    table = ds.load_csv_table(path, ["colour", "size"])
    assert table.ks == (3, 4) and table.values.shape == (300, 2)
    assert np.allclose(ds.clip_normalize(np.array([0.5, -0.2, 1.0])), [1 / 3, 0, 2 / 3])


def test_longitudinal_protocols_and_the_bitflip_estimators(tmp_path: Path) -> None:
    """``--protocols`` runs a subset (only dBitFlipPM: no MSE plot when it estimates buckets) and refuses unknown
    names; ``--bitflip-estimator realized`` reports the realized-count estimator's smaller exact variance
    (Ding et al., NeurIPS 2017), below the expected-count one's by (h+1-d/b)/h for 1BitFlipPM."""
    rng = np.random.default_rng(4)
    path = tmp_path / "mine.csv"
    path.write_text("c1,c2,c3\n" + "\n".join(",".join(f"v{x}" for x in row)
                                             for row in rng.integers(0, 8, size=(300, 3))) + "\n")
    variance = {}
    for estimator in ("expected", "realized"):
        out = tmp_path / estimator
        _run(["experiment", "longitudinal", "--dataset", str(path), "--protocols", "1BitFlipPM", "--eps-inf", "1",
              "--alphas", "0.5", "--reps", "1", "--workers", "1", "--bitflip-estimator", estimator,
              "--out", str(out)])
        (row,) = read_csv(out / "longitudinal.csv")
        assert row["protocol"] == "1BitFlipPM"
        variance[estimator] = row["variance_avg"]
        assert json.loads((out / "config.json").read_text())["bitflip_estimator"] == estimator
    h = np.exp(0.5)  # 1BitFlipPM at ε∞ = 1: p/q = e^{ε∞/2}; b = k = 8, d = 1
    assert variance["realized"] < variance["expected"]
    # the ratio of the Var* at f = 0; the f terms of the exact variances move it by 4.8% here
    assert variance["expected"] / variance["realized"] == pytest.approx((h + 1 - 1 / 8) / h, rel=0.06)
    for bad, says in ((["--protocols", "RAPPOR,foo"], "unknown ['foo']"),
                      (["--bitflip-estimator", "guess"], "expected or realized")):
        result = CliRunner().invoke(app, ["experiment", "longitudinal", "--quick", *bad, "--out", str(tmp_path / "x")])
        assert result.exit_code == 2 and says in result.output, result.output
