"""Numeric campaign attributes (issue 23) outside the pipeline: the campaign file's checks, the wire codecs
(single-report JSON, compact body), the SDK's numbers (clipped and counted, NaN refused), and the fleet's drifting
metric. The pipeline itself: tests/test_numeric_pipeline.py."""
from __future__ import annotations

import base64
import warnings
from typing import Any

import numpy as np
import pytest

from producers.datasets import DriftingMetric
from producers.sdk import Device
from wire.campaign import Campaign, CampaignError
from wire.compact import decode_compact, encode_compact
from wire.single_report import decode_single_report

warnings.filterwarnings("ignore", message="simulation mode")


def _campaign(**attr: Any) -> Campaign:
    spec = {"name": "x", "type": "numeric", "range": [0.0, 100.0], "mechanism": "PM", "eps": 1.0, **attr}
    spec = {k: v for k, v in spec.items() if v is not None}
    return Campaign.from_dict({"campaign": {"id": "num"}, "attributes": [spec]})


@pytest.mark.parametrize("change, message", [
    ({"range": None}, "needs range"), ({"range": [1.0]}, "needs range"), ({"range": [5.0, 1.0]}, "lo < hi"),
    ({"range": ["a", 2]}, "needs range"), ({"mechanism": "GRR"}, "needs a mechanism"), ({"mechanism": None}, "needs a mechanism"),
    ({"k": 4}, "not 'k'"), ({"labels": ["a", "b"]}, "no labels"), ({"defense": "itemset"}, "defense"),
    ({"eps": -1.0}, "eps"), ({"grid_bits": 40}, "grid_bits"), ({"type": "float"}, "type must be"),
    ({"mechanism": "SW", "s": 3}, "unexpected keyword"),
])
def test_a_numeric_attribute_that_cannot_be_used_is_refused_with_its_reason(change: dict, message: str) -> None:
    with pytest.raises(CampaignError, match=message):
        _campaign(**change)


def test_a_numeric_attribute_cannot_join_a_group() -> None:
    with pytest.raises(CampaignError, match="cannot belong to group"):
        Campaign.from_dict({"campaign": {"id": "g"}, "attributes": [
            {"name": "a", "type": "numeric", "range": [0, 1], "mechanism": "PM", "eps": 1.0}, {"name": "b", "k": 2}],
            "groups": [{"name": "grp", "solution": "SPL", "attributes": ["a", "b"], "eps": 1.0}]})


def test_the_fingerprint_is_the_mechanisms_and_changes_with_its_parameters() -> None:
    a, b = _campaign(), _campaign(range=[0.0, 200.0])
    pa = a.attribute("x").protocol
    assert pa.params() == {"mechanism": "PM", "eps": 1.0, "lo": 0.0, "hi": 100.0, "grid_bits": 16}
    assert pa.fingerprint == pa.mechanism.fingerprint != b.attribute("x").protocol.fingerprint
    assert a.fingerprint != b.fingerprint


@pytest.mark.parametrize("mechanism, extra", [("Laplace", {}), ("Duchi", {}), ("PM", {}), ("HM", {}),
                                              ("SW", {"d_in": 32, "d_out": 32}), ("1BitMean", {"s": 4})])
def test_numeric_reports_travel_the_single_report_json_and_the_compact_body(mechanism: str, extra: dict) -> None:
    c = _campaign(mechanism=mechanism, **extra)
    proto = c.attribute("x").protocol
    reports = proto.randomize(np.array([10.0, 55.5, 150.0]), np.random.default_rng(1), state=proto.new_state(3))
    body = encode_compact([(c, "x", 5, reports)])
    (section,) = decode_compact(body, {c.id: c})
    np.testing.assert_array_equal(section.reports, reports)
    one = {"campaign": c.id, "attribute": "x", "t": 5, "payload": base64.b64encode(proto.encode(reports[:1])).decode()}
    assert decode_single_report(one, {c.id: c}).reports.tolist() == reports[:1].tolist()


def test_the_sdk_clips_and_counts_and_refuses_what_is_not_a_number(tmp_path) -> None:
    c = _campaign(mechanism="1BitMean", s=4)
    dev = Device(c, tmp_path / "dev", budget_eps=50.0)
    for v in (10, 20.5, 150.0, -3.0, 20.5):
        dev.report("x", v, t=1)
    assert dev.clipped("x") == 2
    for bad in (float("nan"), float("inf"), "12", True, None):
        with pytest.raises(Exception, match="number"):
            dev.report("x", bad, t=1)
    assert dev.clipped("x") == 2
    # 1BitMean memoizes rounded points (s = 4: 0, 25, ..., 100): 10 rounds to 0 or 25, 20.5 to 0 or 25, 150 to 100,
    # -3 to 0: at most 3 distinct points, at least 2 (100, and 0 or 25)
    assert 2 <= dev.memoized_count("x") <= 3 and dev.privacy_loss("x") <= dev.reserved_loss()


def test_the_drifting_metric_moves_with_its_period_and_clips_its_outliers() -> None:
    pop = DriftingMetric(50_000, 0.0, 100.0, p_change=0.25, period=12, outliers=0.01, rng=np.random.default_rng(3))
    means = []
    for _ in range(12):
        v = pop.step()
        means.append(np.clip(v, 0, 100).mean())
    assert np.argmax(means) == 3 and np.argmin(means) == 9  # the sine's peak and trough (t = period/4, 3 period/4)
    # an outlier's baseline is hi + (hi - lo) U: past hi after the drift d iff U > 1/d - 1
    d = pop.drift(11)
    p = 0.01 * (1.0 - min(max(1.0 / d - 1.0, 0.0), 1.0))
    assert abs(np.mean(v > 100.0) - p) < 4 * np.sqrt(p * (1 - p) / 50_000)


def test_a_restarted_device_keeps_its_numeric_last_value_and_a_refused_report_counts_no_clip(tmp_path) -> None:
    c = _campaign(mechanism="1BitMean", s=4)
    dev = Device(c, tmp_path / "dev", budget_eps=50.0)
    dev.report("x", 37.5, t=1)
    dev.close()
    again = Device(c, tmp_path / "dev", budget_eps=50.0)
    assert again.last_values["x"] == 37.5  # a float, not truncated to 37
    again.report("x", 37.5, t=2)
    assert again.memoized_count("x") == 1
    again.close()
    pm = _campaign()  # memoryless: every report spends eps_first; a budget of one report refuses the second
    tight = Device(pm, tmp_path / "tight", budget_eps=1.0)
    tight.report("x", 150.0, t=1)
    with pytest.raises(Exception, match="budget"):
        tight.report("x", 150.0, t=2)
    assert tight.clipped("x") == 1  # the refused report made nothing, counted nothing
