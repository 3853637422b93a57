"""Connecting to Redis (one node or a cluster), the store's Lua scripts, and the server's identity.

A worker must notice when the Redis it applies to restarted (an AOF ``everysec`` restart that lost the last
second of writes) or was replaced (a failover to a lagging replica): the counts may miss what it applied last.
The store keeps a *server marker* per campaign (:func:`.keys.server_marker_key`, a random 128-bit token
written once with the campaign's first apply) and the apply scripts compare it, with one ``GET`` in the same
script, with the token the worker last applied under (``SERVER_CHANGED`` if they differ). A Redis that lost its
data lost the marker with it. A restarted or replaced server that kept its data still holds the old marker, so
every new connection reads the server's run id once (``INFO server`` in the connection's start-up, never per
batch): if a known node comes back with another run id, or a node new to this store serves a campaign, the
markers this store applied under are replaced there before the connection carries any command (a
compare-and-set: another worker that replaced them already is not undone). The apply in flight when the
connection broke, retried by redis-py on the new connection, is refused like every later one until the worker
checked the cursors and called :meth:`StoreConnection.accept_server`.
"""
from __future__ import annotations

import functools
import re
import secrets
from importlib import resources
from typing import Any, Awaitable, Callable, Iterable

import redis
import redis.asyncio as aioredis
import redis.asyncio.cluster
import redis.cluster
from redis.exceptions import RedisClusterException, RedisError, ResponseError

from wire.transport import RedisSecurity, redact_url

from .keys import server_marker_key

__all__ = ["CLUSTER_SCHEMES", "RETRYABLE_ERRORS", "SCRIPTS", "StoreConnection", "cluster_url", "connect",
           "connect_sync", "is_cluster_url", "new_token"]

# Errors after which a store call may succeed if retried (connection loss, loading, OOM, ...; on a cluster
# also no reachable node or an uncovered slot, which redis-py raises outside RedisError).
RETRYABLE_ERRORS: tuple[type[BaseException], ...] = (RedisError, RedisClusterException, ConnectionError, OSError)


def _lua(name: str) -> str:
    return resources.files(__package__).joinpath("lua", f"{name}.lua").read_text()


#: The store's Lua scripts by name (``lua/*.lua``), read once at import; the two apply scripts share their head
#: and tail (``apply_prelude.lua``, ``apply_epilogue.lua``).
SCRIPTS: dict[str, str] = {
    **{name: _lua(name) for name in ("claim_lease", "release_lease", "claim_final", "restore_final",
                                     "confirm_final", "clear_touched", "raise_floor", "prune", "claim_keys",
                                     "settle_keys", "invalidate_marker")},
    **{name: _lua("apply_prelude") + _lua(name) + _lua("apply_epilogue")
       for name in ("apply_batch", "apply_watermark")},
}

_RUN_ID = re.compile(rb"run_id:([0-9a-f]+)")


def new_token() -> str:
    """A random 128-bit token (hex)."""
    return secrets.token_hex(16)


#: URL schemes of a Redis Cluster (``rediss+cluster`` = TLS): ``redis+cluster://[user:password@]host:port[,host:port...]``
#: lists seed nodes (any reachable one suffices: the client discovers the others and the slot map);
#: an optional path may only be ``/0`` and query options are passed on as for ``redis://`` URLs.
CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
_DEFAULT_PORT = 6379


def is_cluster_url(url: str) -> bool:
    """True if ``url`` names a Redis Cluster (``redis+cluster://`` or ``rediss+cluster://``)."""
    return url.split("://", 1)[0].lower() in CLUSTER_SCHEMES


def cluster_url(nodes: Iterable[tuple[str, int]], *, tls: bool = False) -> str:
    """The cluster URL of the seed nodes ``(host, port)``."""
    hosts = ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in nodes)
    if not hosts:
        raise ValueError("a cluster URL needs at least one node")
    return f"{'rediss' if tls else 'redis'}+cluster://{hosts}"


