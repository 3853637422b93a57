"""The ingest's revocation list: revoked tokens, named by a keyed hash of their id, until they expire.

``ldp tokens revoke`` adds an entry (:meth:`Revocations.revoke_token`) and increments the list's version;
every ingest process reads the version every fraction of a second and, when it changed, the entries not yet
expired (:meth:`Revocations.revoked_tokens`), so a check costs no round trip per request
(:mod:`stream_app.ingest.revocation`). Keys: :func:`.keys.revoked_tokens_key`, :func:`.keys.revoked_version_key`.
"""
from __future__ import annotations

import time

from .connection import StoreConnection
from .keys import revoked_tokens_key, revoked_version_key

__all__ = ["Revocations"]


class Revocations(StoreConnection):
    """The revocation list of the ingest's tokens (module doc)."""

    async def revoke_token(self, revocation_id: bytes, until: float) -> None:
        """Revoke the token named ``revocation_id`` until ``until`` (unix seconds: its expiry); drop entries
        already expired."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.zadd(revoked_tokens_key(), {revocation_id: float(until)})
        pipe.zremrangebyscore(revoked_tokens_key(), "-inf", time.time())
        pipe.incr(revoked_version_key())
        await pipe.execute()

    async def revocations_version(self) -> int:
        """The list's version (0 before the first revocation)."""
        return int(await self.redis.get(revoked_version_key()) or 0)

    async def revoked_tokens(self, now: float) -> set[bytes]:
        """The revocation ids of the tokens revoked and not expired at ``now``."""
        return {bytes(m) for m in await self.redis.zrangebyscore(revoked_tokens_key(), now, "+inf")}
