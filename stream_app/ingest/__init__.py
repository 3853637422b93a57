"""The HTTP ingest of single device reports, ``ldp ingest`` (:mod:`.service`): the one door for device reports.

It imports the wire contract and the count store, never the worker (``tests/test_layering.py`` checks it).

Modules: :mod:`.handler` (one request, independent of the HTTP server), :mod:`.auth` (device tokens and
keyed hashes), :mod:`.limits` (rate limits and idempotency in Redis, through :class:`stream_app.store.CountStore`),
:mod:`.batcher` (reports -> batch envelopes -> Kafka), :mod:`.metrics`, :mod:`.settings`, :mod:`.service`
(the ingest of one process and ``serve``), :mod:`.asgi` (it as an ASGI application), :mod:`.server` (uvicorn's
httptools protocol with the connection guards uvicorn lacks).

What the server can and cannot link
-----------------------------------
A device token (:mod:`.auth`) carries a random 128-bit device id, so the ingest process *sees* which
device sends a request while it handles it. It keeps none of it:

* Kafka gets batch envelopes of many devices' reports (per campaign, attribute and step) under random
  batch ids; no device id, no token, no address. The worker's Redis counts are sums.
* Redis gets, per report, a rate-limit slot ``HMAC(HMAC(k_rate, "rate|campaign|t"), device_id ||
  attribute)`` truncated to 128 bits, which expires with its step's window, and, per request with an
  ``Idempotency-Key``, a record named ``HMAC(k_idem, device_id || key)`` holding the answer. Without the
  server secret, two slots (two steps of one device, or two attributes of one step) cannot be linked to
  each other or to a device, and the records cannot be linked to the slots. Whoever holds the secret *and*
  a device's token can recompute that device's slots (confirm that it reported a step), not read a value.
* No log line holds a token, a device id or a slot (a :class:`~.auth.Credential`'s ``repr`` hides its id).

What it can link: the reports of one request (a device's attributes of one step, sent together) arrive
together, and an operator who changed the code could log device ids per request (the token is a stable
bearer credential, not an anonymous one; Privacy Pass tokens would remove this, :mod:`.auth` says why they
are not used yet). Timing and client addresses are visible to the HTTP layer as with any service. None of
this weakens the reports' local differential privacy: each report is randomized on the device, and the
longitudinal guarantees of the protocols already assume the server knows which reports are one device's.

Idempotency and crashes
-----------------------
A request with ``Idempotency-Key: <key>`` (a client makes one per request and sends it again when it retries
that request: ``producers.sdk.post_report(..., idempotency_key=)``) claims
its record and its rate-limit slots in one Redis round trip before publishing, then stores its answer:

* a retry after the answer was stored (a lost response, a client timeout) gets the first answer again,
  nothing is published again;
* a retry while the first attempt still runs gets 409 (retry later);
* the first attempt failed to publish (broker unreachable: 503): its slots and record were released, the
  retry publishes;
* the first attempt's *process died* (SIGKILL, host loss) after claiming and before storing its answer:
  its reports were published or not, nobody knows, and the slots say "sent". A retry within the lease
  (publish timeout + 5 s) gets 409, after it 200 ``{"accepted": 0, "in_doubt": n}`` (``n`` reports whose fate
  is unknown: not accepted by this answer, and not to be sent again): nothing is published again, so the
  reports are counted at most once (possibly lost, never twice). A retry without
  the key is refused by its slots (429);
* Redis lost its data (restart without persistence): slots and records are gone, a retry publishes again
  (a report may count twice); the same holds for a produce request that reached the broker but whose
  acknowledgement was lost (aiokafka reports an error, the slots are released).

A graceful stop (SIGTERM) answers every request in flight before the process exits, so the in-doubt case
needs a crash.
"""
