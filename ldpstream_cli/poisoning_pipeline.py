"""``ldp experiment poisoning --pipeline``: the same attacks as ``ldp experiment poisoning``, through the real
HTTP ingest, broker and worker, with and without the live defense (campaign ``defense``, :mod:`stream_app.defense`).

One local stack, one worker and one ingest (open mode: the experiment measures the defense, not the tokens).
A campaign gets, per protocol, an attribute without defense (``<protocol>_plain``) and, where the protocol has
a sound one, the same attribute with ``defense = "itemset"`` (``<protocol>_defended``: the per-report size check
at the ingest and the worker, the co-support itemset at the final; unary protocols) and a third with the defense
that receives the genuine reports only (``<protocol>_honest``: what the defense takes from honest data).
``n`` genuine devices draw
Zipf values (as the offline experiment) and report once; ``m = β n / (1 − β)`` fake devices send the attack's
crafted reports (:func:`estimators.poisoning.craft_reports`); the same reports go to both attributes in compact
bodies, all of one step. The gain is ``Σ_t f̃_t(final estimate) − f̃_t(genuine reports alone)``, read from the
worker's final estimates; the genuine reports rejected are those the defense left out of the honest attribute
(the ingest's 422 ``implausible_report`` refusals, whose requests are resent without them, plus ``n_rejected`` of
the final).
Everything is seeded (simulation mode: the reports are NOT private).
"""
from __future__ import annotations

import http.client
import json
import tempfile
import time
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from estimators import poisoning as P
from estimators.randomness import SimulationWarning
from producers.datasets import zipf_weights
from wire.campaign import Campaign, step_at
from wire.compact import CONTENT_TYPE, encode_compact

from .options import build, parameters

if TYPE_CHECKING:
    from ldpstream_dev.stack import LocalStack

__all__ = ["PIPELINE_PROTOCOLS", "PipelineRow", "run_pipeline"]

PIPELINE_PROTOCOLS = ("OUE", "L-OSUE", "GRR", "L-GRR", "LOLOHA")
_REQUEST_REPORTS = 2_000  # reports per compact request


@dataclass
class PipelineRow:
    """One protocol's measurement through the pipeline."""

    protocol: str
    defense: str  # the defended attribute's defense ("none": the protocol has no sound one)
    n: int
    m: int
    gain: float  # without defense
    gain_defended: float  # with it (= gain where there is none)
    refused_at_ingest: int  # reports of the defended attribute the ingest refused (422 implausible_report)
    rejected_by_worker: int  # n_rejected of the defended final
    n_final: int  # n of the defended final
    genuine_rejected: int  # reports of the honest attribute (genuine only, with the defense) left out

    @property
    def genuine_rejected_attacked(self) -> int:
        """Genuine reports left out of the attacked step, at least (every fake left out: the rest are genuine)."""
        return max(0, self.refused_at_ingest + self.rejected_by_worker - self.m) if self.defense != "none" else 0

    @property
    def genuine_rejected_fraction(self) -> float:
        return self.genuine_rejected / self.n


def _slug(protocol: str) -> str:
    return protocol.replace("-", "").lower()


def _defense_of(protocol) -> str:  # type: ignore[no-untyped-def]
    from estimators.hashing import LOLOHA

    fam = P.family(protocol)
    return "itemset" if fam in ("unary", "hashing") and not isinstance(protocol, LOLOHA) else "none"


def _campaign_toml(cid: str, protos: dict[str, object], k: int, eps: float) -> str:
    lines = ["[campaign]", f'id = "{cid}"', "time_step_seconds = 2.0", "lateness_seconds = 4.0",
             "max_batch_reports = 100000", ""]
    for name, proto in protos.items():
        takes = parameters(name)
        params = "\n".join(f"{key} = {value}" for key, value in (("eps", eps), ("eps_1", eps), ("eps_inf", 2 * eps))
                            if key in takes)
        for suffix, defense in (("plain", "none"), ("defended", _defense_of(proto)), ("honest", _defense_of(proto))):
            if suffix != "plain" and defense == "none":
                continue
            lines += ["[[attributes]]", f'name = "{_slug(name)}_{suffix}"', f"k = {k}", f'protocol = "{name}"',
                      params, f'defense = "{defense}"', ""]
    return "\n".join(lines)


class _Sender:
    """POSTs compact bodies to the ingest, resending a request refused as implausible without those reports."""

    def __init__(self, url: str) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.conn = http.client.HTTPConnection(host, int(port), timeout=60)
        self.refused = 0

    def send(self, campaign: Campaign, attribute: str, t: int, reports: np.ndarray) -> None:
        for i in range(0, len(reports), _REQUEST_REPORTS):
            chunk = reports[i:i + _REQUEST_REPORTS]
            while len(chunk):
                status, doc = self._post(encode_compact([(campaign, attribute, t, chunk)]))
                if status == 200:
                    break
                if status == 422 and doc.get("error") == "implausible_report":
                    bad = {int(e["index"]) for e in doc.get("errors", [])}
                    self.refused += len(bad)
                    chunk = chunk[[j for j in range(len(chunk)) if j not in bad]]
                    continue
                raise RuntimeError(f"the ingest answered {status}: {doc}")

    def _post(self, body: bytes) -> tuple[int, dict]:
        self.conn.request("POST", "/reports", body=body, headers={"Content-Type": CONTENT_TYPE})
        resp = self.conn.getresponse()
        raw = resp.read()
        return resp.status, json.loads(raw) if raw else {}

    def close(self) -> None:
        self.conn.close()


