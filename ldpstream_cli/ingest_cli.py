"""``ldp ingest`` (the HTTP ingest service) and ``ldp tokens`` (device tokens and the server secret)."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from stream_app.ingest.settings import ingest_setting_specs

from .common import fail, stack_addresses

__all__ = ["register"]

tokens_app = typer.Typer(help="Device tokens of the ingest (HMAC-signed; the secret: LDP_DEVICE_SECRET or "
                              "LDP_DEVICE_SECRET_FILE).", no_args_is_help=True)


def _option(name: str, **kwargs: Any) -> Any:
    """The `ldp ingest` option of ingest setting ``name`` (flags, help and variable from its spec)."""
    spec = ingest_setting_specs()[name]
    default = "" if spec["default"] in (None, "") else f" Default: {spec['default']}."
    return typer.Option(*spec["option"], help=f"{spec['help']}{default} Environment: {spec['env']}.",
                        show_default=False, **kwargs)


def ingest(campaign_paths: Annotated[Optional[list[Path]], _option("campaign_paths", exists=True, dir_okay=False)] = None,
           kafka_bootstrap: Annotated[Optional[str], _option("kafka_bootstrap")] = None,
           redis_url: Annotated[Optional[str], _option("redis_url")] = None,
           topic_prefix: Annotated[Optional[str], _option("topic_prefix")] = None,
           host: Annotated[Optional[str], _option("host")] = None,
           port: Annotated[Optional[int], _option("port")] = None,
           processes: Annotated[Optional[int], _option("processes")] = None,
           linger_seconds: Annotated[Optional[float], _option("linger_seconds")] = None,
           max_batch_reports: Annotated[Optional[int], _option("max_batch_reports")] = None,
           max_body_bytes: Annotated[Optional[int], _option("max_body_bytes")] = None,
           max_device_reports: Annotated[Optional[int], _option("max_device_reports")] = None,
           max_relay_reports: Annotated[Optional[int], _option("max_relay_reports")] = None,
           max_late_seconds: Annotated[Optional[float], _option("max_late_seconds")] = None,
           max_early_seconds: Annotated[Optional[float], _option("max_early_seconds")] = None,
           idempotency_seconds: Annotated[Optional[int], _option("idempotency_seconds")] = None,
           publish_timeout: Annotated[Optional[float], _option("publish_timeout")] = None,
           shutdown_timeout: Annotated[Optional[float], _option("shutdown_timeout")] = None,
           request_timeout: Annotated[Optional[float], _option("request_timeout")] = None,
           keepalive_seconds: Annotated[Optional[float], _option("keepalive_seconds")] = None,
           max_connections: Annotated[Optional[int], _option("max_connections")] = None,
           max_connections_per_ip: Annotated[Optional[int], _option("max_connections_per_ip")] = None,
           first_byte_timeout: Annotated[Optional[float], _option("first_byte_timeout")] = None,
           device_requests_per_second: Annotated[Optional[float], _option("device_requests_per_second")] = None,
           relay_requests_per_second: Annotated[Optional[float], _option("relay_requests_per_second")] = None,
           relay_reports_per_second: Annotated[Optional[float], _option("relay_reports_per_second")] = None,
           revocation_refresh_seconds: Annotated[Optional[float], _option("revocation_refresh_seconds")] = None,
           open_mode: Annotated[Optional[bool], _option("open_mode")] = None,
           loglevel: Annotated[Optional[str], _option("loglevel")] = None) -> None:
    """Run the HTTP ingest: POST /reports (device tokens, rate limits, idempotency keys) -> ldp.reports.

    Several processes share the port (--processes); each option falls back to its environment variable,
    then to its default; --kafka and --redis, given by neither, to the addresses of `ldp stack up`."""
    given = {k: v for k, v in locals().items()}  # named after the IngestSettings fields
    from stream_app.ingest.auth import SecretError
    from stream_app.ingest.service import serve
    from stream_app.ingest.settings import IngestSettings
    from stream_app.settings import SettingsError
    from wire.campaign import CampaignError

    try:
        if not (given["kafka_bootstrap"] or _env("kafka_bootstrap")) or not (given["redis_url"] or _env("redis_url")):
            given["kafka_bootstrap"], given["redis_url"] = stack_addresses(
                given["kafka_bootstrap"] or _env("kafka_bootstrap"), given["redis_url"] or _env("redis_url"))
        settings = IngestSettings.from_env(**given)
        status = serve(settings)
    except (SettingsError, SecretError, CampaignError) as exc:
        fail(exc)
    raise typer.Exit(status)


def _env(name: str) -> str | None:
    import os

    return os.environ.get(ingest_setting_specs()[name]["env"]) or None


def _authority() -> Any:
    """The token authority of the server secret in the environment (the command fails without one)."""
    from stream_app.ingest.auth import DeviceSecret, SecretError, TokenAuthority

    try:
        secret = DeviceSecret.from_env()
    except SecretError as exc:
        fail(exc)
    if secret is None:
        fail(ValueError("no server secret: set LDP_DEVICE_SECRET or LDP_DEVICE_SECRET_FILE "
                         "(`ldp tokens new-secret` makes one)"))
    return TokenAuthority(secret)  # type: ignore[arg-type]


@tokens_app.command("issue")
def tokens_issue(count: Annotated[int, typer.Option("--count", "-n", help="Tokens to print, one per line.")] = 1,
                 days: Annotated[Optional[float], typer.Option(help="Validity (days). Default: 365 for device "
                                                                    "tokens, 1 for relay tokens.")] = None,
                 campaign: Annotated[Optional[str], typer.Option(help="The campaign id the tokens are for (a "
                                                                      "report of another is refused, 403); "
                                                                      "required unless --any-campaign.")] = None,
                 any_campaign: Annotated[bool, typer.Option(help="Tokens valid for every campaign (a relay or "
                                                                 "load generator serving several; never a "
                                                                 "device's).")] = False,
                 relay: Annotated[bool, typer.Option(help="Relay tokens (a trusted gateway or load generator: "
                                                          "large batches, no per-device rate limit).")] = False) -> None:
    """Print new device tokens (each with a random 128-bit device id), signed with the server secret."""
    from stream_app.ingest.auth import DEVICE, RELAY

    authority = _authority()
    days = (1.0 if relay else 365.0) if days is None else days
    if count < 1 or not days > 0:
        fail(ValueError("--count must be >= 1 and --days > 0"))
    if (campaign is None) == (not any_campaign):
        fail(ValueError("give the campaign the tokens are for (--campaign ID), or --any-campaign for tokens "
                        "valid for every campaign"))
    kind = RELAY if relay else DEVICE
    print("\n".join(authority.issue(days * 86400.0, kind=kind, campaign=campaign) for _ in range(count)))


@tokens_app.command("revoke")
def tokens_revoke(tokens: Annotated[list[str], typer.Argument(help="Tokens (ldp1....) or token ids (32 hex "
                                                                   "digits, `ldp tokens id`) to revoke.")],
                  redis_url: Annotated[Optional[str], typer.Option("--redis", help="Redis URL of the ingest. "
                                                                   "Environment: LDP_REDIS_URL; default: the "
                                                                   "local stack's.")] = None,
                  days: Annotated[float, typer.Option(help="For a token id: how long (days) to keep it revoked "
                                                           "(a token: until it expires).")] = 366.0) -> None:
    """Revoke tokens: every ingest process refuses them (401 revoked_token) within --revocation-refresh."""
    import asyncio
    import os
    import time

    from stream_app.ingest.auth import AuthError
    from stream_app.store import CountStore

    authority = _authority()
    entries = []
    for text in tokens:
        if text.startswith("ldp1."):
            try:
                cred = authority.verify(text, now=0.0)  # an expired token is still named (nothing to refuse)
            except AuthError as exc:
                fail(ValueError(f"not a token of this secret: {exc.detail}"))
            entries.append((cred.id, float(cred.expires)))
        else:
            try:
                ident = bytes.fromhex(text)
            except ValueError:
                ident = b""
            if len(ident) != 16:
                fail(ValueError(f"{text!r} is neither a token nor a token id (32 hex digits)"))
            entries.append((ident, time.time() + days * 86400.0))
    url = redis_url or os.environ.get("LDP_REDIS_URL") or stack_addresses("unused", None)[1]

    async def revoke() -> None:
        store = CountStore.from_url(url)
        try:
            for ident, until in entries:
                await store.revoke_token(authority.revocation_id(ident), until)
        finally:
            await store.close()

    asyncio.run(revoke())
    print(f"revoked {len(entries)} token(s)")


@tokens_app.command("id")
def tokens_id(token: Annotated[str, typer.Argument(help="A token (ldp1....).")]) -> None:
    """Print a token's id (32 hex digits), its kind and expiry: what `ldp tokens revoke` takes, to keep on
    record instead of the token itself."""
    import datetime

    from stream_app.ingest.auth import KINDS, AuthError

    try:
        cred = _authority().verify(token, now=0.0)
    except AuthError as exc:
        fail(ValueError(f"not a token of this secret: {exc.detail}"))
    when = datetime.datetime.fromtimestamp(cred.expires, datetime.timezone.utc).isoformat()
    print(f"{cred.id.hex()} {KINDS[cred.kind]} expires {when}")


@tokens_app.command("new-secret")
def tokens_new_secret() -> None:
    """Print a new 256-bit server secret (64 hex digits) for LDP_DEVICE_SECRET; keep it out of shell history
    and logs: `ldp tokens new-secret > secret && chmod 600 secret`, then LDP_DEVICE_SECRET_FILE=secret."""
    from stream_app.ingest.auth import DeviceSecret

    print(DeviceSecret.generate().hex())


def register(app: typer.Typer) -> None:
    """Add ``ldp ingest`` and ``ldp tokens`` to the ``ldp`` command."""
    app.command("ingest")(ingest)
    app.add_typer(tokens_app, name="tokens")
