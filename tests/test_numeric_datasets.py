"""``ldp experiment numeric --dataset adult|syn|PATH``: the loaders of numeric columns and their errors, and quick
end-to-end runs on a generated CSV file and on the synthetic populations alone."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from ldpstream_cli.cli import app
from ldpstream_cli.experiments import datasets as ds
from ldpstream_cli.experiments import numeric
from ldpstream_cli.experiments.runner import read_csv

pytestmark = pytest.mark.timeout(300)
#: a quick run kept to a few seconds (two ε, fewer repetitions of the mean cells, one worker)
SMALL = ["--quick", "--eps", "1,4", "--reps", "100", "--workers", "1"]


def _invoke(args: list[str]):
    return CliRunner().invoke(app, ["experiment", "numeric", *args])


def _csv(path: Path, n: int = 300) -> Path:
    """A CSV file: an integer column, a text column, a float column with a "?" every 50 rows, a second float."""
    rng = np.random.default_rng(3)
    lines = ["id,city,income,height"]
    for i in range(n):
        income = "?" if i % 50 == 0 else f"{rng.gamma(2.0, 10.0):.2f}"
        lines.append(f"{i},{'abc'[i % 3]}town,{income},{rng.normal(170, 8):.1f}")
    path.write_text("\n".join(lines) + "\n")
    return path


def _datasets(out: Path) -> set[str]:
    return {r["dataset"] for r in read_csv(out / "mean.csv") if r["kind"] == "data"}


# ====================================================================== loaders
def test_csv_numeric_loader_finds_the_numeric_columns_and_drops_missing_rows(tmp_path: Path) -> None:
    path = _csv(tmp_path / "people.csv")
    data = ds.load_csv_numeric(path)
    assert data.name == "people" and list(data.values) == ["id", "income", "height"]  # not the text column
    assert (data.read, data.n) == (300, 294)  # six "?" rows dropped
    for col, v in data.values.items():
        assert v.dtype == np.float64 and v.shape == (294,)
        assert (data.lo[col], data.hi[col]) == (v.min(), v.max())
    assert 0 not in data.values["id"] and 50 not in data.values["id"]
    assert "300 rows read, 294 without a missing value" in data.note
    one = ds.load_csv_numeric(path, ["height"])
    assert list(one.values) == ["height"] and one.n == 300  # the "?" is in another column
    assert ds.load_numeric(str(path), columns=["income"]).n == 294


def test_csv_numeric_loader_errors(tmp_path: Path) -> None:
    path = _csv(tmp_path / "people.csv")
    with pytest.raises(ds.DatasetError, match="column 'city' of .*people.csv is not numeric: it holds 'btown'"):
        ds.load_csv_numeric(path, ["income", "city"])
    with pytest.raises(ds.DatasetError, match="CSV data set not found: looked for .*absent.csv"):
        ds.load_csv_numeric(tmp_path / "absent.csv")
    with pytest.raises(ds.DatasetError, match="no column 'weight'"):
        ds.load_csv_numeric(path, ["weight"])
    text = tmp_path / "text.csv"
    text.write_text("a,b\nx,y\nz,w\n")
    with pytest.raises(ds.DatasetError, match="no numeric column; its columns: a, b"):
        ds.load_csv_numeric(text)
    flat = tmp_path / "flat.csv"
    flat.write_text("c\n" + "5\n" * 10)
    with pytest.raises(ds.DatasetError, match="column 'c' .* is constant"):
        ds.load_csv_numeric(flat)
    with pytest.raises(ds.DatasetError, match="unknown data set 'foo': use syn, adult or the path of a CSV file"):
        ds.load_numeric("foo")


def test_adult_numeric_loader_honours_ldp_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without ``--data-dir`` the folder is ``$LDP_DATA_DIR``; the error names the file it looked for there."""
    monkeypatch.setenv("LDP_DATA_DIR", str(tmp_path / "elsewhere"))
    with pytest.raises(ds.DatasetError, match=r"looked for .*elsewhere[/\\]adult.data.gz.*--data-dir DIR or the "
                                              "LDP_DATA_DIR"):
        ds.load_adult_numeric()
    with pytest.raises(ds.DatasetError, match="elsewhere"):
        ds.load_numeric("adult")
    # the full run needs Adult's file; --quick runs the synthetic populations alone and says why
    with pytest.raises(ds.DatasetError, match="elsewhere"):
        numeric.datasets(numeric.Config.quick(), required=True)
    data, note = numeric.datasets(numeric.Config.quick(), required=False)
    assert [d.name for d in data] == ["uniform", "skewed"]
    assert note.startswith("Adult skipped") and "elsewhere" in note


