"""The wire contract: what producers and the stream app must agree on, in one place.

* :mod:`wire.campaign` - the campaign spec and its TOML file, fingerprints, :func:`step_at`;
* :mod:`wire.envelope` - the versioned batch envelope (one Kafka message = one batch);
* :mod:`wire.single_report` - the single-report JSON codec of the SDK and the HTTP ingest;
* :mod:`wire.topics` - topic names and message keys;
* :mod:`wire.errors` - one exception type per rejection reason.

``wire`` imports :mod:`estimators` (the protocols and their payload codecs) and nothing else of
the project.
"""
from __future__ import annotations

from .campaign import Attribute, Campaign, CampaignError, load_campaigns, step_at
from .errors import REASONS, EnvelopeError
from .single_report import SingleReport, decode_single_report, encode_single_report
from .topics import ESTIMATES_TOPIC, REJECTED_TOPIC, REPORTS_TOPIC, Topics, estimate_key, message_key

__all__ = ["Attribute", "Campaign", "CampaignError", "load_campaigns", "step_at", "REASONS", "EnvelopeError",
           "SingleReport", "encode_single_report", "decode_single_report", "REPORTS_TOPIC", "REJECTED_TOPIC",
           "ESTIMATES_TOPIC", "Topics", "message_key", "estimate_key"]
