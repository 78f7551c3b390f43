"""The two Redis roles a process talks to (contract/keys.py says which key lives where).

`queues` is REDIS_URL's server; `streams` is STREAMS_REDIS_URL's, the same client when the
variable is unset, so a deployment with one Redis behaves as it always did. Both sides hold
one `Servers` of sync clients (the API's RQ calls, the workers) or of asyncio clients (the
API's handlers).

The streams server may be a Redis Cluster (or valkey cluster): a `redis+cluster://host:port`
URL (`rediss+cluster://` with TLS), naming any of its nodes, makes both sides use redis-py's
cluster clients for it. The queues server is always one server, as RQ needs.

Either server may be a primary watched by Redis Sentinel: a
`redis+sentinel://[user:password@]host:26379,host2:26379/<master name>[/db][?ssl=true]` URL
(`sentinel_username`, `sentinel_password` for the sentinels' own auth; `ssl_ca_certs` and
redis-py's other `ssl_*` options for TLS to both) gives a client that
asks the sentinels for the primary when it connects, and again after a failover (a lost
connection, or a demoted primary's READONLY): no process restarts (`Target`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar
from urllib.parse import parse_qs, unquote, urlsplit, urlunsplit

import redis
import redis.asyncio as aredis
import redis.asyncio.sentinel as async_sentinel
import redis.sentinel
from redis.asyncio.cluster import ClusterPipeline
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster

C = TypeVar("C")

_CLUSTER_SCHEMES = {"redis+cluster://": "redis://", "rediss+cluster://": "rediss://"}


def cluster_url(url: str) -> str | None:
    """The plain URL a cluster client is given for a `redis+cluster://` URL; None for any other."""
    for scheme, plain in _CLUSTER_SCHEMES.items():
        if url.startswith(scheme):
            return plain + url[len(scheme) :]
    return None


_SENTINEL_SCHEMES = ("redis+sentinel://", "rediss+sentinel://")


@dataclass(frozen=True)
class Target:
    """A `redis+sentinel://` URL: where the sentinels are, which primary they watch, and how
    to speak to both."""

    sentinels: list[tuple[str, int]]
    master: str
    db: int = 0
    ssl: bool = False
    auth: dict[str, str] = field(default_factory=dict)  # the primary's username, password
    sentinel_auth: dict[str, str] = field(default_factory=dict)  # the sentinels'
    tls: dict[str, str | bool] = field(default_factory=dict)  # ssl_ca_certs and the like, for both

    def _tls(self) -> dict[str, Any]:
        return {"ssl": True, **self.tls} if self.ssl else {}

    def sentinel_kwargs(self, **kwargs: Any) -> dict[str, Any]:
        """The sentinels' connections: the sockets' timeouts of the data connections, TLS
        if they use it, and the sentinels' own auth."""
        out = {k: v for k, v in kwargs.items() if k.startswith("socket_")}
        return {**out, **self.sentinel_auth, **self._tls()}

    def client_kwargs(self, **kwargs: Any) -> dict[str, Any]:
        return {"db": self.db, **self.auth, **self._tls(), **kwargs}


def sentinel_target(url: str) -> Target | None:
    """The `Target` of a `redis+sentinel://` URL (`rediss+sentinel://`: TLS); None for any
    other URL."""
    if not url.startswith(_SENTINEL_SCHEMES):
        return None
    parts = urlsplit(url)
    userinfo, _, hosts = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    sentinels = []
    for node in hosts.split(","):
        host, _, port = (
            node.rpartition(":") if ":" in node and not node.endswith("]") else (node, "", "26379")
        )
        sentinels.append((host.strip("[]"), int(port)))
    path = [p for p in parts.path.split("/") if p]
    if not sentinels or not path or len(path) > 2:
        raise ValueError(f"a sentinel URL names its sentinels and the primary: {_redacted(url)}")
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    auth = {k: unquote(v) for k, v in (("username", user), ("password", password)) if v}
    sentinel_auth = {
        k[len("sentinel_") :]: query[k] for k in ("sentinel_username", "sentinel_password") if k in query
    }
    flags = {"true": True, "false": False}
    tls = {k: flags.get(v.lower(), v) for k, v in query.items() if k.startswith("ssl_")}
    return Target(
        sentinels=sentinels,
        master=unquote(path[0]),
        db=int(path[1]) if len(path) > 1 else 0,
        ssl=url.startswith("rediss+") or query.get("ssl", "").lower() in ("1", "true", "yes"),
        auth=auth,
        sentinel_auth=sentinel_auth,
        tls=tls,
    )


