"""The API's handle on jobs in Redis: create and enqueue, read events, end, cancel, purge, and
what the reaper needs of running attempts.

Like arq's `Job`, this is exactly what the API may do to a job; every write goes through the
contract's keys and Lua scripts.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass

import anyio
import anyio.to_thread
import redis
import redis.asyncio as aredis
from redis.exceptions import RedisError

from contract import entries, keys, queueing, scripts
from contract.entries import CANCELLED, Entry, Failed, Finished, as_text
from contract.jobspec import JobSpec
from contract.keys import JobField, JobStatus
from contract.settings import Recovery

Rows = list[tuple[str, Entry]]


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class JobState:
    """What the API knows of a job from its hash."""

    id: str
    surface: str
    model: str
    created: int
    owner: str
    status: str
    attempts: int = 0
    start_by_ms: int | None = None
    include_usage: bool = False
    detached: bool = False

    @property
    def ended(self) -> bool:
        return self.status in JobStatus.ENDED


@dataclass(frozen=True)
class RunningAttempt:
    """A running attempt as the reaper judges it."""

    completion_id: str
    epoch: int
    worker: str
    beating: bool  # its heartbeat key is alive


_STATE_FIELDS = [
    JobField.SURFACE,
    JobField.MODEL,
    JobField.CREATED,
    JobField.OWNER,
    JobField.STATUS,
    JobField.ATTEMPTS,
    JobField.START_BY,
    JobField.USAGE,
    JobField.DETACHED,
]


class JobStore:
    def __init__(
        self,
        client: aredis.Redis,
        rq_client: redis.Redis,
        *,
        queue_wait_s: float,
        recovery: Recovery,
        deadline_s: float = 0.0,
    ) -> None:
        self._r = client
        self._rq = rq_client  # RQ is synchronous: enqueueing runs in a worker thread
        self.queue_wait_s = queue_wait_s
        self.deadline_s = deadline_s
        self.recovery = recovery
        self._end = client.register_script(scripts.END)
        self._end_if_late = client.register_script(scripts.END_IF_LATE)

    async def submit(
        self,
        spec: JobSpec,
        surface: str,
        created: int,
        *,
        owner: str = "",
        include_usage: bool = False,
        detached: bool = False,
    ) -> JobState:
        """Record the job, then enqueue it; if enqueueing fails, nothing is left behind."""
        job_key = keys.job(spec.id)
        start_by = now_ms() + int(self.queue_wait_s * 1000)
        state = JobState(
            id=spec.id,
            surface=surface,
            model=spec.model,
            created=created,
            owner=owner,
            status=JobStatus.QUEUED,
            start_by_ms=start_by,
            include_usage=include_usage,
            detached=detached,
        )
        extra = {JobField.DEADLINE: now_ms() + int(self.deadline_s * 1000)} if self.deadline_s > 0 else {}
        async with self._r.pipeline(transaction=True) as pipe:
            pipe.hset(
                job_key,
                mapping={
                    **extra,
                    JobField.MODEL: spec.model,
                    JobField.SURFACE: surface,
                    JobField.CREATED: created,
                    JobField.STATUS: JobStatus.QUEUED,
                    JobField.EPOCH: 0,
                    JobField.ATTEMPTS: 0,
                    JobField.START_BY: start_by,
                    JobField.SPEC: json.dumps(spec.to_dict()),
                    JobField.OWNER: owner,
                    JobField.USAGE: int(include_usage),
                    JobField.DETACHED: int(detached),
                },
            )
            pipe.expire(job_key, self.recovery.job_ttl_s)
            if owner:
                pipe.zadd(keys.owner_jobs(owner), {spec.id: now_ms()})
                pipe.expire(keys.owner_jobs(owner), self.recovery.job_ttl_s)
            await pipe.execute()
        try:
            await anyio.to_thread.run_sync(queueing.enqueue, self._rq, spec.to_dict(), spec.id, self.recovery)
        except BaseException:
            with anyio.CancelScope(shield=True), contextlib.suppress(RedisError):
                await self._r.delete(job_key)
            raise
        return state

    async def read(self, completion_id: str, after: str, count: int = 512, inclusive: bool = False) -> Rows:
        """Entries after stream id `after` ("0" for all), or from it with `inclusive`; deltas
        without their token ids (the API relays text)."""
        start = "-" if after == "0" else after if inclusive else f"({after}"
        rows = await self._r.xrange(keys.events(completion_id), min=start, max="+", count=count)
        return [(as_text(eid), entries.decode(fields, token_ids=False)) for eid, fields in rows]

    async def state(self, completion_id: str) -> JobState | None:
        values = await self._r.hmget(keys.job(completion_id), _STATE_FIELDS)
        surface, model, created, owner, status, attempts, start_by, usage, detached = values
        if status is None:
            return None
        return JobState(
            id=completion_id,
            surface=as_text(surface or b""),
            model=as_text(model or b""),
            created=int(created or 0),
            owner=as_text(owner or b""),
            status=as_text(status),
            attempts=int(attempts or 0),
            start_by_ms=int(start_by) if start_by else None,
            include_usage=usage == b"1",
            detached=detached == b"1",
        )

    async def keep(self, completion_id: str) -> None:
        """A client is attached again: withdraw a pending disconnect cancel."""
        await self._r.hdel(keys.job(completion_id), JobField.CANCEL_AT)

    async def end(self, completion_id: str, entry: Failed | Finished, only_if_status: str = "") -> bool:
        """End the job with a terminal entry unless it has ended already."""
        done = await self._end(
            keys=scripts.job_keys(completion_id),
            args=scripts.end_args(completion_id, entry, self.recovery.retention_s, only_if_status),
        )
        return bool(done)

    async def end_if_late(self, completion_id: str) -> bool:
        """End a queued job past its start deadline (see contract.scripts.END_IF_LATE)."""
        done = await self._end_if_late(
            keys=scripts.job_keys(completion_id),
            args=scripts.end_if_late_args(completion_id, self.recovery.retention_s),
        )
        return bool(done)

    async def cancel(self, completion_id: str, delay_s: float = 0.0) -> None:
        """Stop the job: at once if it is still queued, else at the running attempt's next
        token once `delay_s` has passed."""
        if delay_s <= 0:
            stopped = Finished(finish_reason=CANCELLED, prompt_tokens=0, completion_tokens=0)
            if await self.end(completion_id, stopped, only_if_status=JobStatus.QUEUED):
                return
        job_key = keys.job(completion_id)
        if await self._r.exists(job_key):
            await self._r.hset(job_key, JobField.CANCEL_AT, now_ms() + int(delay_s * 1000))

    async def purge(self, completion_id: str, attempts: int) -> None:
        """Delete the job's data now, whatever its state (see contract.queueing.purge)."""
        await anyio.to_thread.run_sync(queueing.purge, self._rq, completion_id, attempts)

    async def running(self) -> list[RunningAttempt]:
        """The running attempts (stale index entries of ended jobs are dropped)."""
        ids = [as_text(i) for i in await self._r.zrange(keys.RUNNING, 0, -1)]
        if not ids:
            return []
        async with self._r.pipeline(transaction=False) as pipe:
            for cid in ids:
                pipe.hmget(keys.job(cid), [JobField.EPOCH, JobField.WORKER, JobField.ENDED])
                pipe.exists(keys.alive(cid))
            rows = await pipe.execute()
        out = []
        for i, cid in enumerate(ids):
            (epoch, worker, ended), alive = rows[2 * i], rows[2 * i + 1]
            if epoch is None or ended == b"1":
                await self._r.zrem(keys.RUNNING, cid)
                continue
            out.append(RunningAttempt(cid, int(epoch), as_text(worker or b""), bool(alive)))
        return out

    async def abandon(self, completion_id: str, epoch: int) -> int:
        """Take the job from a dead attempt (see contract.queueing.abandon)."""
        return await anyio.to_thread.run_sync(
            queueing.abandon, self._rq, completion_id, epoch, self.recovery, "crash"
        )
