"""Open-domain campaign attributes (issue 24): parsing and refusals, an attribute's own retention and the Redis
model, the estimate's top-K and candidates, and the query API's arguments. No services."""
from __future__ import annotations

import numpy as np
import pytest

from estimators.sketch.hashing import value_id
from stream_app.api import query_answer, query_args
from stream_app.store.memory import campaign_need, step_bytes
from stream_app.windows import open_fields
from wire.campaign import Campaign, CampaignError

HEAD = {"campaign": {"id": "c", "retention_steps": 100}}


def _campaign(**attr) -> Campaign:
    spec = {"name": "crash", "type": "string", "protocol": "HCMS", "eps": 4.0, "m": 64, "k": 8, **attr}
    return Campaign.from_dict({**HEAD, "attributes": [spec, {"name": "opt_in", "k": 2, "protocol": "GRR",
                                                             "eps": 1.0}]})


def test_an_open_attribute_and_its_defaults() -> None:
    a = _campaign(candidates=["x", "y"]).attributes["crash"]
    assert a.open_domain and a.value_type == "string" and a.top == 10 and a.candidates == ("x", "y")
    assert a.protocol.params()["seed"] == value_id("crash")  # public rows differ per attribute by default
    assert a.k == a.protocol.support_size and not a.numeric
    assert a.candidate_names() == {value_id("x"): "x", value_id("y"): "y"}
    assert a.value_id("x") == value_id("x")
    with pytest.raises(CampaignError, match="takes strings"):
        a.value_id(3)


@pytest.mark.parametrize("attr, match", [
    (dict(protocol="OLH"), "open-domain protocol"),
    (dict(top=0), "top must be"),
    (dict(candidates=["a", "a"]), "listed twice"),
    (dict(candidates=[1]), "is not a string"),
    (dict(labels=["a"]), "no labels"),
    (dict(defense="itemset"), "poisoning defense"),
    (dict(range=[0, 1]), "not range or mechanism"),
    (dict(m=3), "power of 2"),
    (dict(bogus=1), "bogus"),
    (dict(retention_steps=0), "retention_steps must be"),
])
def test_bad_open_attributes_are_refused_with_the_reason(attr, match) -> None:
    with pytest.raises(CampaignError, match=match):
        _campaign(**attr)


def test_u64_candidates_are_integers() -> None:
    a = _campaign(type="u64", candidates=[7, 2**64 - 1]).attributes["crash"]
    assert a.value_id(7) == 7 and a.candidate_names()[2**64 - 1] == 2**64 - 1
    with pytest.raises(CampaignError, match="integer in"):
        _campaign(type="u64", candidates=["7"])
    with pytest.raises(CampaignError, match="integers in"):
        a.value_id(-1)


def test_an_attributes_own_retention_replaces_the_campaigns_in_the_memory_model() -> None:
    c = _campaign(retention_steps=7)
    crash, opt = c.attributes["crash"], c.attributes["opt_in"]
    assert c.retention_of(crash) == 7 and c.retention_of(opt) == 100
    need = campaign_need(c)
    assert need.total == 7 * step_bytes(crash) + 100 * step_bytes(opt)
    assert "crash's own retention_steps 7" in need.formula()


def test_estimate_fields_and_queries_agree_with_the_protocol() -> None:
    c = _campaign(candidates=["a", "b", "c"], top=2)
    a = c.attributes["crash"]
    proto = a.protocol
    ids = np.array([value_id(v) for v in ["a"] * 600 + ["b"] * 300 + ["z"] * 100], dtype=np.uint64)
    support = proto.support(proto.randomize(ids, np.random.default_rng(1)))
    fields = open_fields(a, support, 1000)
    est = proto.estimate(support, 1000, a.candidate_ids())
    assert [e["frequency"] for e in fields["candidates"]] == pytest.approx(est)
    order = np.argsort(-est, kind="stable")[:2]
    assert [e["value"] for e in fields["top_k"]] == [["a", "b", "c"][j] for j in order]
    assert all(e["ci95"][0] < e["frequency"] < e["ci95"][1] for e in fields["top_k"])
    values, t = query_args(a, ["a", "q"], "3")
    assert values == ["a", "q"] and t == 3
    ans = query_answer(c, a, 3, values, support, 1000)
    assert ans["status"] == "ok" and ans["values"][0]["frequency"] == pytest.approx(est[0])
    assert query_answer(c.__class__.from_dict({**HEAD, "campaign": {"id": "c", "min_n": 5000},
                                               "attributes": [dict(c.source["attributes"][0])]}),
                        a, 3, values, support, 1000)["values"][0]["frequency"] is None


@pytest.mark.parametrize("values, t, match", [
    ([], None, "at least one value"),
    (["a"] * 101, None, "at most 100"),
    (["a"], "x", "step number"),
    (["a"], "-1", "step number"),
])
def test_queries_that_cannot_be_answered_say_why(values, t, match) -> None:
    with pytest.raises(ValueError, match=match):
        query_args(_campaign().attributes["crash"], values, t)
    with pytest.raises(ValueError, match="decimal integers"):
        query_args(_campaign(type="u64").attributes["crash"], ["abc"], None)
    with pytest.raises(ValueError, match="only an open-domain"):
        query_args(_campaign().attributes["opt_in"], ["a"], None)


def test_campaigns_api_gives_every_attributes_type() -> None:
    """``GET /campaigns``'s ``type`` of each kind of attribute (the dashboards choose their charts by it)."""
    from stream_app.api import campaign_doc

    c = Campaign.from_dict({**HEAD, "attributes": [
        {"name": "crash", "type": "u64", "protocol": "CMS", "eps": 2.0, "m": 16, "k": 2, "candidates": [5]},
        {"name": "secs", "type": "numeric", "range": [0, 1], "mechanism": "PM", "eps": 1.0},
        {"name": "opt_in", "k": 2, "protocol": "GRR", "eps": 1.0}]})
    doc = {a["name"]: a for a in campaign_doc(c)["attributes"]}
    assert [doc[n]["type"] for n in ("crash", "secs", "opt_in")] == ["u64", "numeric", "categorical"]
    assert doc["crash"]["candidates"] == ["5"] and doc["crash"]["top"] == 10 and doc["crash"]["domain_size"] is None
    assert doc["secs"]["range"] == [0.0, 1.0] and doc["secs"]["top"] is None
