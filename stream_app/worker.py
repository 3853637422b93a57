"""Run one stream-app worker in the current process (what ``ldp worker`` does).

The worker blocks until SIGTERM or SIGINT, then stops cleanly: it flushes the HTTP ingest queue,
releases the estimator lease, commits offsets and leaves the consumer group.

Its settings are one :class:`stream_app.settings.WorkerSettings` (options, environment variables,
defaults). Readiness: with ``ready_file`` set, the worker writes JSON there (pid, ``web_port``,
``web_url``, ``assigned`` partitions of the reports topic, topic names) once it owns partitions and
serves HTTP, and rewrites it after every rebalance; it also logs
``ldp worker <id> owns ... partitions [...]; web http://...`` (WARNING level, so it shows at the
default log level). ``devtools.workers.WorkerProcess`` runs it in a child process for tests,
benchmarks and the demo.
"""
from __future__ import annotations

from .settings import WorkerSettings

__all__ = ["run_worker"]


def run_worker(settings: WorkerSettings) -> None:
    """Build the app (:func:`stream_app.app.create_app`) and run it until SIGTERM/SIGINT.

    The support kernels run single-threaded in a worker: a worker is one event loop on one core,
    and numba's thread pool only adds launch overhead and oversubscription next to the broker;
    scale out with more workers (partitions) instead.
    """
    import faust
    import numba

    from .app import create_app

    numba.set_num_threads(1)

    app = create_app(settings)
    worker = faust.Worker(app, loglevel=settings.loglevel,
                          logfile=str(settings.logfile) if settings.logfile is not None else None,
                          quiet=True, redirect_stdouts=False)
    worker.spinner = None  # no terminal spinner escape codes in log files
    worker.execute_from_commandline()
