"""Make sure a new job survives a failover before the API answers for it (docs/protocol.md,
"Failover").

A promoted replica may lack the primary's last writes. A primary the sentinels have replaced
takes writes until they demote it. After a `SENTINEL FAILOVER`, that is up to ten seconds
later. All those writes are lost. So a new job is confirmed before the API answers for it.
`settled` runs `EXISTS` of the job's hash on one connection. On a server with replicas, it
then runs `INCR` of `ACK_MARK` and `WAIT n` there. `WAIT n` returns once the `n` connected
replicas have acknowledged that write. A failover may promote any of them. They then hold
every write made before it, by any connection. Through Sentinel, `settled` also asks the
sentinels whether the server that answered is still the primary. Callers waiting at the same
time share one round (a group commit). A burst of requests costs one round trip, not one
each.

A server without replicas has none to wait for. But one that had a replica in the last
`REMEMBER_S` is still waited for. This holds whichever server is the primary now. A replaced
primary has lost its replica to the promotion. A promoted one has none until the old primary
has synced from it. A restarted one has none until its replica has synced again. A failure
in that window loses what only the primary held. So while the replica is away, new jobs wait
for it (`CONFIRM_FOR_S` at most: `confirm_new_job`). With one replica, that wait is the
price of the guarantee. A second replica removes it. When a round fails, the caller writes
the job again where the primary is now.

`ReplicaWatch` reads the replica count every `REFRESH_S`, not only when a job is made. Take
an API process making a job every 20 s, with a promotion between two. Without the watch, it
would last have seen the replica before the promotion. It would then answer for the next job
on the replaced primary without a `WAIT`. A process's first look cannot tell when a replica
left. A primary with no replica but an active backlog had one within `repl-backlog-ttl`. It
is taken to have just lost it.

A streams cluster (`ClusterAcks`) confirms each job on the primary that holds its slot. It
keeps one `ReplicaAcks` per primary, on a connection of its own. Its mark is a key of that
slot. A replica seen on any primary is remembered for all. The promoted replica of a primary
that failed has none until the old primary comes back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import redis.asyncio as aredis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.exceptions import RedisError

from api.tasks import Background, every
from contract import keys
from contract.servers import Servers, is_sentinel

log = logging.getLogger(__name__)

# how long a new job is recorded again until a replica has it
CONFIRM_FOR_S = 5.0
# how often the replica count is read again
REFRESH_S = 2.0
# a replica seen this recently is waited for, even while none is connected
REMEMBER_S = 15.0


class Confirms(Protocol):
    """What the job store asks of a server's confirmations."""

    async def settled(self, key: str | None = None) -> bool: ...
    async def look(self) -> None: ...


@dataclass
class LastReplica:
    """When the primary (any, of any shard) last had a replica (monotonic seconds)."""

    at: float = -REMEMBER_S


@dataclass
class _Waiter:
    future: asyncio.Future[bool]
    # a key that must be there
    key: str | None


class ReplicaAcks:
    def __init__(
        self,
        client: aredis.Redis,
        timeout_s: float,
        mark: str = keys.ACK_MARK,
        seen: LastReplica | None = None,
    ) -> None:
        self._client = client
        # 0: never wait
        self._timeout_s = timeout_s
        # the key incremented before a WAIT
        self._mark = mark
        self._sentinel = is_sentinel(client)
        self._replicas = 0
        # monotonic; None: never read
        self._read_at: float | None = None
        self._seen = seen or LastReplica()
        self._waiting: list[_Waiter] = []
        self._round: asyncio.Task[None] | None = None

    async def settled(self, key: str | None = None) -> bool:
        """True once a replica holds every write this process made there before the call.
        The server must also hold `key`, if given. It must be the one the sentinels call the
        primary. False if not (yet): a failover may have lost it."""
        if self._timeout_s <= 0:
            return True
        if not await self._expected() and not self._sentinel:
            return True
        waiter = _Waiter(asyncio.get_running_loop().create_future(), key)
        self._waiting.append(waiter)
        if self._round is None or self._round.done():
            self._round = asyncio.create_task(self._rounds())
        return await asyncio.shield(waiter.future)

    async def look(self) -> None:
        """Read the replica count (`ReplicaWatch` calls this every REFRESH_S)."""
        now = time.monotonic()
        first, self._read_at = self._read_at is None, now
        try:
            info = await self._client.info("replication")
        except RedisError as exc:
            # a round would fail too, and say so
            log.debug("could not read the replica count: %s", exc)
            return
        primary = info.get("role") == "master"
        self._replicas = int(info.get("connected_slaves", 0)) if primary else 0
        # when it left, unknown
        had = primary and int(info.get("repl_backlog_active", 0)) == 1
        if self._replicas or (first and had):
            self._seen.at = now

    async def _expected(self) -> bool:
        """Whether the server has (or lately had) a replica to wait for."""
        if self._read_at is None or time.monotonic() - self._read_at >= REFRESH_S:
            await self.look()
        return self._replicas > 0 or time.monotonic() - self._seen.at < REMEMBER_S

    async def _rounds(self) -> None:
        while self._waiting:
            batch, self._waiting = self._waiting, []
            try:
                verdicts = await self._one_round(batch)
            except RedisError as exc:
                log.warning("could not confirm new jobs: %s", exc)
                verdicts = [False] * len(batch)
            if not all(verdicts):
                # read the replica count again before the next round
                await self.look()
            for waiter, ok in zip(batch, verdicts, strict=True):
                if not waiter.future.done():
                    waiter.future.set_result(ok)

    async def _one_round(self, batch: list[_Waiter]) -> list[bool]:
        expected = await self._expected()
        pool = self._client.connection_pool
        connection = await pool.get_connection()
        address = (connection.host, connection.port)
        pipe = self._client.pipeline(transaction=False)
        # released by the pipeline when it is done
        pipe.connection = connection
        wanted = [w.key for w in batch if w.key is not None]
        for key in wanted:
            pipe.exists(key)
        # a failover may promote any of them
        replicas = max(self._replicas, 1)
        if expected:
            pipe.incr(self._mark)
            pipe.execute_command("WAIT", replicas, int(self._timeout_s * 1000))
        results = await pipe.execute()
        acked = not expected or int(results[-1]) >= replicas
        # the sentinels may have replaced the server that answered
        if self._sentinel:
            acked = acked and await pool.get_master_address() == address  # type: ignore[attr-defined]
        there = iter(results[: len(wanted)])
        return [acked and (w.key is None or bool(next(there))) for w in batch]


