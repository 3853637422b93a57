"""Sending reports to the ingest (``POST /reports``) with the standard library's ``urllib``.

One request carries a JSON report object, a JSON list of them (a group's step) or a compact binary body, the
device token as ``Authorization: Bearer`` and one ``Idempotency-Key`` (128 random bits). After a dropped
connection, a 5xx or a 409 (the first attempt still in progress at the ingest) the *same bytes* go again with
the *same key*, ``retries`` times with exponential backoff: the ingest counts the report once, and the value is
never randomized a second time. Any other refusal raises :class:`~ldp_device.errors.IngestError` at once.
"""
from __future__ import annotations

import json
import secrets
import time
from typing import Any

from .codec import COMPACT_CONTENT_TYPE
from .errors import IngestError

__all__ = ["post_report", "post_with_retries", "retryable"]


def _log():  # logging is imported when a device first logs (it is not light to import)
    import logging
    return logging.getLogger("ldp_device")


def retryable(exc: IngestError) -> bool:
    """No answer, a 5xx, or 409: the same request may be sent again."""
    return exc.status is None or exc.status >= 500 or exc.status == 409


def post_report(url: str, body: dict[str, Any] | list[dict[str, Any]] | bytes, timeout: float = 10.0, *,
                token: str | None = None, idempotency_key: str | None = None) -> dict[str, Any]:
    """POST report object(s) as JSON, or ``bytes`` as a compact body; :class:`IngestError` unless 2xx."""
    import urllib.error
    import urllib.request

    binary = isinstance(body, (bytes, bytearray))
    data = bytes(body) if binary else json.dumps(body).encode()
    headers = {"Content-Type": COMPACT_CONTENT_TYPE if binary else "application/json", "Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    if idempotency_key:
        headers["Idempotency-Key"] = idempotency_key
    req = urllib.request.Request(url, data=data, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            text = resp.read().decode("utf-8", "replace")
            status = resp.status
    except urllib.error.HTTPError as exc:
        text = exc.read().decode("utf-8", "replace")
        raise IngestError(f"ingest endpoint {url} rejected the report: HTTP {exc.code}: {text[:500]}",
                          exc.code, text) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise IngestError(f"cannot reach ingest endpoint {url}: {reason}") from None
    try:
        return json.loads(text) if text.strip() else {"status": status}
    except ValueError:
        return {"status": status, "body": text}


def post_with_retries(url: str, body: Any, *, token: str | None, timeout: float, retries: int,
                      backoff_seconds: float) -> dict[str, Any]:
    """:func:`post_report` with one idempotency key for every attempt and the retries of the module doc."""
    key = secrets.token_hex(16)
    for attempt in range(retries + 1):
        try:
            return post_report(url, body, timeout=timeout, token=token, idempotency_key=key)
        except IngestError as exc:
            if attempt == retries or not retryable(exc):
                raise
            _log().info("report request failed (%s); sending the same request again (attempt %d of %d)",
                        exc, attempt + 2, retries + 1)
            time.sleep(backoff_seconds * (2 ** attempt))
    raise AssertionError("unreachable")  # pragma: no cover
