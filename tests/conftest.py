"""Shared fixtures of the test suite."""
from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20261122)


@pytest.fixture(scope="session")
def local_stack(tmp_path_factory):
    """A real local stack (tansu broker + redis-server) shared by the whole session.

    Yields the started ``ldpstream_dev.stack.LocalStack``; ``local_stack.info`` has
    ``kafka_bootstrap`` ("127.0.0.1:PORT") and ``redis_url`` ("redis://127.0.0.1:PORT/0").
    The broker keeps its topics in the stack's run dir (durable storage, the default), which lives only
    as long as the session: tests should use their own topic and group names.
    """
    from ldpstream_dev.stack import LocalStack

    stack = LocalStack(run_dir=tmp_path_factory.mktemp("local-stack"))
    stack.up(timeout=60.0, stop_on_exit=True)
    try:
        yield stack
    finally:
        stack.down()


def pytest_collection_modifyitems(config, items):
    """Under ``pytest -n N --dist loadgroup`` (``make test``) tests go to whichever worker process is free,
    one by one, except the tests of a module that share a module- or class-scoped fixture (a pipeline, an
    ingest, a built venv): those stay together on one worker, so the fixture is built once."""
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        defs = info.name2fixturedefs.values() if info is not None else ()
        if any(d[-1].scope in ("module", "class", "package") for d in defs if d):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