class ClusterAcks:
    """`ReplicaAcks` for a streams cluster. A job is confirmed on the primary that holds its
    slot now. After a failover, that is the promoted replica."""

    def __init__(self, client: AsyncRedisCluster, timeout_s: float) -> None:
        self._client = client
        self._timeout_s = timeout_s
        self._primaries: dict[str, ReplicaAcks] = {}
        self._seen = LastReplica()

    async def settled(self, key: str | None = None) -> bool:
        """`ReplicaAcks.settled` on the primary holding `key`. Without a key there is
        nothing to wait for: a cluster holds only streams."""
        if key is None or self._timeout_s <= 0:
            return True
        node = self._client.get_node_from_key(key)
        acks = self._primaries.get(node.name)
        if acks is None:
            pool = aredis.ConnectionPool(
                connection_class=node.connection_class, max_connections=4, **node.connection_kwargs
            )
            client = aredis.Redis(connection_pool=pool)
            acks = ReplicaAcks(client, self._timeout_s, keys.ack_mark_beside(key), self._seen)
            self._primaries[node.name] = acks
        return await acks.settled(key)

    async def look(self) -> None:
        """Read each primary's replica count (`ReplicaWatch`)."""
        for acks in list(self._primaries.values()):
            await acks.look()


class ReplicaWatch:
    """Reads the replica count of each server new jobs are confirmed on, every `REFRESH_S`.
    It reads whether or not jobs are made. So a replica that left between two jobs far apart
    is still remembered. The API's lifespan starts and stops it."""

    def __init__(self, confirms: list[Confirms]) -> None:
        self._confirms = confirms
        self._task = Background("replica-watch", lambda: every(REFRESH_S, self._look, "replica watch"))

    async def start(self) -> None:
        self._task.start()

    async def stop(self) -> None:
        await self._task.stop()

    async def _look(self) -> None:
        for confirms in self._confirms:
            await confirms.look()


@dataclass(frozen=True)
class RedoSteps:
    """What confirming a new job may do again on the primary there is now."""

    # RECORD the job (False: it is there already)
    record: Callable[[], Awaitable[bool]]
    # queued, but the queues server has no RQ record
    entry_lost: Callable[[], Awaitable[bool]]
    enqueue: Callable[[], Awaitable[None]]


async def confirm_new_job(acks: Servers[Confirms], job_id: str, again: RedoSteps) -> None:
    """Return once a replica holds the new job. A failover meanwhile may have lost it with
    the old primary's last writes. So the job is recorded and queued again on the primary
    there is now. This follows every round that did not confirm it, the last included. It
    goes on until a replica has the job or `CONFIRM_FOR_S` passes. RECORD changes nothing if
    the job is there. CLAIM drops a second queue entry of a job that runs or ran. With two
    servers, the queues server may lose the queue entry alone. The streams server then kept
    the job, its pending mark cleared. The job is queued again if still queued with no RQ
    record."""
    deadline = time.monotonic() + CONFIRM_FOR_S
    while True:
        if acks.split:
            held, queued = await asyncio.gather(acks.streams.settled(keys.job(job_id)), acks.queues.settled())
        else:
            held = queued = await acks.streams.settled(keys.job(job_id))
        if held and queued:
            return
        # before the wait may run out: the job is written again where the primary is now, if
        # it lacks it (a round that outlasted the wait may have found it lost)
        # Redis still away: wait and try again
        with contextlib.suppress(RedisError):
            if not held and await again.record():
                log.warning("job %s was lost in a failover: recorded and queued again", job_id)
                await again.enqueue()
            elif not queued and await again.entry_lost():
                log.warning("job %s lost its queue entry in a failover: queued again", job_id)
                await again.enqueue()
        if time.monotonic() >= deadline:
            log.warning("no replica acknowledged %s in %.0fs: answered anyway", job_id, CONFIRM_FOR_S)
            return
        await asyncio.sleep(0.2)
