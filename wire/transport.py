"""Transport security of every client of the pipeline: Kafka (SASL, TLS) and Redis (AUTH/ACL, TLS).

One implementation, read from environment variables, used by every Kafka and Redis client of the
project: the worker (Faust and its own aiokafka clients), the fleet publisher, the ingest service,
the dev tooling and the tests. Secrets are never command-line options (they would show in ``ps``)
and never part of a ``repr``, a log line or ``/status``: :meth:`KafkaSecurity.describe`,
:meth:`RedisSecurity.describe` and :func:`redact_url` are what may be shown.

Kafka (:class:`KafkaSecurity`):

- ``LDP_KAFKA_SECURITY_PROTOCOL``: ``PLAINTEXT`` (default), ``SSL``, ``SASL_PLAINTEXT``, ``SASL_SSL``;
- ``LDP_KAFKA_SASL_MECHANISM``: ``SCRAM-SHA-512`` (default with SASL), ``SCRAM-SHA-256``, ``PLAIN``;
- ``LDP_KAFKA_USERNAME``; ``LDP_KAFKA_PASSWORD`` or ``LDP_KAFKA_PASSWORD_FILE`` (a file holding it,
  e.g. a Docker secret; one trailing newline is dropped);
- ``LDP_KAFKA_CAFILE`` (PEM CA bundle that signed the broker's certificate; default: the system's),
  ``LDP_KAFKA_CERTFILE`` + ``LDP_KAFKA_KEYFILE`` (client certificate, mutual TLS),
  ``LDP_KAFKA_SSL_CHECK_HOSTNAME`` (``true`` by default).

Redis (:class:`RedisSecurity`; a ``redis://user:password@host`` / ``rediss://`` URL may carry the same):

- ``LDP_REDIS_USERNAME`` (an ACL user; default: ``default``); ``LDP_REDIS_PASSWORD`` or
  ``LDP_REDIS_PASSWORD_FILE``: used when the URL carries no password;
- ``LDP_REDIS_CAFILE``, ``LDP_REDIS_CERTFILE`` + ``LDP_REDIS_KEYFILE``: TLS files of a ``rediss://``
  (or ``rediss+cluster://``) URL.

A variable set to the empty string counts as unset; a name and its ``_FILE`` twin both set is an error.
Nothing here imports a client library: the Kafka options are aiokafka's keyword arguments
(:meth:`KafkaSecurity.aiokafka_kwargs`) or Faust's ``broker_credentials``
(:meth:`KafkaSecurity.faust_credentials`), the Redis ones redis-py's (:meth:`RedisSecurity.client_kwargs`).
"""
from __future__ import annotations

import os
import re
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import unquote

__all__ = ["KAFKA_ENV", "REDIS_ENV", "SASL_MECHANISMS", "SECURITY_PROTOCOLS", "KafkaSecurity", "RedisSecurity",
           "TransportConfigError", "kafka_client_options", "redact_url", "url_password"]

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN")
DEFAULT_SASL_MECHANISM = "SCRAM-SHA-512"

#: field of :class:`KafkaSecurity` -> its environment variable (``password`` also has ``..._FILE``).
KAFKA_ENV = {
    "security_protocol": "LDP_KAFKA_SECURITY_PROTOCOL", "sasl_mechanism": "LDP_KAFKA_SASL_MECHANISM",
    "username": "LDP_KAFKA_USERNAME", "password": "LDP_KAFKA_PASSWORD", "cafile": "LDP_KAFKA_CAFILE",
    "certfile": "LDP_KAFKA_CERTFILE", "keyfile": "LDP_KAFKA_KEYFILE", "check_hostname": "LDP_KAFKA_SSL_CHECK_HOSTNAME",
}
#: field of :class:`RedisSecurity` -> its environment variable (``password`` also has ``..._FILE``).
REDIS_ENV = {
    "username": "LDP_REDIS_USERNAME", "password": "LDP_REDIS_PASSWORD", "cafile": "LDP_REDIS_CAFILE",
    "certfile": "LDP_REDIS_CERTFILE", "keyfile": "LDP_REDIS_KEYFILE",
}
_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}
_SECRET_MASK = "***"


class TransportConfigError(ValueError):
    """A Kafka or Redis security setting is invalid (the message names the variable, never a secret)."""


def _get(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name, "")
    return value if value != "" else None


def _secret(env: Mapping[str, str], name: str) -> str | None:
    """``$name``, or the content of the file ``$name_FILE`` (one trailing newline dropped)."""
    direct, path = _get(env, name), _get(env, f"{name}_FILE")
    if direct is not None and path is not None:
        raise TransportConfigError(f"both {name} and {name}_FILE are set; set one of them")
    if path is None:
        return direct
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise TransportConfigError(f"{name}_FILE={path!r} cannot be read: {exc.strerror or exc}") from None
    return text[:-1] if text.endswith("\n") else text


