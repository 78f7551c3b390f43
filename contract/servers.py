"""The two Redis roles a process talks to (contract/keys.py says which key lives where).

`queues` is REDIS_URL's server, and `streams` is STREAMS_REDIS_URL's. With that variable
unset, `streams` is the same client. So a deployment with one Redis behaves as it always did.
Both sides hold one `Servers`. It holds sync clients (the API's RQ calls, the workers) or
asyncio clients (the API's handlers).

The streams server may be a Redis Cluster (or valkey cluster). Its URL is then
`redis+cluster://host:port` (`rediss+cluster://` with TLS), naming any of its nodes. Both
sides then use redis-py's cluster clients for it. The queues server is always one server, as
RQ needs.

Either server may be a primary watched by Redis Sentinel (a `redis+sentinel://` URL). Or it
may be a managed Redis that fails over behind one name. Every client here follows the
primary through a failover (contract/failover.py).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Generic, TypeVar
from urllib.parse import urlsplit, urlunsplit

import redis
import redis.asyncio as aredis
import redis.asyncio.sentinel as async_sentinel
import redis.sentinel
from redis.asyncio.cluster import ClusterPipeline
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster

from contract import failover
from contract.logs import redacted

C = TypeVar("C")

_CLUSTER_SCHEMES = {"redis+cluster://": "redis://", "rediss+cluster://": "rediss://"}


def cluster_url(url: str) -> str | None:
    """The plain URL a cluster client is given for a `redis+cluster://` URL. None for any other."""
    for scheme, plain in _CLUSTER_SCHEMES.items():
        if url.startswith(scheme):
            return plain + url[len(scheme) :]
    return None


def sync_client(url: str, **kwargs: Any) -> redis.Redis:
    """A client of `url`.

    For a cluster URL, it is a cluster client: the same commands, routed by slot. For a
    sentinel URL, it is a client of the sentinels' current primary."""
    if target := failover.sentinel_target(url):
        # the client owns its pool
        return redis.Redis.from_pool(failover.sentinel_pool(target, **kwargs))
    plain = cluster_url(url)
    if plain is None:
        return redis.Redis.from_pool(failover.pool(url, **kwargs))
    return RedisCluster.from_url(plain, **kwargs)  # type: ignore[return-value]


def async_client(url: str, blocking: bool = False, **kwargs: Any) -> aredis.Redis:
    """An asyncio client of one server's `url`, or of the sentinels' primary.

    With `blocking`, its pool makes a command wait for a free connection (`max_connections`,
    `timeout`)."""
    single = kwargs.pop("single_connection_client", False)
    if target := failover.sentinel_target(url):
        pool = failover.async_sentinel_pool(target, blocking, **kwargs)
    else:
        pool = failover.async_pool(url, blocking, **kwargs)
    client = aredis.Redis(connection_pool=pool, single_connection_client=single)
    # closing the client closes its pool (as from_url's)
    client.auto_close_connection_pool = True
    return client


class GatedCluster(AsyncRedisCluster):
    """An asyncio cluster client that makes a command wait for a free connection.

    Once a node's pool is busy, redis-py's asyncio cluster client fails a command with
    MaxConnectionsError. This one makes the command wait (up to `wait_s`) for one of
    `max_connections` places. The API's pooled client does the same (api/services.py). Half
    the places go to single commands, half to pipelines (one connection per node each). So no
    node's pool is ever exhausted."""

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
    """An asyncio cluster client for a cluster URL (`cluster_url`).

    It has a pool per node. A command waits for a free connection rather than failing
    (`GatedCluster`). Initialize it (`await client.initialize()`) before using it from many
    tasks at once. Concurrent first commands each start the initialization, and break each
    other's connections."""
    plain = cluster_url(url)
    if plain is None:
        raise ValueError(f"not a cluster URL: {redacted(url)}")
    return GatedCluster.from_url(plain, wait_s=wait_s, **kwargs)  # type: ignore[return-value]


def node_url(url: str, host: str, port: int) -> str:
    """`url` (a cluster URL or its plain one) made to name one node.

    Its user, password, TLS and options are kept. So a plain client may connect to that node
    alone."""
    parts = urlsplit(cluster_url(url) or url)
    auth = parts.netloc.rpartition("@")[0]
    return urlunsplit(parts._replace(netloc=f"{auth}@{host}:{port}" if auth else f"{host}:{port}"))


def is_cluster(client: object) -> bool:
    return isinstance(client, RedisCluster | AsyncRedisCluster)


def is_sentinel(client: object) -> bool:
    """A client of the sentinels' primary (a `redis+sentinel://` URL).

    Its pool can say which server the sentinels call the primary now (`get_master_address`)."""
    pool = getattr(client, "connection_pool", None)
    return isinstance(pool, redis.sentinel.SentinelConnectionPool | async_sentinel.SentinelConnectionPool)


@dataclass(frozen=True)
class Servers(Generic[C]):
    # RQ's queues and records, the worker registry, stats, owners, files, batches
    queues: C
    # job hashes, event streams, heartbeats and their shards' indexes
    streams: C

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
        # the slot map (once): which nodes are primaries
        await client.initialize()
        return [await client.info(section, target_nodes=node) for node in client.get_primaries()]
    return [await client.info(section)]
