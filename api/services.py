"""What the handlers need, built once per process by the app's lifespan (no globals).

Every client and background part is pushed on one `AsyncExitStack` as it is made. So `close`
stops them in the reverse order. A part that fails to start also stops those made before it."""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field

import redis
import redis.asyncio as aredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from api.cluster.figures import ClusterStats
from api.cluster.reaper import Reaper
from api.cluster.resumes import Resumes
from api.http.auth import KeyRing
from api.http.offload import Lane
from api.jobs.acks import ClusterAcks, Confirms, ReplicaAcks, ReplicaWatch
from api.jobs.admission import Admission, OpenStreams
from api.jobs.memory import MemoryWatch
from api.jobs.routing import Router
from api.jobs.store import JobStore
from api.jobs.workers import WorkerRegistry
from api.metrics import Metrics
from api.settings import Settings
from api.streaming.reader import StreamReader
from contract.servers import Servers, async_client, async_cluster_client, cluster_url, is_cluster, sync_client

log = logging.getLogger(__name__)

# A lost connection is tried again (a restart, a failover); a command that timed out is not:
# a Redis that answers nothing is a 503 after one REDIS_TIMEOUT_SECONDS, not one per try.
RETRIED = (redis.ConnectionError,)


def shared_client(url: str, size: int, wait_s: float, **kwargs) -> aredis.Redis:
    """The pool every handler shares. A blocking pool: under a burst of streams, a command
    waits (up to `wait_s`) for a free connection. The default pool of redis-py fails at once
    with "Too many connections"."""
    # The retry goes to the pool's connections: with an explicit pool redis-py ignores the
    # client's own. Without it a connection Redis dropped (a restart) fails its next command.
    retry = AsyncRetry(ExponentialBackoff(cap=0.5, base=0.05), 2, supported_errors=RETRIED)
    return async_client(url, blocking=True, max_connections=size, timeout=wait_s, retry=retry, **kwargs)


