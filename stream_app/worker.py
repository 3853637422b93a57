"""Run one stream-app worker in the current process (what ``ldp worker`` does).

The worker blocks until SIGTERM or SIGINT, then stops cleanly: it releases the estimator lease, commits
offsets and leaves the consumer group.

Its settings are one :class:`stream_app.settings.WorkerSettings` (options, environment variables,
defaults). Readiness: with ``ready_file`` set, the worker writes JSON there (pid, ``web_port``,
``web_url``, ``assigned`` partitions of the reports topic, topic names) once it owns partitions and
serves HTTP, and rewrites it after every rebalance; it also logs
``ldp worker <id> owns ... partitions [...]; web http://...`` (WARNING level, so it shows at the
default log level). ``ldpstream_dev.workers.WorkerProcess`` runs it in a child process for tests,
benchmarks and the demo.

At start, before it joins the group, the worker refuses campaigns whose retention cannot fit the Redis memory
(:func:`check_retention_memory`, the model of :mod:`stream_app.store.memory`): ``ldp worker`` exits with status 2
and ``error:`` the formula, its figures and what to change.

Outages (see also :mod:`stream_app.health`):

* a broker that does not answer at start is waited for: one metadata request per attempt, with
  backoff (0.5 s doubling to 10 s), each failed attempt logged with its error; SIGTERM ends the wait;
* while running, the Kafka client retries by itself and the worker resumes when the broker is back;
  the client libraries' repeated errors are rate-limited (:func:`stream_app.health.limit_repeated_logs`);
* SIGTERM / SIGINT stops the worker within ``shutdown_timeout`` seconds in every state: store calls
  waiting for Redis give up (the message is delivered again after the restart: counted once), the
  final offset commits, producer flushes, the producer's close and the Kafka consumer's close are bounded (they wait
  forever for an unreachable broker otherwise: :func:`_bound_shutdown_waits`), and a watchdog that the first
  signal arms exits the process (status 1) if the clean stop has not finished by the deadline,
  logging the stack of every thread; a second signal exits at once.
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import threading
import time
import traceback
from typing import Any, Callable

from .settings import WorkerSettings

__all__ = ["FORCED_EXIT_STATUS", "check_retention_memory", "run_worker"]

log = logging.getLogger(__name__)

#: Exit status of a worker the shutdown watchdog (or a second signal) ended.
FORCED_EXIT_STATUS = 1
#: How long the Kafka consumer thread may take to close its client at shutdown (s).
CONSUMER_CLOSE_TIMEOUT = 3.0
#: How long an offset commit or a producer flush may take at shutdown (s).
SHUTDOWN_FLUSH_TIMEOUT = 3.0


def run_worker(settings: WorkerSettings) -> None:
    """Build the app (:func:`stream_app.app.create_app`) and run it until SIGTERM/SIGINT.

    The support kernels run single-threaded in a worker: a worker is one event loop on one core,
    and numba's thread pool only adds launch overhead and oversubscription next to the broker;
    scale out with more workers (partitions) instead.
    """
    import faust
    import numba

    from .app import create_app, get_worker
    from .health import kafka_reachable, limit_repeated_logs

    from wire.campaign import load_campaigns

    campaigns = load_campaigns(list(settings.campaign_paths))
    notes = check_retention_memory(settings, campaigns)  # raises RetentionTooLarge: refused before anything starts
    numba.set_num_threads(1)
    _bound_shutdown_waits()

    app = create_app(settings, campaigns=campaigns)
    worker_state = get_worker(app)
    limit_repeated_logs()

    class LdpWorker(faust.Worker):
        """Faust's worker, plus: wait for the broker at start, and a shutdown deadline."""

        async def on_first_start(self) -> None:
            await super().on_first_start()  # logging set up, signal handlers installed
            for note in notes:
                log.warning("%s", note)
            _arm_shutdown_watchdog(self.loop, worker_state.begin_stop, settings.shutdown_timeout)
            await _wait_for_broker(settings.kafka_bootstrap, kafka_reachable)

    worker = LdpWorker(app, loglevel=settings.loglevel,
                       logfile=str(settings.logfile) if settings.logfile is not None else None,
                       quiet=True, redirect_stdouts=False)
    worker.spinner = None  # no terminal spinner escape codes in log files
    worker.execute_from_commandline()


