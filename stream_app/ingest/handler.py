"""One report request, from its headers to its answer: independent of the HTTP server.

:class:`ReportHandler` serves ``POST /reports`` of the ingest service (:mod:`.service`, :mod:`.http`), the one
door for device reports: authentication, body limits, decoding, rate limits, idempotency and publishing.
In order (the first failure answers):

1. credential (``Authorization: Bearer <token>``, :mod:`.auth`): 401 ``missing_token`` /
   ``malformed_token`` / ``forged_token`` / ``expired_token``, or ``revoked_token`` if it is in the revocation
   list (:mod:`.revocation`); none asked in *open* mode (development); then the token's request rate
   (:mod:`.token_rate`): 429 ``token_rate_limited`` past it: every request from here on counts, refused or not;
2. ``Content-Type``: ``application/json`` (the default; :mod:`wire.single_report`: one object or a list)
   or ``application/x-ldp-reports`` (:mod:`wire.compact`); 415 ``unsupported_media_type`` otherwise;
3. ``Idempotency-Key`` (optional): 1-255 visible ASCII characters, else 400 ``bad_idempotency_key``;
4. body size: 413 ``body_too_large`` past ``max_body_bytes``, and for a device token past what its
   ``max_device_reports`` reports can take (:func:`largest_report_bytes`: the campaigns' largest JSON report, with
   room for whitespace), from ``Content-Length`` before a byte of the body is read (or while reading a chunked
   body);
5. report count *before decoding* (:mod:`.precount`: the compact section headers, a lower bound of a JSON
   list): 413 ``too_many_reports`` past the credential's limit (device, relay);
6. decoding, all-or-nothing: 400 with the reason of the first bad report (and ``errors``, one per bad
   JSON object); the report count again (413 ``too_many_reports``), for a JSON list before validating its items;
   Then the poisoning defense of the attributes that have one per report (campaign ``defense``, unary
   protocols: :mod:`stream_app.defense`): 422 ``implausible_report`` with the indices of the reports whose
   number of set bits no honest device produces (at most 1e-6 of honest reports), all-or-nothing; each such
   report counts in ``ldp_rejected_reports_total{reason="implausible"}``;
7. campaign (tokens only): 403 ``wrong_campaign`` for a report of a campaign the token is not for; relay
   tokens: their reports per second (:mod:`.token_rate`), 429 ``relay_rate_limited`` past it; steps: 400
   ``step_out_of_window`` for a ``t`` outside :func:`.limits.step_window`;
8. rate limit (device tokens): one report per device per (campaign, attribute, t), 429 ``rate_limited``
   with the ``conflicts`` (report indices) if another request holds a slot; the idempotency record:
   the first answer again (header ``Idempotent-Replayed: true``), 409 ``request_in_progress``, 422
   ``idempotency_key_reused`` or the in-doubt answer (:class:`.limits.Admission`);
9. publish: 200 ``{"accepted": n}`` once the broker acknowledged the reports; 503 ``unavailable`` (and the
   slots released: the device retries) if it did not; 502 ``partially_published`` with the indices of the
   reports that are in (``published``) if it acknowledged only some of the request's batches (Kafka has no
   atomic write over partitions): their slots stay held, the others are released, and a retry with the same
   key gets this answer again: resend the others in a new request.

Every refusal increments ``ldp_ingest_refused_requests_total{reason}``: nothing of a refused request is counted.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Container, Mapping, NamedTuple

import numpy as np

from estimators.poisoning import implausible
from wire.campaign import Campaign
from wire.compact import CONTENT_TYPE as COMPACT_TYPE
from wire.compact import decode_compact
from wire.errors import EnvelopeError
from wire.envelope import MAX_STEP
from wire.single_report import SingleReport, decode_report_request, decode_single_report, encode_single_report

from ..defense import defenses_of
from ..store import RETRYABLE_ERRORS, LedgerEntry, RateSlot
from .auth import AuthError, Credential, TokenAuthority
from .batcher import PublishError
from .limits import RequestLedger, slot_ttl, step_window
from .metrics import IngestMetrics
from .precount import compact_count, json_count_at_least
from .token_rate import TokenRates

__all__ = ["BodyTooLarge", "HandlerLimits", "JSON_TYPES", "ReadBody", "Reply", "ReportHandler"]

log = logging.getLogger(__name__)

JSON_TYPES = ("application/json", "text/json")
Submit = Callable[[list[SingleReport]], Awaitable[int]]  # queue valid reports, return once the broker has them


class BodyTooLarge(Exception):
    """Raised by a :data:`ReadBody` past its limit."""


ReadBody = Callable[[int], Awaitable[bytes]]  # read the whole body; BodyTooLarge past the limit (bytes)


class Reply(NamedTuple):
    """An answer: status, JSON body, extra headers."""

    status: int
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class HandlerLimits:
    """Limits of the handler (from the ingest's settings)."""

    max_body_bytes: int = 1 << 20
    max_device_reports: int = 256
    max_relay_reports: int = 100_000
    max_open_reports: int = 100_000
    max_late_seconds: float = 3600.0
    max_early_seconds: float = 60.0


def largest_report_bytes(campaigns: Mapping[str, Campaign]) -> int:
    """Bytes of the largest JSON report object (:mod:`wire.single_report`, with its optional ``protocol`` and
    ``fingerprint``, the largest step) of any attribute of ``campaigns``; a compact body's report is smaller."""
    most = 0
    for c in campaigns.values():
        for name, reports in c.sample_reports(256).items():  # 256: a sampling solution sends every attribute
            if not len(reports):
                continue  # not drawn in 256 devices (a solution that rarely samples it): its siblings' size
            p, one = c.attributes[name].protocol, reports[:1]
            obj = {**encode_single_report(c, name, MAX_STEP, one), "protocol": p.name, "fingerprint": p.fingerprint}
            most = max(most, len(json.dumps(obj, separators=(",", ":"))))
    return most


def _doc(status: int, doc: dict[str, Any], headers: tuple[tuple[str, str], ...] = ()) -> Reply:
    return Reply(status, json.dumps(doc, separators=(",", ":")).encode(), headers)


class ReportHandler:
    """``POST /reports`` (module doc). ``authority=None`` is *open* mode (no credential, no rate limit;
    development only)."""

    def __init__(self, campaigns: Mapping[str, Campaign], submit: Submit, metrics: IngestMetrics, *,
                 authority: TokenAuthority | None, ledger: RequestLedger | None,
                 limits: HandlerLimits = HandlerLimits(), revoked: Container[bytes] = frozenset(),
                 request_rates: Mapping[bool, TokenRates] | None = None,
                 relay_reports: TokenRates | None = None) -> None:
        self.campaigns = campaigns
        self.submit = submit
        self.metrics = metrics
        self.authority = authority
        self.ledger = ledger
        self.limits = limits
        self.revoked = revoked  # revocation ids (:meth:`TokenAuthority.revocation_id`)
        self.request_rates = request_rates or {}  # relay? -> requests per token
        self.relay_reports = relay_reports  # reports per relay token
        # what a device token's largest request can weigh: its reports at most, each at most the largest
        # report of the campaigns written with generous whitespace
        self.device_body_bytes = limits.max_device_reports * (2 * largest_report_bytes(campaigns) + 64) + 1024
        # the attributes whose poisoning defense checks each report (stream_app.defense: unary, not "none")
        self.checks = {key: d for key, d in defenses_of(campaigns).items() if d.check is not None}

    async def handle(self, headers: Mapping[str, str], read_body: ReadBody) -> Reply:
        """Answer one request (``headers``: case-insensitive or lower-case names)."""
        start = time.perf_counter()
        reply = await self._handle(headers, read_body)
        self.metrics.requests_total.labels(str(reply.status)).inc()
        self.metrics.request_seconds.observe(time.perf_counter() - start)
        return reply

    def refuse(self, status: int, reason: str, detail: str, headers: tuple[tuple[str, str], ...] = (),
               **extra: Any) -> Reply:
        """A refusal: counted in ``ldp_ingest_refused_requests_total{reason}``."""
        self.metrics.refused_total.labels(reason).inc()
        return _doc(status, {"error": reason, "detail": detail, **extra}, headers)

    async def _handle(self, headers: Mapping[str, str], read_body: ReadBody) -> Reply:
        now = time.time()
        cred: Credential | None = None
        if self.authority is not None:
            try:
                cred = self.authority.verify_header(headers.get("authorization"), now)
            except AuthError as exc:
                return self.refuse(401, exc.reason, exc.detail, (("www-authenticate", 'Bearer realm="ldp-ingest"'),))
            if self.authority.revocation_id(cred.id) in self.revoked:
                return self.refuse(401, "revoked_token", "the token was revoked",
                                   (("www-authenticate", 'Bearer realm="ldp-ingest"'),))
            rates = self.request_rates.get(cred.relay)
            wait = rates.take(cred.id) if rates is not None else 0.0
            if wait > 0:
                return self.refuse(429, "token_rate_limited", f"at most {rates.rate:g} requests per second per "
                                   f"token", (("retry-after", str(max(1, math.ceil(wait)))),))
        ctype = (headers.get("content-type") or JSON_TYPES[0]).split(";", 1)[0].strip().lower()
        if ctype not in JSON_TYPES and ctype != COMPACT_TYPE:
            return self.refuse(415, "unsupported_media_type", f"send {JSON_TYPES[0]} or {COMPACT_TYPE}, not {ctype!r}")
        key = headers.get("idempotency-key")
        if key is not None and not (0 < len(key) <= 255 and key.isascii() and key.isprintable() and " " not in key):
            return self.refuse(400, "bad_idempotency_key", "an Idempotency-Key has 1-255 visible ASCII characters")
        limit = self.limits.max_body_bytes
        if cred is not None and not cred.relay:
            limit = min(limit, self.device_body_bytes)
        length = headers.get("content-length")
        if length is not None and length.strip().isdecimal() and int(length) > limit:  # "²".isdigit(), int("²") fails
            return self.refuse(413, "body_too_large", f"the body has {int(length)} bytes, at most {limit} are accepted")
        try:
            body = await read_body(limit)
        except BodyTooLarge:
            return self.refuse(413, "body_too_large", f"the body has more than {limit} bytes")
        lim = self.limits
        most = lim.max_open_reports if cred is None else lim.max_relay_reports if cred.relay else lim.max_device_reports
        decoded = await self._decode(ctype, body, now, most)
        if isinstance(decoded, Reply):
            return decoded
        if self.checks:
            refused = self._implausible(decoded)
            if refused is not None:
                return refused
        return await self._admit(decoded, cred, key, body, now)

    def _implausible(self, items: list[SingleReport]) -> Reply | None:
        """422 if a report of an attribute with a per-report defense is implausible (module doc, step 6); the
        ``errors`` name each such report by its index in the request (a compact body's reports numbered across
        its sections)."""
        rows: dict[tuple[str, str], list[tuple[int, np.ndarray]]] = {}
        first = 0
        for item in items:
            if (item.campaign.id, item.attribute) in self.checks:
                rows.setdefault((item.campaign.id, item.attribute), []).append((first, item.reports))
            first += len(item.reports)
        bad: list[dict[str, Any]] = []
        detail = ""
        for (cid, attribute), parts in rows.items():
            defense = self.checks[(cid, attribute)]
            flags = implausible(defense.proto, np.concatenate([r for _, r in parts]), defense.alpha)
            if not flags.any():
                continue
            self.metrics.rejected_reports_total.labels(cid, attribute, "implausible").inc(int(flags.sum()))
            index = np.concatenate([np.arange(start, start + len(r)) for start, r in parts])
            detail = (f"the report of {cid}/{attribute} sets a number of bits outside [{defense.check.lo}, "
                      f"{defense.check.hi}], which no honest device does")
            bad += [{"index": int(i), "reason": "implausible_report"} for i in index[flags]]
        if not bad:
            return None
        bad.sort(key=lambda e: e["index"])
        return self.refuse(422, "implausible_report", detail, rejected=len(bad), errors=bad, accepted=0)

    def _too_many(self, n: int, most: int, *, at_least: bool = False) -> Reply:
        return self.refuse(413, "too_many_reports", f"{'at least ' if at_least else ''}{n} reports in one "
                           f"request, at most {most} are accepted")

    async def _decode(self, ctype: str, body: bytes, now: float, most: int) -> list[SingleReport] | Reply:
        """The request's reports, or the 400 answer (all-or-nothing), or 413 if they are more than ``most``
        (told before decoding: :mod:`.precount`)."""
        if ctype == COMPACT_TYPE:
            try:
                n = compact_count(body)
                if n > most:
                    return self._too_many(n, most)
                return decode_compact(body, self.campaigns, now)
            except EnvelopeError as exc:
                return self.refuse(400, exc.reason, exc.detail, rejected=1)
        n = json_count_at_least(body)
        if n > most:
            return self._too_many(n, most, at_least=True)
        try:
            objs = decode_report_request(body)
        except EnvelopeError as exc:
            return self.refuse(400, exc.reason, exc.detail, rejected=1)
        if len(objs) > most:
            return self._too_many(len(objs), most)
        good, bad = [], []
        for i, obj in enumerate(objs):
            try:
                good.append(decode_single_report(obj, self.campaigns, now))
            except EnvelopeError as exc:
                bad.append({"index": i, "reason": exc.reason, "detail": exc.detail})
        if bad:
            return self.refuse(400, bad[0]["reason"], bad[0]["detail"], rejected=len(bad), errors=bad, accepted=0)
        return good

    async def _admit(self, items: list[SingleReport], cred: Credential | None, key: str | None, body: bytes,
                     now: float) -> Reply:
        """Count, window, rate limit and idempotency checks; then publish."""
        n = sum(len(item.reports) for item in items)
        lim = self.limits
        most = lim.max_open_reports if cred is None else lim.max_relay_reports if cred.relay else lim.max_device_reports
        if n > most:
            return self._too_many(n, most)
        if cred is not None:
            for i, item in enumerate(items):
                if not cred.allows(item.campaign.id):
                    return self.refuse(403, "wrong_campaign", f"report {i}: the token is not for campaign "
                                       f"{item.campaign.id!r}")
            if cred.relay and self.relay_reports is not None:
                wait = self.relay_reports.take(cred.id, n)
                if wait > 0:
                    return self.refuse(429, "relay_rate_limited", f"at most {self.relay_reports.rate:g} reports "
                                       f"per second per relay token",
                                       (("retry-after", str(max(1, math.ceil(min(wait, 3600))))),))
        slots: list[tuple[str, int, bytes, int]] = []
        slot_keys: dict[tuple[str, str, int], RateSlot] = {}  # (campaign, attribute, t) -> its rate-limit slot
        if cred is not None:
            seen: set[tuple[str, str, int]] = set()
            for i, (campaign, attr, t, reports) in enumerate(items):
                lo, hi = step_window(campaign, now, lim.max_late_seconds, lim.max_early_seconds)
                if not lo <= t <= hi:
                    return self.refuse(400, "step_out_of_window", f"report {i}: step {t} of {campaign.id}/{attr} is "
                                       f"outside the steps taken now, [{lo}, {hi}]")
                if cred.relay:
                    continue
                if len(reports) != 1 or (campaign.id, attr, t) in seen:
                    return self.refuse(429, "rate_limited", f"report {i}: a device sends one report per (campaign, "
                                       f"attribute, t), {campaign.id}/{attr}/{t} has more", conflicts=[i])
                seen.add((campaign.id, attr, t))
                slot = self.authority.rate_slot(campaign.id, t, cred.id, attr)  # type: ignore[union-attr]
                slots.append((campaign.id, t, slot, slot_ttl(campaign, t, now, lim.max_late_seconds)))
                slot_keys[(campaign.id, attr, t)] = RateSlot(campaign.id, t, slot)
        request = None
        if key is not None:
            request = (self.authority.request_id(cred.id, key) if cred is not None and self.authority is not None
                       else hashlib.sha256(b"open|" + key.encode()).digest()[:16])
        if self.ledger is None or not (slots or request):
            try:
                return await self._publish(items, n)
            except PublishError as exc:
                return self._partial(items, exc)
        body_hash = RequestLedger.body_hash(body)
        try:
            adm = await self.ledger.begin(slots, request, body_hash, now)
        except RETRYABLE_ERRORS as exc:
            log.warning("the rate-limit store is unreachable: %s", exc)
            return self.refuse(503, "unavailable", "the rate-limit store is unreachable; retry later",
                               (("retry-after", "1"),))
        if adm.state == "replay":
            self.metrics.replayed_total.inc()
            status, doc = adm.answer  # type: ignore[misc]
            return Reply(status, doc, (("idempotent-replayed", "true"),))
        if adm.state == "in_progress":
            return self.refuse(409, "request_in_progress", "an earlier request with this Idempotency-Key is still "
                               "being handled; retry later", (("retry-after", "1"),))
        if adm.state == "key_reused":
            return self.refuse(422, "idempotency_key_reused", "this Idempotency-Key was used for another body")
        if adm.state == "rate_limited":
            return self.refuse(429, "rate_limited", "a device sends one report per (campaign, attribute, t): another "
                               "request already sent one", conflicts=adm.conflicts)
        if adm.state == "in_doubt":
            # not "accepted": nobody knows whether the first attempt's reports reached the broker (a client must
            # not read this as counted, nor send them again under another key: they may be counted already)
            reply = _doc(200, {"accepted": 0, "in_doubt": n, "detail": "the process that took the first request "
                               "with this Idempotency-Key stopped before answering: its reports were published at "
                               "most once, possibly not at all, and are not published again"})
        else:
            try:
                reply = await self._publish(items, n)
            except PublishError as exc:  # some batches are in: keep their slots, answer which
                reply = self._partial(items, exc)
                keep: set[LedgerEntry] = {slot_keys[k] for k in exc.published if k in slot_keys}
                if adm.record is not None:
                    keep.add(adm.record)  # the answer below becomes the key's
                await self._settle(self.ledger.abort(adm, keep))
            if reply.status == 503:
                await self._settle(self.ledger.abort(adm))
                return reply
        await self._settle(self.ledger.commit(adm, reply.status, reply.body, body_hash))
        return reply

    async def _publish(self, items: list[SingleReport], n: int) -> Reply:
        """Publish; 200, or 503 if nothing was published; :class:`PublishError` if only some batches were."""
        start = time.perf_counter()
        try:
            await self.submit(items)
        except PublishError as exc:
            if exc.published:
                raise
            return self.refuse(503, "unavailable", f"the reports could not be published: {exc.cause}",
                               (("retry-after", "1"),))
        except Exception as exc:  # noqa: BLE001 - Kafka unavailable or shutting down
            return self.refuse(503, "unavailable", f"the reports could not be published: {exc}", (("retry-after", "1"),))
        self.metrics.publish_seconds.observe(time.perf_counter() - start)
        if self.metrics.reports_total is not None:
            for item in items:
                self.metrics.reports_total.labels(item.campaign.id, item.attribute).inc(len(item.reports))
        return Reply(200, b'{"accepted":%d}' % n)

    def _partial(self, items: list[SingleReport], exc: PublishError) -> Reply:
        published = [i for i, it in enumerate(items) if (it.campaign.id, it.attribute, it.t) in exc.published]
        return self.refuse(502, "partially_published", f"the broker acknowledged only some of the request's batches "
                           f"({exc.cause}): the reports listed in 'published' are in, resend the others",
                           published=published, accepted=sum(len(items[i].reports) for i in published))

    @staticmethod
    async def _settle(op: Awaitable[None]) -> None:
        """Record an answer or release slots; the answer stands if Redis fails now (a retry then finds the
        pending record: in progress, then in doubt, never published twice)."""
        try:
            await op
        except RETRYABLE_ERRORS as exc:
            log.warning("could not settle an idempotency record or rate-limit slots: %s", exc)
