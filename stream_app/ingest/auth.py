"""Device credentials without linking: HMAC-signed bearer tokens, and the keyed hashes of the rate limits.

Why not Privacy Pass (RFC 9576-9578)? Its anonymous tokens would let the ingest rate-limit without
learning which device reported. On PyPI, ``privacypass`` (0.2.2, 2024) is a client for Cloudflare's
captcha tokens, ``python-challenge-bypass-ristretto`` (2022) binds Brave's pre-RFC design, and
``voprf`` (0.2.0, 2026) is a young one-author RFC 9497 VOPRF, one building block of RFC 9578's
privately verifiable tokens (the issuer, attester, token challenges and the double-spend store would
all be ours to write). None is a maintained Privacy Pass implementation, so the ingest uses HMAC tokens
(below); the server's view of them is stated in :mod:`stream_app.ingest` (what it can and cannot link).

Token (text: ``"ldp1."`` + unpadded base64url of 62 bytes)::

    version u8 (2) | kind u8 (0 device, 1 relay) | expires u32 (unix seconds, big-endian)
    | id 16 bytes (random 128-bit device or relay id) | scope 8 bytes | tag 32 bytes

``scope`` is the first 8 bytes of SHA-256 of the campaign id the token is for (:func:`campaign_scope`; all
zeros: every campaign, for tokens issued without a campaign): a report of another campaign is refused (403
``wrong_campaign``). Version 1 tokens (54 bytes, no scope) are no longer accepted.
``tag = HMAC-SHA256(k_token, the 30 bytes before it)``, compared in constant time
(:func:`hmac.compare_digest`). A *device* token is one device's credential: its reports are rate-limited
per device. A *relay* token is a trusted server's (a gateway that authenticated and rate-limited its own
devices, or the load generator): it may send large batches and gets no per-report slots.

Keys: the 256-bit server secret (:class:`DeviceSecret`: ``LDP_DEVICE_SECRET``, 64 hex digits, or
``LDP_DEVICE_SECRET_FILE``, a file holding them; never an option, never in a ``repr`` or a log line) is
only used to derive independent keys, ``k_x = HMAC-SHA256(secret, "ldp-stream <x> v1")``: the token
key, the rate key, the idempotency key and the revocation key (a revoked token is named in Redis by
``HMAC-SHA256(k_revocation, id)`` truncated to 128 bits: :meth:`TokenAuthority.revocation_id`). The rate-limit slot of a report is
``HMAC-SHA256(HMAC-SHA256(k_rate, "rate|<campaign>|<t>"), device_id || attribute)`` truncated to 128 bits:
a key per (campaign, step) (rotating every step) applied to the device id and the attribute, so that two
slots (two steps, or two attributes of one step) cannot be linked to each other or to a device without the
secret. The idempotency record of a request is ``HMAC-SHA256(k_idem, id || key)`` truncated to 128 bits.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import secrets
import struct
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Mapping

__all__ = ["ANY_CAMPAIGN", "DEVICE", "RELAY", "SECRET_ENV", "TOKEN_PREFIX", "AuthError", "Credential", "DeviceSecret",
           "ExpiredToken", "ForgedToken", "MalformedToken", "MissingToken", "RevokedToken", "SecretError",
           "TokenAuthority", "campaign_scope"]

TOKEN_PREFIX = "ldp1."
TOKEN_VERSION = 2
DEVICE, RELAY = 0, 1
KINDS = {DEVICE: "device", RELAY: "relay"}
SECRET_ENV = "LDP_DEVICE_SECRET"  # and LDP_DEVICE_SECRET_FILE
ANY_CAMPAIGN = bytes(8)  # the scope of a token valid for every campaign
_HEAD = struct.Struct(">BBI16s8s")  # version, kind, expires, id, scope
_TAG = 32
_TOKEN_BYTES = _HEAD.size + _TAG
_MAX_TOKEN_CHARS = 200
_STEP_KEYS = 4096  # (campaign, t) rate keys kept derived


class SecretError(ValueError):
    """The server secret is missing or not 64 hex digits (the message never shows it)."""


class AuthError(Exception):
    """A request without a valid credential; ``reason`` labels the refusal (HTTP 401)."""

    reason: ClassVar[str] = "unauthenticated"

    def __init__(self, detail: str) -> None:
        super().__init__(f"{self.reason}: {detail}")
        self.detail = detail


class MissingToken(AuthError):
    reason = "missing_token"


class MalformedToken(AuthError):
    reason = "malformed_token"


class ForgedToken(AuthError):
    reason = "forged_token"


class ExpiredToken(AuthError):
    reason = "expired_token"


class RevokedToken(AuthError):
    reason = "revoked_token"


def campaign_scope(campaign: str | None) -> bytes:
    """The 8-byte scope of a token for ``campaign`` (:data:`ANY_CAMPAIGN` for ``None``)."""
    return ANY_CAMPAIGN if campaign is None else hashlib.sha256(campaign.encode()).digest()[:8]


class DeviceSecret:
    """The 256-bit server secret. Its ``repr`` and ``str`` never show it; :meth:`hex` is for ``ldp tokens new-secret``."""

    __slots__ = ("_key",)

    def __init__(self, key: bytes) -> None:
        if len(key) != 32:
            raise SecretError(f"the device-token secret must be 32 bytes (64 hex digits), got {len(key)} bytes")
        self._key = bytes(key)

    @classmethod
    def generate(cls) -> "DeviceSecret":
        """A fresh secret from the OS CSPRNG."""
        return cls(secrets.token_bytes(32))

    @classmethod
    def from_hex(cls, text: str) -> "DeviceSecret":
        try:
            return cls(bytes.fromhex(text.strip()))
        except ValueError:
            raise SecretError(f"{SECRET_ENV} must be 64 hex digits") from None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "DeviceSecret | None":
        """``$LDP_DEVICE_SECRET``, or the file ``$LDP_DEVICE_SECRET_FILE`` (``None`` if neither is set)."""
        env = os.environ if environ is None else environ
        direct, path = env.get(SECRET_ENV, ""), env.get(f"{SECRET_ENV}_FILE", "")
        if direct and path:
            raise SecretError(f"both {SECRET_ENV} and {SECRET_ENV}_FILE are set; set one of them")
        if path:
            try:
                direct = Path(path).read_text(encoding="utf-8")
            except OSError as exc:
                raise SecretError(f"{SECRET_ENV}_FILE={path!r} cannot be read: {exc.strerror or exc}") from None
        return cls.from_hex(direct) if direct.strip() else None

    def hex(self) -> str:
        return self._key.hex()

    def derive(self, label: str) -> bytes:
        """An independent 256-bit key for ``label``."""
        return hmac.digest(self._key, f"ldp-stream {label} v1".encode(), hashlib.sha256)

    def __repr__(self) -> str:
        return "DeviceSecret(***)"

    __str__ = __repr__

    def __reduce__(self) -> tuple:  # never pickled into a log or a child by accident
        raise TypeError("a DeviceSecret is not picklable")


@dataclass(frozen=True)
class Credential:
    """A verified token: its kind (:data:`DEVICE` or :data:`RELAY`), 128-bit id, expiry (unix seconds) and
    campaign scope (:func:`campaign_scope`)."""

    kind: int
    id: bytes
    expires: int
    scope: bytes = ANY_CAMPAIGN

    @property
    def relay(self) -> bool:
        return self.kind == RELAY

    def allows(self, campaign: str) -> bool:
        """Whether the token may report for ``campaign``."""
        return self.scope == ANY_CAMPAIGN or self.scope == campaign_scope(campaign)

    def __repr__(self) -> str:  # the id links a device's requests: keep it out of logs
        return f"Credential({KINDS[self.kind]}, expires={self.expires})"


class TokenAuthority:
    """Issues and verifies tokens and computes the keyed hashes of the rate limits and idempotency records."""

    def __init__(self, secret: DeviceSecret) -> None:
        self._mac_token = _Mac(secret.derive("token"))
        self._mac_rate = _Mac(secret.derive("rate"))
        self._mac_idem = _Mac(secret.derive("idempotency"))
        self._mac_revoke = _Mac(secret.derive("revocation"))
        self._step_macs: OrderedDict[tuple[str, int], _Mac] = OrderedDict()

    # ------------------------------------------------------------------ tokens
    def issue(self, ttl_seconds: float, *, kind: int = DEVICE, campaign: str | None = None, now: float | None = None,
              token_id: bytes | None = None) -> str:
        """A new token valid for ``ttl_seconds`` with a random 128-bit id (``token_id``: tests only), for
        ``campaign`` (``None``: every campaign)."""
        if kind not in KINDS:
            raise ValueError(f"unknown token kind {kind}")
        expires = int((time.time() if now is None else now) + ttl_seconds)
        if not 0 < expires < 2**32:
            raise ValueError(f"token expiry {expires} out of range")
        ident = secrets.token_bytes(16) if token_id is None else token_id
        if len(ident) != 16:
            raise ValueError("a token id has 16 bytes")
        head = _HEAD.pack(TOKEN_VERSION, kind, expires, ident, campaign_scope(campaign))
        raw = head + self._mac_token(head)
        return TOKEN_PREFIX + base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")

    def verify(self, token: str, now: float | None = None) -> Credential:
        """The credential of ``token``; :class:`MalformedToken`, :class:`ForgedToken` or :class:`ExpiredToken`."""
        if len(token) > _MAX_TOKEN_CHARS or not token.startswith(TOKEN_PREFIX):
            raise MalformedToken(f"a token starts with {TOKEN_PREFIX!r}")
        text = token[len(TOKEN_PREFIX):]
        try:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        except (binascii.Error, ValueError):
            raise MalformedToken("a token is base64url") from None
        if len(raw) == 54:
            raise MalformedToken("a version 1 token (without campaign scope) is no longer accepted: issue a new one")
        if len(raw) != _TOKEN_BYTES:
            raise MalformedToken(f"a token holds {_TOKEN_BYTES} bytes, got {len(raw)}")
        head, tag = raw[:_HEAD.size], raw[_HEAD.size:]
        if not hmac.compare_digest(self._mac_token(head), tag):
            raise ForgedToken("the token's signature does not verify")
        version, kind, expires, ident, scope = _HEAD.unpack(head)
        if version != TOKEN_VERSION or kind not in KINDS:  # signed by us: only a future format gets here
            raise MalformedToken(f"token version {version}, kind {kind} not supported")
        if expires <= (time.time() if now is None else now):
            raise ExpiredToken("the token has expired")
        return Credential(kind, ident, expires, scope)

    def verify_header(self, authorization: str | None, now: float | None = None) -> Credential:
        """The credential of an ``Authorization: Bearer <token>`` header (:class:`MissingToken` without one)."""
        if not authorization:
            raise MissingToken("send Authorization: Bearer <device token>")
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise MissingToken("send Authorization: Bearer <device token>")
        return self.verify(token.strip(), now)

    # ------------------------------------------------------------------ keyed hashes
    def _step_mac(self, campaign: str, t: int) -> "_Mac":
        key = (campaign, t)
        mac = self._step_macs.get(key)
        if mac is None:
            mac = _Mac(self._mac_rate(f"rate|{campaign}|{t}".encode()))
            self._step_macs[key] = mac
            if len(self._step_macs) > _STEP_KEYS:
                self._step_macs.popitem(last=False)
        return mac

    def rate_slot(self, campaign: str, t: int, device_id: bytes, attribute: str) -> bytes:
        """The 128-bit rate-limit slot of a device's report of ``attribute`` at step ``t`` (module doc)."""
        return self._step_mac(campaign, t)(device_id + attribute.encode())[:16]

    def request_id(self, credential_id: bytes, idempotency_key: str) -> bytes:
        """The 128-bit name of a request's idempotency record (per credential and key)."""
        return self._mac_idem(credential_id + idempotency_key.encode())[:16]

    def revocation_id(self, credential_id: bytes) -> bytes:
        """The 128-bit name of a token in the revocation list (a keyed hash of its id)."""
        return self._mac_revoke(credential_id)[:16]


class _Mac:
    """HMAC-SHA256 under one key, keyed once: each call copies the keyed state (no key schedule per message)
    and, for messages under 2 KiB, keeps the GIL (``hmac.digest`` releases and retakes it for every message)."""

    __slots__ = ("_keyed",)

    def __init__(self, key: bytes) -> None:
        self._keyed = hmac.new(key, digestmod=hashlib.sha256)

    def __call__(self, message: bytes) -> bytes:
        h = self._keyed.copy()
        h.update(message)
        return h.digest()