def check_retention_memory(settings: WorkerSettings, campaigns: dict[str, Any],
                           redis_timeout: float = 5.0) -> list[str]:
    """Refuse (:class:`stream_app.store.memory.RetentionTooLarge`) campaigns whose retention cannot fit the Redis
    memory: ``redis_memory_bytes`` if set, else Redis's ``maxmemory`` (:mod:`stream_app.store.memory`); returns
    the warnings to log (an unbounded Redis, a Redis that did not answer within ``redis_timeout`` seconds: then
    nothing is checked)."""
    from wire.transport import redact_url

    from .store.memory import MemoryLimit, check_retention, read_max_memory

    if settings.redis_memory_bytes is not None:
        limits = {cid: MemoryLimit(settings.redis_memory_bytes, "LDP_REDIS_MEMORY_BYTES") for cid in campaigns}
    else:
        try:
            limits = read_max_memory(settings.redis_url, campaigns, redis_timeout)
        except Exception as exc:  # noqa: BLE001 - Redis away at start: the worker waits for it, unchecked
            return [f"cannot read the maxmemory of Redis at {redact_url(settings.redis_url)} ({exc}): the campaigns' "
                    f"retention is not checked against it (LDP_REDIS_MEMORY_BYTES checks it without asking Redis)"]
    return check_retention(campaigns, limits, settings.retention_batches_per_step)


async def _wait_for_broker(bootstrap: str, probe: Callable[[str, float], Any], *, first_delay: float = 0.5,
                           max_delay: float = 10.0) -> None:
    """Return once ``bootstrap`` answers a metadata request; retry with backoff, logging each failure."""
    started = time.monotonic()
    delay, attempt = first_delay, 0
    while True:
        attempt += 1
        error = await probe(bootstrap, 3.0)
        if error is None:
            if attempt > 1:
                log.warning("the Kafka broker %s answers after %d attempts (%.1f s); starting", bootstrap, attempt,
                            time.monotonic() - started)
            return
        log.warning("the Kafka broker %s is unreachable (attempt %d, %.0f s so far): %s; retrying in %.1f s",
                    bootstrap, attempt, time.monotonic() - started, error, delay)
        await asyncio.sleep(delay)
        delay = min(max_delay, delay * 2)


def _arm_shutdown_watchdog(loop: asyncio.AbstractEventLoop, begin_stop: Callable[[], None], timeout: float) -> None:
    """On the first SIGTERM/SIGINT: tell the worker (``begin_stop``) and start the deadline thread;
    on a second one: exit at once.

    asyncio delivers the signal to Faust through its wake-up fd whatever the Python-level handler is,
    so replacing asyncio's no-op handler keeps Faust's own shutdown; and this handler runs even while
    the event loop is blocked (a numba compile), which a loop callback would not.
    """
    first: list[float] = []

    def on_signal(signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if first:
            _force_exit(f"a second {name} {time.monotonic() - first[0]:.1f} s after the first", loop)
        first.append(time.monotonic())
        threading.Thread(target=_watchdog, args=(timeout, name, loop), name="ldp-shutdown-watchdog",
                         daemon=True).start()
        loop.call_soon_threadsafe(begin_stop)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)


def _watchdog(timeout: float, signal_name: str, loop: asyncio.AbstractEventLoop) -> None:
    time.sleep(timeout)
    _force_exit(f"the worker did not stop within {timeout:g} s of {signal_name}", loop)


def _force_exit(reason: str, loop: asyncio.AbstractEventLoop | None = None) -> None:
    """Log ``reason``, every thread's stack and the event loop's pending tasks (for at most 2 s: a stuck
    log handler must not stop the exit), then exit with :data:`FORCED_EXIT_STATUS`."""
    def report() -> None:
        frames = sys._current_frames()
        names = {t.ident: t.name for t in threading.enumerate()}
        stacks = [f"--- thread {names.get(ident, ident)}:\n{''.join(traceback.format_stack(frame))}"
                  for ident, frame in frames.items()]
        try:  # read from another thread: a best-effort diagnostic
            tasks = list(asyncio.all_tasks(loop)) if loop is not None else []
        except RuntimeError:
            tasks = []
        for task in tasks:
            stacks.append(f"--- task {task.get_name()}:\n" + "\n".join(_awaiting(task.get_coro())))
        log.critical("%s; exiting now (status %d). Where it was:\n%s", reason, FORCED_EXIT_STATUS, "\n".join(stacks))
        for handler in logging.getLogger().handlers:
            handler.flush()

    reporter = threading.Thread(target=report, name="ldp-exit-report", daemon=True)
    reporter.start()
    reporter.join(2.0)
    os._exit(FORCED_EXIT_STATUS)


def _awaiting(coro: Any) -> list[str]:
    """Where a task is: its coroutine and every coroutine (or generator) it awaits, outermost first."""
    lines = []
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None) or getattr(coro, "ag_frame", None)
        if frame is not None:
            lines.append(f'  File "{frame.f_code.co_filename}", line {frame.f_lineno}, in {frame.f_code.co_name}')
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None) or getattr(coro, "ag_await", None)
    return lines