def _split_host_port(text: str, url: str) -> tuple[str, int]:
    host, port = text, str(_DEFAULT_PORT)
    if text.startswith("["):  # [ipv6]:port
        host, _, rest = text[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else port
    elif ":" in text:
        host, port = text.rsplit(":", 1)
    if not host or not port.isdigit():
        raise ValueError(f"bad node {text!r} in Redis Cluster URL {redact_url(url)!r} (expected host:port)")
    return host, int(port)


def _cluster_seeds(url: str) -> tuple[str, list[tuple[str, int]]]:
    """A single-node URL of the first seed (credentials, options) and every seed ``(host, port)``."""
    scheme, _, rest = url.partition("://")
    end = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    authority, tail = rest[:end], rest[end:]
    userinfo, _, hosts = authority.rpartition("@")
    seeds = [_split_host_port(h.strip(), url) for h in hosts.split(",") if h.strip()]
    if not seeds:
        raise ValueError(f"Redis Cluster URL {redact_url(url)!r} names no node (expected {scheme}://host:port[,host:port...])")
    path = tail.partition("?")[0]
    if path not in ("", "/", "/0"):
        raise ValueError(f"Redis Cluster URL {redact_url(url)!r}: a cluster has database 0 only, got path {path!r}")
    host, port = seeds[0]
    netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    first = f"{CLUSTER_SCHEMES[scheme.lower()]}://{userinfo + '@' if userinfo else ''}{netloc}{tail}"
    return first, seeds


def connect(url: str) -> "aioredis.Redis | aioredis.RedisCluster":
    """An async client of ``url``: one node (``redis://``, ``rediss://``, ``unix://``) or a cluster (:data:`CLUSTER_SCHEMES`).

    Credentials and TLS files: the URL's, else ``LDP_REDIS_PASSWORD`` ... (:class:`wire.transport.RedisSecurity`)."""
    security = RedisSecurity.from_env().client_kwargs(url)
    if not is_cluster_url(url):
        return aioredis.from_url(url, **security)
    first, seeds = _cluster_seeds(url)
    return aioredis.RedisCluster.from_url(first, startup_nodes=[aioredis.cluster.ClusterNode(h, p) for h, p in seeds],
                                          **security)


def connect_sync(url: str, **options: Any) -> "redis.Redis | redis.cluster.RedisCluster":
    """:func:`connect` for synchronous code (``options``: more client options, e.g. ``socket_timeout``)."""
    security = {**RedisSecurity.from_env().client_kwargs(url), **options}
    if not is_cluster_url(url):
        return redis.Redis.from_url(url, **security)
    first, seeds = _cluster_seeds(url)
    return redis.cluster.RedisCluster.from_url(first, startup_nodes=[redis.cluster.ClusterNode(h, p) for h, p in seeds],
                                               **security)


@functools.lru_cache(maxsize=8)
def _shared_cluster_client(url: str) -> "redis.cluster.RedisCluster":
    """One synchronous cluster client per URL: its start-up (slot map, command table) takes ~50 ms."""
    return connect_sync(url)


ConnectHook = Callable[[Any], Awaitable[None]]


def _install_connect_hook(client: "aioredis.Redis | aioredis.RedisCluster", check: ConnectHook) -> None:
    """Run ``check(connection)`` on every new connection of ``client``, after redis-py's own start-up (and after
    a start-up function the client already had, such as a cluster's ``READONLY``)."""
    def wrap(kwargs: dict[str, Any]) -> None:
        previous = kwargs.get("redis_connect_func")

        async def on_connect(conn: Any) -> None:
            await (previous(conn) if previous is not None else conn.on_connect())
            await check(conn)

        kwargs["redis_connect_func"] = on_connect

    if isinstance(client, aioredis.RedisCluster):
        manager = client.nodes_manager
        wrap(manager.connection_kwargs)  # nodes discovered later
        for node in {**manager.startup_nodes, **manager.nodes_cache}.values():
            wrap(node.connection_kwargs)
    else:
        wrap(client.connection_pool.connection_kwargs)


class StoreConnection:
    """The client, the registered scripts and the server identity that every part of :class:`CountStore` uses."""

    def __init__(self, client: "aioredis.Redis | aioredis.RedisCluster") -> None:
        self.redis = client
        self._one_node = not isinstance(client, aioredis.RedisCluster)
        self._scripts = {name: client.register_script(text) for name, text in SCRIPTS.items()}
        self._epochs: dict[str, str] = {}  # campaign -> its store epoch
        self._markers: dict[str, str] = {}  # campaign -> the server marker its last apply ran under
        self._new_markers: dict[str, str] = {}  # campaign -> the marker seen with SERVER_CHANGED, until accepted
        self._run_ids: dict[str, str] = {}  # node address -> run id its newest connection found
        _install_connect_hook(client, self._check_server)

    @classmethod
    def from_url(cls, url: str) -> Any:
        """A store on one Redis node or on a Redis Cluster (``redis+cluster://host:port,...``; see :func:`connect`)."""
        return cls(connect(url))

    async def close(self) -> None:
        """Close the client and its connections."""
        await self.redis.aclose()

    async def server_id(self) -> str:
        """The Redis server's run id (a new one after every restart; a cluster's: its nodes' ids, sorted)."""
        info = await self.redis.info("server")
        if "run_id" in info:
            return str(info["run_id"])
        return ",".join(sorted(str(v.get("run_id")) for v in info.values() if isinstance(v, dict)))

    async def _check_server(self, conn: Any) -> None:
        """A new connection: read the node's run id; if the node restarted, or is new to this store (a failover),
        replace there the server markers this store applied under (module doc)."""
        await conn.send_command("INFO", "server")
        raw = await conn.read_response()
        found = _RUN_ID.search(raw.encode() if isinstance(raw, str) else bytes(raw))
        run = found.group(1).decode() if found else ""
        node = getattr(conn, "path", "") or f"{conn.host}:{conn.port}"
        known = self._run_ids.get(node)
        if known == run:
            return
        if (known is not None or self._run_ids) and self._markers:
            for campaign, token in list(self._markers.items()):
                await conn.send_command("EVAL", SCRIPTS["invalidate_marker"], 1, server_marker_key(campaign), token,
                                        new_token())
                try:
                    await conn.read_response()
                except ResponseError:  # MOVED: the campaign's slot is on another node of the cluster
                    pass
        self._run_ids[node] = run

    def _expected_marker(self, campaign: str) -> str:
        """The marker the campaign's next apply must find ('' before the first apply)."""
        return self._markers.get(campaign, "")

    def _saw_marker(self, campaign: str, marker: str, changed: bool) -> None:
        """Record the marker an apply script returned (``changed``: with SERVER_CHANGED)."""
        if changed:
            self._new_markers[campaign] = marker
        elif marker:
            self._markers[campaign] = marker

    def accept_server(self, campaign: str) -> None:
        """The worker checked the cursors after ``SERVER_CHANGED``: apply to the new server from now on."""
        if campaign in self._new_markers:
            self._markers[campaign] = self._new_markers.pop(campaign)

    def forget_epochs(self) -> None:
        """Read the campaigns' epochs again on next use and accept the current server (after a rebalance
        restored the positions from it)."""
        self._epochs.clear()
        self._markers.clear()
        self._new_markers.clear()