def _check_files(owner: str, env_names: Mapping[str, str], **paths: str | None) -> None:
    for name, path in paths.items():
        if path is not None and not Path(path).is_file():
            raise TransportConfigError(f"{env_names[name]}={path!r} is not a readable file ({owner})")
    if (paths.get("certfile") is None) != (paths.get("keyfile") is None):
        raise TransportConfigError(f"{env_names['certfile']} and {env_names['keyfile']} go together ({owner})")


@dataclass(frozen=True)
class KafkaSecurity:
    """How a Kafka client authenticates and encrypts (the module doc lists the variables)."""

    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    cafile: str | None = None
    certfile: str | None = None
    keyfile: str | None = None
    check_hostname: bool = True

    def __post_init__(self) -> None:
        protocol = (self.security_protocol or "PLAINTEXT").upper()
        object.__setattr__(self, "security_protocol", protocol)
        if protocol not in SECURITY_PROTOCOLS:
            raise TransportConfigError(f"{KAFKA_ENV['security_protocol']}={self.security_protocol!r}: "
                                       f"choose one of {', '.join(SECURITY_PROTOCOLS)}")
        if self.sasl:
            mechanism = (self.sasl_mechanism or DEFAULT_SASL_MECHANISM).upper()
            object.__setattr__(self, "sasl_mechanism", mechanism)
            if mechanism not in SASL_MECHANISMS:
                raise TransportConfigError(f"{KAFKA_ENV['sasl_mechanism']}={self.sasl_mechanism!r}: "
                                           f"choose one of {', '.join(SASL_MECHANISMS)}")
            if not self.username or self.password is None:
                raise TransportConfigError(
                    f"{protocol} needs {KAFKA_ENV['username']} and {KAFKA_ENV['password']} (or "
                    f"{KAFKA_ENV['password']}_FILE)")
        elif self.sasl_mechanism or self.username or self.password is not None:
            raise TransportConfigError(
                f"a SASL mechanism, user name or password is set but {KAFKA_ENV['security_protocol']} is {protocol}: "
                "use SASL_PLAINTEXT or SASL_SSL (nothing would be sent otherwise)")
        if not self.tls and (self.cafile or self.certfile or self.keyfile):
            raise TransportConfigError(f"TLS files are set but {KAFKA_ENV['security_protocol']} is {protocol}: "
                                       "use SSL or SASL_SSL")
        _check_files("Kafka", KAFKA_ENV, cafile=self.cafile, certfile=self.certfile, keyfile=self.keyfile)

    @property
    def sasl(self) -> bool:
        return self.security_protocol.startswith("SASL_")

    @property
    def tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "KafkaSecurity":
        """The settings of ``environ`` (default ``os.environ``); all unset = ``PLAINTEXT``."""
        env = os.environ if environ is None else environ
        check = _get(env, KAFKA_ENV["check_hostname"])
        if check is not None and check.lower() not in _TRUE | _FALSE:
            raise TransportConfigError(f"{KAFKA_ENV['check_hostname']}={check!r}: use true or false")
        return cls(security_protocol=_get(env, KAFKA_ENV["security_protocol"]) or "PLAINTEXT",
                   sasl_mechanism=_get(env, KAFKA_ENV["sasl_mechanism"]), username=_get(env, KAFKA_ENV["username"]),
                   password=_secret(env, KAFKA_ENV["password"]), cafile=_get(env, KAFKA_ENV["cafile"]),
                   certfile=_get(env, KAFKA_ENV["certfile"]), keyfile=_get(env, KAFKA_ENV["keyfile"]),
                   check_hostname=check is None or check.lower() in _TRUE)

    def to_env(self) -> dict[str, str]:
        """The variables :meth:`from_env` reads back (the password included: for a child's environment only)."""
        out = {KAFKA_ENV["security_protocol"]: self.security_protocol}
        for name in ("sasl_mechanism", "username", "password", "cafile", "certfile", "keyfile"):
            value = getattr(self, name)
            if value is not None:
                out[KAFKA_ENV[name]] = str(value)
        if not self.check_hostname:
            out[KAFKA_ENV["check_hostname"]] = "false"
        return out

    def ssl_context(self) -> ssl.SSLContext | None:
        """The client's TLS context (``None`` without TLS): the CA file or the system's, the client pair if set."""
        if not self.tls:
            return None
        ctx = ssl.create_default_context(cafile=self.cafile)
        ctx.check_hostname = self.check_hostname
        if self.certfile:
            ctx.load_cert_chain(self.certfile, self.keyfile)
        return ctx

    def aiokafka_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of every aiokafka client (producer, consumer, admin); ``{}`` for ``PLAINTEXT``."""
        if self.security_protocol == "PLAINTEXT":
            return {}
        out: dict[str, Any] = {"security_protocol": self.security_protocol}
        if self.tls:
            out["ssl_context"] = self.ssl_context()
        if self.sasl:
            out.update(sasl_mechanism=self.sasl_mechanism, sasl_plain_username=self.username,
                       sasl_plain_password=self.password)
        return out

    def faust_credentials(self) -> Any:
        """Faust's ``broker_credentials`` (``None`` for ``PLAINTEXT``): ``SASLCredentials`` or ``SSLCredentials``."""
        if self.security_protocol == "PLAINTEXT":
            return None
        import faust

        if self.sasl:
            return faust.SASLCredentials(username=self.username, password=self.password,
                                         mechanism=self.sasl_mechanism, ssl_context=self.ssl_context())
        return faust.SSLCredentials(self.ssl_context())

    def describe(self) -> str:
        """What may be logged: protocol, mechanism, user and files, never the password."""
        parts = [self.security_protocol]
        if self.sasl:
            parts.append(f"{self.sasl_mechanism} as {self.username!r}")
        if self.tls:
            parts.append(f"CA {self.cafile or '(system)'}" + (f", client certificate {self.certfile}"
                                                              if self.certfile else ""))
        return " ".join(parts)