def _bound_shutdown_waits() -> None:
    """Bound the waits of Faust's shutdown that never end while the broker is unreachable.

    * The final offset commits and the producer flushes (``wait_empty``, the consumer's stop commit,
      "Flush producer buffer"; aiokafka waits for a group coordinator forever, and a flush for every
      pending send up to the request timeout): once the app stops, each gets
      :data:`SHUTDOWN_FLUSH_TIMEOUT` seconds (0.5 s while the health check already knows the broker is
      gone), also one that started before the stop (the stop waits for it). An offset not committed
      is harmless: the next owner of a partition starts at the position recorded in Redis; an
      estimate not flushed is published again by the next lease holder.
    * The Kafka consumer thread's close. With the broker down, aiokafka's fetcher sleeps its retry
      backoff inside an ``except`` block; closing it then raises ``CancelledError`` out of
      ``AIOKafkaConsumer.stop()``, which mode's thread service does not catch: the thread dies without
      signalling its shutdown and Faust waits for it forever. The close gets a deadline and that error
      is swallowed, so the stop goes on.
    * The producer's close, which flushes every pending send first (:func:`_bounded_producer_stop`).
    """
    from faust.transport.consumer import ThreadDelegateConsumer
    from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread, Producer

    if getattr(AIOKafkaConsumerThread.on_thread_stop, "_ldp_bounded", False):
        return
    ThreadDelegateConsumer._commit = _bounded_at_stop(  # type: ignore[method-assign]
        ThreadDelegateConsumer._commit, "offsets not committed", False)
    Producer.flush = _bounded_at_stop(Producer.flush, "producer buffer not flushed", None)  # type: ignore

    async def on_thread_stop(self: Any) -> None:
        await super(AIOKafkaConsumerThread, self).on_thread_stop()  # the method queue, as Faust's own does
        consumer = self._consumer
        if consumer is None:
            return
        try:
            await asyncio.wait_for(consumer.stop(), CONSUMER_CLOSE_TIMEOUT)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise
            log.warning("the Kafka consumer was closed while it retried an unreachable broker")
        except asyncio.TimeoutError:
            log.warning("the Kafka consumer did not close within %g s (broker unreachable?); stopping anyway",
                        CONSUMER_CLOSE_TIMEOUT)
        except Exception:  # noqa: BLE001 - shutting down: report and go on
            log.exception("closing the Kafka consumer failed")

    on_thread_stop._ldp_bounded = True  # type: ignore[attr-defined]
    AIOKafkaConsumerThread.on_thread_stop = on_thread_stop  # type: ignore[method-assign]
    Producer.on_stop = _bounded_producer_stop(Producer.on_stop)  # type: ignore[method-assign]


def _shutdown_wait(app: Any) -> float:
    """How long one shutdown flush may take: :data:`SHUTDOWN_FLUSH_TIMEOUT`, 0.5 s if the health check
    already knows the broker is unreachable."""
    worker = getattr(app, "ldp", None)  # the app's stream_app.app.Worker
    return 0.5 if worker is not None and worker.health.has("kafka") else SHUTDOWN_FLUSH_TIMEOUT


def _bounded_producer_stop(on_stop: Callable[..., Any]) -> Callable[..., Any]:
    """Faust's producer ``on_stop`` with a deadline. aiokafka's ``AIOKafkaProducer.stop()`` first waits for
    every pending send to be delivered, which retries forever while the broker is unreachable; past the
    deadline its sender and client are closed without that flush (the estimates it held are published
    again by the next lease holder)."""
    async def bounded(self: Any) -> None:
        kafka = self._producer
        stopping = asyncio.ensure_future(on_stop(self))
        timeout = _shutdown_wait(self.app)
        done, _ = await asyncio.wait({stopping}, timeout=timeout)
        if done:
            return stopping.result()
        stopping.cancel()
        log.warning("the Kafka producer did not flush within %g s at shutdown (broker unreachable?); "
                    "closing it without", timeout)
        if kafka is not None:
            for close in (kafka._sender.close, kafka.client.close):
                try:
                    await asyncio.wait_for(close(), 1.0)
                except (Exception, asyncio.TimeoutError):  # noqa: BLE001 - shutting down: report and go on
                    log.warning("closing the Kafka producer failed", exc_info=True)
        return None

    return bounded


def _bounded_at_stop(method: Callable[..., Any], what: str, gave_up: Any) -> Callable[..., Any]:
    """``method`` of a Faust service (it has ``self.app``), given up once the app has been stopping for
    :data:`SHUTDOWN_FLUSH_TIMEOUT` seconds (0.5 s if the broker is known to be down); returns ``gave_up`` then."""
    async def bounded(self: Any, *args: Any) -> Any:
        app = self.app
        pending = asyncio.ensure_future(method(self, *args))
        stopping_since: float | None = None
        while True:
            done, _ = await asyncio.wait({pending}, timeout=0.25)
            if done:
                return pending.result()
            if not app.should_stop:
                continue
            now = time.monotonic()
            stopping_since = stopping_since or now
            timeout = _shutdown_wait(app)
            if now - stopping_since >= timeout:
                pending.cancel()
                log.warning("%s at shutdown within %g s (broker unreachable?)", what, timeout)
                return gave_up

    return bounded
