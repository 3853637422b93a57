"""The revoked tokens as one ingest process sees them: a local copy of the store's revocation list.

:class:`RevocationCache` reads the list's version every ``refresh_seconds`` (0.5 s by default) and the list
again when the version changed (:class:`stream_app.store.Revocations`), so a token revoked with ``ldp tokens
revoke`` is refused (401 ``revoked_token``) by every process within ``refresh_seconds`` plus a round trip, and
checking a request costs a set lookup. If Redis cannot be read, the last copy stays in force (logged).
Tokens are named by ``TokenAuthority.revocation_id`` (a keyed hash of the token id, never the id itself).
"""
from __future__ import annotations

import asyncio
import logging
import time

from ..store import RETRYABLE_ERRORS, Revocations

__all__ = ["RevocationCache"]

log = logging.getLogger(__name__)


class RevocationCache:
    """The revocation ids in force, refreshed by :meth:`run` (module doc)."""

    def __init__(self, store: Revocations, refresh_seconds: float = 0.5) -> None:
        if not refresh_seconds > 0:
            raise ValueError(f"refresh_seconds must be > 0, got {refresh_seconds}")
        self.store, self.refresh_seconds = store, refresh_seconds
        self.revoked: frozenset[bytes] = frozenset()
        self._version = -1

    def __contains__(self, revocation_id: bytes) -> bool:
        return revocation_id in self.revoked

    async def refresh(self) -> None:
        """Read the version, and the list if it changed."""
        version = await self.store.revocations_version()
        if version != self._version:
            self.revoked = frozenset(await self.store.revoked_tokens(time.time()))
            self._version = version

    async def run(self) -> None:
        """Refresh every ``refresh_seconds`` until cancelled."""
        failing = False
        while True:
            try:
                await self.refresh()
                failing = False
            except RETRYABLE_ERRORS as exc:
                if not failing:
                    log.warning("the revocation list cannot be read (the last copy stays in force): %s", exc)
                failing = True
            await asyncio.sleep(self.refresh_seconds)
