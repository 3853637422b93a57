"""Debian packages that some tests need (``prometheus``, ``chromium``), installed on demand.

:func:`ensure_binary` returns the path of a binary, installing its package with apt first when it is
missing (``apt-get install -y --no-install-recommends``, after an ``apt-get update`` when the package is
unknown to the local lists), under an inter-process lock so that parallel test sessions do not fight over
dpkg's lock. It raises :class:`ToolUnavailable` where installing is impossible here (not root, no apt-get):
tests turn that into a loud skip; an install that was possible but failed (apt-get's error, no network, a
timeout) raises :class:`ToolInstallError`, which fails the test with apt's output. Installing never starts a
service: ``policy-rc.d`` forbids it for the time of the install (Debian's ``prometheus`` package would
otherwise start its systemd unit where systemd runs).
"""
from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

__all__ = ["ToolInstallError", "ToolUnavailable", "ensure_binary"]

_APT_LOCK = Path(tempfile.gettempdir()) / "ldp-apt-install.lock"
_POLICY_RC = Path("/usr/sbin/policy-rc.d")


class ToolUnavailable(RuntimeError):
    """A binary is missing and this machine cannot install packages (not root, no apt-get)."""


class ToolInstallError(RuntimeError):
    """Installing a missing binary's package was possible but failed (the message has apt-get's output)."""


def ensure_binary(binary: str, package: str, *, timeout: float = 300.0) -> str:
    """The path of ``binary`` (on ``PATH`` or in ``/usr/bin``), installing Debian's ``package`` if needed."""
    found = _which(binary)
    if found:
        return found
    if os.geteuid() != 0:
        raise ToolUnavailable(f"{binary} is not installed and this process is not root: cannot apt-get install "
                              f"{package} (install it: sudo apt-get install -y --no-install-recommends {package})")
    if shutil.which("apt-get") is None:
        raise ToolUnavailable(f"{binary} is not installed and there is no apt-get to install {package} with")
    deadline = time.monotonic() + timeout
    with open(_APT_LOCK, "w") as lock:
        while True:  # another session may be installing the same package right now
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise ToolInstallError(f"waited {timeout:.0f} s for {_APT_LOCK} to install {package}") from None
                time.sleep(0.5)
        found = _which(binary)
        if found:
            return found
        _apt_install(package, deadline)
    found = _which(binary)
    if not found:
        raise ToolInstallError(f"apt-get installed {package} but {binary} is still not found")
    return found


def _which(binary: str) -> str | None:
    return shutil.which(binary) or (f"/usr/bin/{binary}" if os.access(f"/usr/bin/{binary}", os.X_OK) else None)


def _apt_install(package: str, deadline: float) -> None:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "--no-install-recommends", "-o", "DPkg::Lock::Timeout=120", package]
    own_policy = not _POLICY_RC.exists()
    if own_policy:  # no service may start during the install (exit 101: "action forbidden")
        _POLICY_RC.write_text("#!/bin/sh\nexit 101\n")
        _POLICY_RC.chmod(0o755)
    try:
        result = _run(install, env, deadline)
        if result.returncode != 0:  # the lists may be missing or stale: update them once and retry
            update = _run(["apt-get", "update", "-q", "-o", "DPkg::Lock::Timeout=120"], env, deadline)
            if update.returncode != 0:
                raise ToolInstallError(f"apt-get update failed (installing {package}):\n{update.stdout[-2000:]}")
            result = _run(install, env, deadline)
        if result.returncode != 0:
            raise ToolInstallError(f"apt-get install {package} failed:\n{result.stdout[-2000:]}")
    finally:
        if own_policy:
            _POLICY_RC.unlink(missing_ok=True)


def _run(argv: list[str], env: dict[str, str], deadline: float) -> subprocess.CompletedProcess[str]:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise ToolInstallError(f"no time left to run {' '.join(argv)}")
    try:
        return subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=remaining, check=False)
    except subprocess.TimeoutExpired:
        raise ToolInstallError(f"{' '.join(argv)} did not finish in {remaining:.0f} s") from None
