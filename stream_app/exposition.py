"""What every ``/metrics`` of the project adds to its own series: ``ldp_build_info``, the process metrics, and no
``_created`` series.

* ``ldp_build_info{version, python_version, numpy_version, numba_version} 1``: the build that answers, one series
  per process (the worker's and the ingest's alike), so that a dashboard can join versions on ``instance``;
* the process metrics of prometheus_client (``process_cpu_seconds_total``, ``process_resident_memory_bytes``,
  ``process_open_fds``, ``process_start_time_seconds``, ...; Linux ``/proc``) and ``python_info``. A worker is one
  process: its registry carries the standard collectors. The ingest (``ldp ingest --processes N``) is N processes
  behind one port, and prometheus_client's ``ProcessCollector`` reports only the process that answers the
  scrape, a different one from scrape to scrape: :class:`SiblingProcessCollector` reports every live process of
  the ingest instead, one series per process with a ``pid`` label (``sum(rate(process_cpu_seconds_total[1m]))``
  is the ingest's CPU, ``sum(process_resident_memory_bytes)`` its memory; a replaced process is a new series, and
  its counter does not jump backwards). The processes are those that write the multiprocess files
  (``PROMETHEUS_MULTIPROC_DIR``), the answering one and its siblings (same parent); uvicorn's supervisor, which
  only waits, is not among them;
* prometheus_client exports, beside each counter and histogram, a ``<name>_created`` gauge of its creation time:
  as many series again, that nothing here reads. :func:`disable_created_series` turns them off for the whole
  process (the ingest's multiprocess exposition never had them).
"""
from __future__ import annotations

import functools
import os
import platform
import re
from importlib import metadata
from pathlib import Path
from typing import Iterable, Iterator

from prometheus_client import ProcessCollector, disable_created_metrics
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["BuildInfoCollector", "SiblingProcessCollector", "build_info", "disable_created_series"]

#: The distribution whose version ``ldp_build_info`` reports.
DISTRIBUTION = "ldp-stream"


def disable_created_series() -> None:
    """No ``<name>_created`` series from counters and histograms created from now on, in this process."""
    disable_created_metrics()


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "unknown"


@functools.lru_cache(maxsize=1)
def build_info() -> dict[str, str]:
    """The labels of ``ldp_build_info``: the project's version and those of Python, numpy and numba."""
    return {"version": _version(DISTRIBUTION), "python_version": platform.python_version(),
            "numpy_version": _version("numpy"), "numba_version": _version("numba")}


class BuildInfoCollector(Collector):
    """``ldp_build_info`` (always 1), labelled with :func:`build_info`."""

    def __init__(self) -> None:
        self._labels = dict(build_info())

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily("ldp_build_info", "The build of this process: the ldp-stream version and those "
                                   "of Python, numpy and numba (always 1).", labels=list(self._labels))
        family.add_metric(list(self._labels.values()), 1.0)
        yield family


_DB_PID = re.compile(r"_(\d+)\.db$")


def _parent(pid: int, proc: Path) -> int | None:
    try:
        return int((proc / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


class SiblingProcessCollector(Collector):
    """The process metrics of every live process that writes to the multiprocess directory ``directory`` and is
    this one or a sibling (same parent), each with a ``pid`` label (module doc)."""

    def __init__(self, directory: str | os.PathLike[str], proc: str = "/proc") -> None:
        self.directory = Path(directory)
        self.proc = Path(proc)

    def pids(self) -> list[int]:
        """The processes reported: this one and its live siblings among the writers of the directory."""
        me, parent = os.getpid(), os.getppid()
        found = {me}
        for path in self.directory.glob("*.db"):
            m = _DB_PID.search(path.name)
            if m and int(m.group(1)) != me and _parent(int(m.group(1)), self.proc) == parent:
                found.add(int(m.group(1)))
        return sorted(found)

    def collect(self) -> Iterable[Metric]:
        merged: dict[str, Metric] = {}
        for pid in self.pids():
            for family in ProcessCollector(pid=lambda p=pid: p, proc=str(self.proc), registry=None).collect():
                out = merged.get(family.name)
                if out is None:
                    out = merged[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
                for s in family.samples:
                    out.add_sample(s.name, {**s.labels, "pid": str(pid)}, s.value, s.timestamp, s.exemplar)
        return list(merged.values())