def kafka_client_options(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``KafkaSecurity.from_env(environ).aiokafka_kwargs()``: what every aiokafka client of the project adds."""
    return KafkaSecurity.from_env(environ).aiokafka_kwargs()


@dataclass(frozen=True)
class RedisSecurity:
    """Credentials and TLS files of a Redis client (the module doc lists the variables)."""

    username: str | None = None
    password: str | None = field(default=None, repr=False)
    cafile: str | None = None
    certfile: str | None = None
    keyfile: str | None = None

    def __post_init__(self) -> None:
        if self.username and self.password is None:
            raise TransportConfigError(f"{REDIS_ENV['username']} is set without {REDIS_ENV['password']} "
                                       f"(or {REDIS_ENV['password']}_FILE)")
        _check_files("Redis", REDIS_ENV, cafile=self.cafile, certfile=self.certfile, keyfile=self.keyfile)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "RedisSecurity":
        env = os.environ if environ is None else environ
        return cls(username=_get(env, REDIS_ENV["username"]), password=_secret(env, REDIS_ENV["password"]),
                   cafile=_get(env, REDIS_ENV["cafile"]), certfile=_get(env, REDIS_ENV["certfile"]),
                   keyfile=_get(env, REDIS_ENV["keyfile"]))

    def to_env(self) -> dict[str, str]:
        """The variables :meth:`from_env` reads back (the password included: for a child's environment only)."""
        return {REDIS_ENV[name]: str(getattr(self, name)) for name in REDIS_ENV if getattr(self, name) is not None}

    def client_kwargs(self, url: str) -> dict[str, Any]:
        """redis-py keyword arguments for a client of ``url``: the password (and ACL user) unless the URL carries
        one, the TLS files of a ``rediss`` URL (TLS files with a plain ``redis`` URL are an error: they would be
        ignored)."""
        out: dict[str, Any] = {}
        if self.password is not None and url_password(url) is None:
            out["password"] = self.password
            if self.username:
                out["username"] = self.username
        tls = url.split("://", 1)[0].lower().startswith("rediss")
        if (self.cafile or self.certfile) and not tls:
            raise TransportConfigError(f"{REDIS_ENV['cafile']}/{REDIS_ENV['certfile']} are set but the Redis URL "
                                       f"{redact_url(url)} is not rediss:// (TLS)")
        if tls:
            if self.cafile:
                out["ssl_ca_certs"] = self.cafile
            if self.certfile:
                out.update(ssl_certfile=self.certfile, ssl_keyfile=self.keyfile)
        return out

    def describe(self) -> str:
        """What may be logged: the user and whether a password is set, never the password."""
        who = f"user {self.username!r}" if self.username else "default user"
        return f"{who}, password {'set' if self.password is not None else 'not set'}" + (
            f", CA {self.cafile}" if self.cafile else "")


# ---------------------------------------------------------------------------------------------- URLs
_QUERY_SECRET = re.compile(r"(?i)([?&](?:password|pass|pwd|secret|token)=)[^&#]*")


def _split_userinfo(url: str) -> tuple[str, str | None, str]:
    """``(scheme://, user info or None, rest)`` of ``url``; the user info ends at the authority's last ``@``."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return "", None, url
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    userinfo, at, _ = rest[:end].rpartition("@")
    return (scheme + sep, userinfo, rest[len(userinfo) + 1:]) if at else (scheme + sep, None, rest)


def url_password(url: str) -> str | None:
    """The password of ``scheme://[user[:password]@]host...`` (URL-decoded), ``None`` if it carries none
    (as redis-py reads it: ``redis://name@host`` names a user, not a password)."""
    _, userinfo, _ = _split_userinfo(url)
    if userinfo is None or ":" not in userinfo:
        return None
    return unquote(userinfo.partition(":")[2]) or None


def redact_url(url: str) -> str:
    """``url`` with its password (user info or a ``password=`` query option) replaced by ``***``: what may be
    printed or logged. URLs of several hosts (``redis+cluster://a:1,b:2``) are handled."""
    scheme, userinfo, rest = _split_userinfo(url)
    if userinfo is not None and ":" in userinfo:
        url = f"{scheme}{userinfo.partition(':')[0]}:{_SECRET_MASK}@{rest}"
    return _QUERY_SECRET.sub(rf"\g<1>{_SECRET_MASK}", url)