@dataclass
class Services:
    settings: Settings
    # the queues server (REDIS_URL): owners, files, batches, registry, stats
    redis: aredis.Redis
    # both servers: job state and tokens are on `streams`
    servers: Servers[aredis.Redis]
    # both, synchronous: RQ's calls, in worker threads
    rq_servers: Servers[redis.Redis]
    jobs: JobStore
    registry: WorkerRegistry
    stats: ClusterStats
    admission: Admission
    reader: StreamReader
    reaper: Reaper
    memory: MemoryWatch
    # the replica counts new jobs are confirmed against
    replicas: ReplicaWatch
    metrics: Metrics
    streams: OpenStreams
    # CPU-heavy request work, off the event loop (api/http/offload.py)
    heavy: Lane
    # whether a requeued job past its deadline may wait on
    resumes: Resumes
    # the accepted keys, whose budget use /metrics shows per key
    keys: KeyRing
    parts: contextlib.AsyncExitStack = field(default_factory=contextlib.AsyncExitStack, repr=False)

    @classmethod
    async def start(cls, settings: Settings, keys: KeyRing) -> Services:
        """Make and start every part. `close` stops them. If one fails to start, those
        started before it are stopped and the error is raised."""
        async with contextlib.AsyncExitStack() as parts:
            services = await cls._start(settings, keys, parts)
            services.parts = parts.pop_all()
        return services

    @classmethod
    async def _start(cls, settings: Settings, keys: KeyRing, parts: contextlib.AsyncExitStack) -> Services:
        url = settings.shared.redis_url
        # Few, fast retries: a lost Redis must turn into a 503 in seconds, not a hang.
        common = dict(
            socket_timeout=settings.connection.redis_timeout_s,
            socket_connect_timeout=min(settings.connection.redis_timeout_s, 2.0),
            health_check_interval=30,
        )
        streams_url = settings.shared.streams_url

        def pooled(at: str) -> aredis.Redis:
            # a cluster client keeps a pool per node
            if cluster_url(at):
                return async_cluster_client(
                    at,
                    wait_s=settings.connection.redis_pool_wait_s,
                    max_connections=settings.connection.redis_pool,
                    **common,
                )
            return shared_client(
                at, settings.connection.redis_pool, settings.connection.redis_pool_wait_s, **common
            )

        def synchronous(at: str) -> redis.Redis:
            retry = Retry(ExponentialBackoff(cap=0.5, base=0.05), 2, supported_errors=RETRIED)
            return sync_client(at, retry=retry, **common)

        client = pooled(url)
        servers = Servers(queues=client, streams=client if streams_url == url else pooled(streams_url))
        for each in servers.each():
            parts.push_async_callback(each.aclose)
        if is_cluster(servers.streams):
            # the slot map, read once before any handler runs (contract.servers)
            try:
                await servers.streams.initialize()
            except (redis.RedisError, OSError) as exc:
                log.warning("the streams cluster does not answer yet (%s)", exc)
        rq_client = synchronous(url)
        rq_servers = Servers(
            queues=rq_client, streams=rq_client if streams_url == url else synchronous(streams_url)
        )
        for sync in rq_servers.each():
            parts.callback(sync.close)
        registry = WorkerRegistry(client, settings.lifetimes.worker_stale_s)
        router = Router(client, registry, settings.routing)
        acks = _acks(servers, settings.connection.replica_ack_s)
        replicas = ReplicaWatch(acks.each())
        await replicas.start()
        parts.push_async_callback(replicas.stop)
        jobs = JobStore(
            servers,
            rq_servers,
            queue_wait_s=settings.lifetimes.queue_wait_s,
            deadline_s=settings.lifetimes.job_deadline_s,
            recovery=settings.recovery,
            router=router,
            acks=acks,
            cached_token_weight=settings.quotas.cached_token_weight,
            public_prompts=settings.access.public_prompts,
        )
        streams = OpenStreams()
        memory = MemoryWatch(servers, settings.intake.redis_memory_high)
        await memory.start()
        parts.push_async_callback(memory.stop)
        reader = StreamReader(streams_url, servers.streams)
        await reader.start()
        parts.push_async_callback(reader.stop)
        reaper = Reaper(
            servers,
            jobs,
            registry,
            router,
            settings.lifetimes.reaper_interval_s,
            settings.lifetimes.reaper_settle_s,
        )
        await reaper.start()
        parts.push_async_callback(reaper.stop)
        return cls(
            settings=settings,
            redis=client,
            servers=servers,
            rq_servers=rq_servers,
            jobs=jobs,
            registry=registry,
            stats=ClusterStats(servers),
            admission=Admission(client, registry, streams, memory, settings.intake, settings.quotas),
            reader=reader,
            reaper=reaper,
            memory=memory,
            replicas=replicas,
            metrics=Metrics(),
            streams=streams,
            heavy=Lane(),
            resumes=Resumes(client, registry, settings.recovery.resume_wait_s),
            keys=keys,
        )

    def refused(self, reason: str, owner: str = "") -> None:
        """Count a refusal: the pool's, by error code. A known key's is counted under its label."""
        self.metrics.rejected.labels(reason).inc()
        if owner:
            label = self.keys.label(owner, self.settings.access.metrics_keys)
            self.metrics.key_rejected.labels(label, reason).inc()

    async def close(self) -> None:
        """Stop every part, the last started first; the clients close last."""
        await self.parts.aclose()


def _acks(servers: Servers[aredis.Redis], timeout_s: float) -> Servers[Confirms]:
    """One `ReplicaAcks` per server (the same one twice on one server). A streams cluster's
    confirms on each primary."""
    queues = ReplicaAcks(servers.queues, timeout_s)
    streams: Confirms = queues
    if is_cluster(servers.streams):
        streams = ClusterAcks(servers.streams, timeout_s)  # type: ignore[arg-type]
    elif servers.split:
        streams = ReplicaAcks(servers.streams, timeout_s)
    return Servers(queues=queues, streams=streams)