def _redacted(url: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def sync_client(url: str, **kwargs: Any) -> redis.Redis:
    """A client of `url`: a cluster client for a cluster URL (same commands, routed by slot),
    the sentinels' current primary for a sentinel URL."""
    if target := sentinel_target(url):
        sentinels = redis.sentinel.Sentinel(
            target.sentinels, sentinel_kwargs=target.sentinel_kwargs(**kwargs)
        )
        return sentinels.master_for(target.master, **target.client_kwargs(**kwargs))
    plain = cluster_url(url)
    if plain is None:
        return redis.Redis.from_url(url, **kwargs)
    return RedisCluster.from_url(plain, **kwargs)  # type: ignore[return-value]


class BlockingSentinelPool(async_sentinel.SentinelConnectionPool, aredis.BlockingConnectionPool):
    """The sentinels' primary, with a pool that makes a command wait for a free connection
    (as api/services.py's pool does) rather than fail."""


def async_client(url: str, blocking: bool = False, **kwargs: Any) -> aredis.Redis:
    """An asyncio client of one server's `url`, or of the sentinels' primary; `blocking`: its
    pool makes a command wait for a free connection (`max_connections`, `timeout`)."""
    if target := sentinel_target(url):
        single = kwargs.pop("single_connection_client", False)
        sentinels = async_sentinel.Sentinel(
            target.sentinels, sentinel_kwargs=target.sentinel_kwargs(**kwargs)
        )
        kind = BlockingSentinelPool if blocking else async_sentinel.SentinelConnectionPool
        pool = kind(target.master, sentinels, is_master=True, **target.client_kwargs(**kwargs))
        return aredis.Redis(connection_pool=pool, single_connection_client=single)
    if blocking:
        return aredis.Redis(connection_pool=aredis.BlockingConnectionPool.from_url(url, **kwargs))
    return aredis.Redis.from_url(url, **kwargs)


class GatedCluster(AsyncRedisCluster):
    """redis-py's asyncio cluster client fails a command with MaxConnectionsError once a node's
    pool is busy; this one makes it wait (up to `wait_s`) for one of `max_connections` places,
    as the API's pooled client does (api/services.py). Half the places go to single commands,
    half to pipelines (one connection per node each), so no node's pool is ever exhausted."""

    def __init__(self, *args: Any, wait_s: float = 5.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        places = max(kwargs.get("max_connections", 100) // 2, 1)
        self._commands = asyncio.Semaphore(places)
        self._pipelines = asyncio.Semaphore(places)
        self._wait_s = wait_s

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        async with _place(self._commands, self._wait_s):
            return await super().execute_command(*args, **kwargs)

    def pipeline(self, transaction: Any = None, shard_hint: Any = None) -> ClusterPipeline:
        if shard_hint:
            raise ValueError("shard_hint is not supported in cluster mode")
        return _GatedPipeline(self, transaction)


class _GatedPipeline(ClusterPipeline):
    async def execute(self, *args: Any, **kwargs: Any) -> Any:
        client: GatedCluster = self.cluster_client  # type: ignore[assignment]
        async with _place(client._pipelines, client._wait_s):
            return await super().execute(*args, **kwargs)


class _place:
    """Hold a place of `gate`, waiting up to `wait_s` (then TimeoutError, a RedisError)."""

    def __init__(self, gate: asyncio.Semaphore, wait_s: float) -> None:
        self._gate, self._wait_s = gate, wait_s

    async def __aenter__(self) -> None:
        try:
            await asyncio.wait_for(self._gate.acquire(), self._wait_s)
        except TimeoutError:
            raise redis.TimeoutError("no free connection to the streams cluster") from None

    async def __aexit__(self, *exc: object) -> None:
        self._gate.release()


def async_cluster_client(url: str, wait_s: float = 5.0, **kwargs: Any) -> aredis.Redis:
    """An asyncio cluster client for a cluster URL (`cluster_url`): a pool per node, and a
    command waits for a free connection rather than failing (`GatedCluster`). Initialize it
    (`await client.initialize()`) before using it from many tasks at once: concurrent first
    commands each start the initialization, and break each other's connections."""
    plain = cluster_url(url)
    if plain is None:
        raise ValueError(f"not a cluster URL: {url}")
    return GatedCluster.from_url(plain, wait_s=wait_s, **kwargs)  # type: ignore[return-value]


def node_url(url: str, host: str, port: int) -> str:
    """`url` (a cluster URL or its plain one) made to name one node: its user, password, TLS
    and options kept, so that a plain client may connect to that node alone."""
    parts = urlsplit(cluster_url(url) or url)
    auth = parts.netloc.rpartition("@")[0]
    return urlunsplit(parts._replace(netloc=f"{auth}@{host}:{port}" if auth else f"{host}:{port}"))


def is_cluster(client: object) -> bool:
    return isinstance(client, RedisCluster | AsyncRedisCluster)


@dataclass(frozen=True)
class Servers(Generic[C]):
    queues: C  # RQ's queues and records, the worker registry, stats, owners, files, batches
    streams: C  # job hashes, event streams, heartbeats and their shards' indexes

    @property
    def split(self) -> bool:
        """Two servers (or clients) rather than one."""
        return self.queues is not self.streams

    def each(self) -> list[C]:
        """Each distinct client once."""
        return [self.queues, self.streams] if self.split else [self.queues]


async def node_infos(client: aredis.Redis, section: str) -> list[dict]:
    """INFO `section` of each server behind an asyncio client: one, or each cluster primary."""
    if isinstance(client, AsyncRedisCluster):
        await client.initialize()  # the slot map (once): which nodes are primaries
        return [await client.info(section, target_nodes=node) for node in client.get_primaries()]
    return [await client.info(section)]