def run_pipeline(protocols: Sequence[str] = PIPELINE_PROTOCOLS, attack: str = "MGA", n: int = 20_000,
                 beta: float = 0.05, eps: float = 1.0, k: int = 100, r: int = 5, seed: int = 0,
                 on_status: Callable[[str], None] = print, timeout: float = 180.0,
                 stack: "LocalStack | None" = None) -> list[PipelineRow]:
    """Run the attack through a local stack (``stack``: a running one, else a fresh one in memory mode), a worker
    and an ingest; one row per protocol (module doc)."""
    from ldpstream_dev.stack import LocalStack  # noqa: F811 - the dev stack is imported only when run
    from ldpstream_dev.workers import IngestProcess, WorkerProcess, estimate_history, final_estimates

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SimulationWarning)
        protos = {name: build(name, k=k, eps=eps, eps_inf=2 * eps, eps_1=eps) for name in protocols}
        run_dir = Path(tempfile.mkdtemp(prefix="ldp-poisoning-"))
        cid = f"poisoning-{uuid.uuid4().hex[:8]}"
        path = run_dir / "campaign.toml"
        path.write_text(_campaign_toml(cid, protos, k, eps))
        campaign = Campaign.load(path)
        own_stack = stack is None
        if stack is None:
            stack = LocalStack(run_dir / "stack", broker_storage="memory")
            stack.up()
        info = stack.info
        assert info is not None
        prefix = f"{cid}."  # topics of its own: a shared stack may serve other pipelines
        worker = ingest = None
        try:
            on_status(f"stack up ({info.kafka_bootstrap}, {info.redis_url}); starting a worker and an ingest")
            worker = WorkerProcess([path], info.kafka_bootstrap, info.redis_url, run_dir=run_dir, refresh_seconds=0.5,
                                   topic_prefix=prefix, app_id=cid)
            ingest = IngestProcess([path], info.kafka_bootstrap, info.redis_url, run_dir=run_dir,
                                   max_late_seconds=600.0, topic_prefix=prefix)
            worker.start()
            ingest.start()
            worker.wait_ready(120)
            ingest.wait_ready(120)
            t = step_at(campaign, time.time())
            plans: list[tuple[str, np.ndarray, np.ndarray, int]] = []
            sender = _Sender(ingest.url)
            refused: dict[str, int] = {}
            for name, proto in protos.items():
                rng = np.random.default_rng([seed, k, n, int(eps * 1000), sum(map(ord, name))])
                weights = zipf_weights(k, 1.1)[rng.permutation(k)]
                values = rng.choice(k, size=n, p=weights)
                targets = np.sort(rng.choice(k, size=r, replace=False))
                genuine = proto.randomize(values, rng, state=proto.new_state(n, rng))
                m = P.fake_count(n, beta)
                fake = P.craft_reports(proto, attack, targets, m, rng)
                reports = np.concatenate([genuine, fake])[rng.permutation(n + m)]
                before = proto.estimate(proto.support(genuine), n)
                for suffix, batch in (("plain", reports), ("defended", reports), ("honest", genuine)):
                    attribute = f"{_slug(name)}_{suffix}"
                    if attribute not in campaign.attributes:
                        continue
                    sent_before = sender.refused
                    on_status(f"{name}: sending {len(batch):,} reports ({n:,} genuine"
                              f"{f', {m:,} fake ({attack})' if len(batch) > n else ''}) to {attribute}")
                    sender.send(campaign, attribute, t, batch)
                    refused[attribute] = sender.refused - sent_before
                plans.append((name, before, targets, m))
            sender.close()
            on_status(f"all reports sent (step {t}); waiting for the final estimates")
            finals: dict[str, dict] = {}
            deadline = time.monotonic() + timeout
            wanted = set(campaign.attributes)
            while wanted - finals.keys():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no final estimate of {sorted(wanted - finals.keys())} after {timeout} s; "
                                       f"worker log:\n{worker.log_tail()}")
                for attribute in wanted - finals.keys():
                    doc = final_estimates(estimate_history(worker, cid, attribute)).get(t)
                    if doc is not None:
                        finals[attribute] = doc
                time.sleep(0.5)
            rows = []
            for name, before, targets, m in plans:
                plain = finals[f"{_slug(name)}_plain"]
                defended_attr = f"{_slug(name)}_defended"
                dfin = finals.get(defended_attr, plain)
                gain = P.frequency_gain(np.array(plain["frequencies"]), before, targets)
                gain_d = P.frequency_gain(np.array(dfin["frequencies"]), before, targets)
                honest_attr = f"{_slug(name)}_honest"
                honest = finals.get(honest_attr)
                genuine_out = (refused.get(honest_attr, 0) + int(honest.get("n_rejected") or 0)) if honest else 0
                rows.append(PipelineRow(name, _defense_of(protos[name]), n, m, gain, gain_d,
                                        refused.get(defended_attr, 0), int(dfin.get("n_rejected") or 0),
                                        int(dfin["n"]), genuine_out))
            return rows
        finally:
            for proc in (ingest, worker):
                if proc is not None:
                    proc.stop()
            if own_stack:
                stack.down()