def test_adult_numeric_loader_keeps_the_training_file_population() -> None:
    """Adult's training file without the "?" rows: 30,161 of 32,560 rows, age 17-90, hours-per-week 1-99."""
    folder = ds.resolve_data_dir()
    if not (folder / ds.ADULT_FILES[0]).is_file():
        pytest.skip(f"real data set {ds.ADULT_FILES[0]} not in {folder} (set LDP_DATA_DIR)")
    data = ds.load_adult_numeric()
    assert (data.read, data.n) == (32_560, numeric.ADULT_ROWS)
    assert list(data.values) == ["adult-age", "adult-hours"]
    assert (data.lo["adult-age"], data.hi["adult-age"]) == (17, 90)
    assert (data.lo["adult-hours"], data.hi["adult-hours"]) == (1, 99)
    sets, note = numeric.datasets(numeric.Config.quick(), required=True)
    assert [d.name for d in sets] == ["uniform", "skewed", "adult-age", "adult-hours"]
    assert all(d.values.shape == (1000,) for d in sets) and "a random 1,000 of the 30,161 used" in note


def test_csv_column_may_not_take_the_name_of_a_synthetic_population(tmp_path: Path) -> None:
    path = tmp_path / "clash.csv"
    path.write_text("uniform,x\n" + "".join(f"{i},{i * 2}\n" for i in range(20)))
    with pytest.raises(ds.DatasetError, match="column 'uniform' has the name of one of the experiment's own"):
        numeric.datasets(numeric.Config.quick(dataset=str(path)), required=True)


# ====================================================================== the command
def test_numeric_quick_on_a_csv_file(tmp_path: Path) -> None:
    """``--dataset PATH``: every numeric column of the file is a data set of every part of the run, next to the
    synthetic populations; Adult is not read."""
    path = _csv(tmp_path / "people.csv")
    out = tmp_path / "out"
    result = _invoke([*SMALL, "--dataset", str(path), "--data-dir", str(tmp_path / "no-data"), "--out", str(out)])
    assert result.exit_code == 0, result.output + repr(result.exception)
    assert _datasets(out) == {"uniform", "skewed", "id", "income", "height"}
    assert [r["dataset"] for r in read_csv(out / "crossover.csv")] == ["worst case", "uniform", "skewed", "id",
                                                                       "income", "height"]
    w1 = [r["dataset"] for r in read_csv(out / "wasserstein.csv")]
    assert list(dict.fromkeys(w1)) == ["uniform", "skewed", "id", "income", "height"]
    assert {r["n"] for r in read_csv(out / "mean.csv") if r["dataset"] == "income"} == {294}
    config = json.loads((out / "config.json").read_text())
    assert config["dataset"] == str(path)
    assert config["data_note"].startswith("people.csv: 300 rows read, 294 without a missing value")


def test_numeric_csv_errors_exit_2(tmp_path: Path) -> None:
    path = _csv(tmp_path / "people.csv")
    for args, says in ((["--dataset", str(path), "--columns", "income,city"], "column 'city'"),
                       (["--dataset", str(tmp_path / "absent.csv")], "absent.csv"),
                       (["--dataset", "syn", "--columns", "income"], "--columns applies to a CSV file")):
        result = _invoke([*SMALL, *args, "--out", str(tmp_path / "x")])
        assert result.exit_code == 2, result.output
        assert "error:" in result.output and says in result.output.replace("\n", ""), result.output


def test_numeric_full_run_needs_adult(tmp_path: Path) -> None:
    """Without ``--quick`` a missing Adult file stops the run before any task (exit 2), naming the folder."""
    empty = tmp_path / "empty"
    empty.mkdir()
    result = _invoke(["--data-dir", str(empty), "--workers", "1", "--out", str(tmp_path / "x")])
    assert result.exit_code == 2, result.output
    assert "adult.data.gz" in result.output and "empty" in result.output.replace("\n", "")


def test_numeric_syn_does_not_need_the_data_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("LDP_DATA_DIR", str(empty))
    out = tmp_path / "out"
    result = _invoke([*SMALL, "--dataset", "syn", "--data-dir", str(empty), "--out", str(out)])
    assert result.exit_code == 0, result.output + repr(result.exception)
    assert "Adult skipped" not in result.output
    assert _datasets(out) == {"uniform", "skewed"}
    config = json.loads((out / "config.json").read_text())
    assert config["dataset"] == "syn" and config["data_note"].startswith("synthetic data only")
