"""The estimates contract: the schema version of every document on ``ldp.estimates`` and of every answer of a
worker's HTTP API, the Kafka headers of an estimate, and the JSON Schemas that define them (``docs/estimates.md``).

The schemas are package data (``wire/schemas/*.schema.json``, JSON Schema 2020-12), one file per document kind
and major version:

* ``estimate.v1``: a message of ``ldp.estimates`` and the answer of ``GET /estimates/{campaign}/{attribute}``;
* ``api-history.v1``, ``api-campaigns.v1``, ``api-status.v1``, ``api-health.v1``, ``api-error.v1``: the other
  JSON answers of the API (``/estimates/{c}/{a}/history``, ``/campaigns``, ``/status``, ``/health``, any 4xx).

Compatibility: within one ``schema_version`` fields are only added, never removed, renamed, retyped or given
another meaning; a consumer ignores the fields it does not know. Anything else is a new version and new files.

The runtime only stamps the version and the headers; validating is for consumers and tests (with any JSON Schema
2020-12 validator: ``ldpstream_dev.contract.validator`` uses ``jsonschema``, resolving the ``$ref`` between the
files by their ``$id``).
"""
from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

__all__ = ["CONTENT_TYPE", "HEADER_ATTRIBUTE", "HEADER_CAMPAIGN", "HEADER_CONTENT_TYPE", "HEADER_SCHEMA_VERSION",
           "SCHEMAS", "SCHEMA_VERSION", "STATUS_INSUFFICIENT", "STATUS_OK", "estimate_headers", "load_schema"]

#: The major version of every document of the contract: ``schema_version`` in each, ``.v1`` in the file names.
SCHEMA_VERSION = 1

#: ``status`` of an estimate with frequencies, and of one over fewer reports than the campaign's ``min_n``.
STATUS_OK = "ok"
STATUS_INSUFFICIENT = "insufficient"

#: The Kafka headers of every message on ``ldp.estimates`` (values UTF-8).
HEADER_CONTENT_TYPE = "content-type"
HEADER_SCHEMA_VERSION = "ldp-schema-version"
HEADER_CAMPAIGN = "ldp-campaign"
HEADER_ATTRIBUTE = "ldp-attribute"
CONTENT_TYPE = "application/json"

#: The schema names (``wire/schemas/{name}.schema.json``).
SCHEMAS = ("estimate.v1", "api-history.v1", "api-campaigns.v1", "api-status.v1", "api-health.v1", "api-error.v1",
           "api-query.v1")


def estimate_headers(doc: dict[str, Any]) -> list[tuple[str, bytes]]:
    """The Kafka headers of an estimate document: content type, schema version, campaign, attribute."""
    return [(HEADER_CONTENT_TYPE, CONTENT_TYPE.encode()),
            (HEADER_SCHEMA_VERSION, str(doc.get("schema_version", SCHEMA_VERSION)).encode()),
            (HEADER_CAMPAIGN, str(doc["campaign"]).encode()), (HEADER_ATTRIBUTE, str(doc["attribute"]).encode())]


@cache
def _schema_text(name: str) -> str:
    if name not in SCHEMAS:
        raise KeyError(f"no schema {name!r}; the schemas: {', '.join(SCHEMAS)}")
    return (resources.files("wire") / "schemas" / f"{name}.schema.json").read_text(encoding="utf-8")


def load_schema(name: str) -> dict[str, Any]:
    """The JSON Schema ``name`` (one of :data:`SCHEMAS`) as a fresh dict."""
    return json.loads(_schema_text(name))
