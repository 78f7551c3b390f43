"""The API's handle on jobs in Redis: create and enqueue, read events, end, cancel, and the
reaper's view of running attempts.

Like arq's `Job`, this is exactly what the API may do to a job; every write goes through the
contract's keys and Lua scripts.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass

import anyio
import anyio.to_thread
import redis
import redis.asyncio as aredis
from redis.exceptions import RedisError
from rq import Queue

from contract import entries, keys, queueing, scripts
from contract.entries import Entry, Failed, Finished
from contract.jobspec import JobSpec
from contract.keys import JobField, JobStatus
from contract.queueing import Recovery


def _ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class JobState:
    status: str
    kind: str
    attempts: int
    start_by_ms: int | None
    ended: bool
    model: str = ""
    created: int = 0
    owner: str = ""
    include_usage: bool = False
    detached: bool = False


class JobStore:
    def __init__(
        self,
        client: aredis.Redis,
        rq_client: redis.Redis,
        *,
        queue_wait_s: float,
        worker_stale_s: float,
        recovery: Recovery,
        deadline_s: float = 0.0,
    ) -> None:
        self._r = client
        self._rq = rq_client  # RQ is synchronous: enqueueing runs in a worker thread
        self.retention_s = recovery.retention_s
        self.queue_wait_s = queue_wait_s
        self.deadline_s = deadline_s
        self._stale_ms = int(worker_stale_s * 1000)
        self.recovery = recovery
        self._end = client.register_script(scripts.END)

    async def submit(
        self,
        spec: JobSpec,
        created: int,
        *,
        owner: str = "",
        include_usage: bool = False,
        detached: bool = False,
    ) -> None:
        """Record the job, then enqueue it; if enqueueing fails, nothing is left behind."""
        job_key = keys.job(spec.id)
        start_by = _ms() + int(self.queue_wait_s * 1000)
        extra = {JobField.DEADLINE: _ms() + int(self.deadline_s * 1000)} if self.deadline_s > 0 else {}
        async with self._r.pipeline(transaction=True) as pipe:
            pipe.hset(
                job_key,
                mapping={
                    **extra,
                    JobField.MODEL: spec.model,
                    JobField.KIND: spec.kind,
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
                pipe.zadd(keys.owner_jobs(owner), {spec.id: _ms()})
                pipe.expire(keys.owner_jobs(owner), self.recovery.job_ttl_s)
            await pipe.execute()
        try:
            await anyio.to_thread.run_sync(self._enqueue, spec.to_dict(), spec.id)
        except BaseException:
            with anyio.CancelScope(shield=True), contextlib.suppress(RedisError):
                await self._r.delete(job_key)
            raise

    def _enqueue(self, spec: dict, job_id: str) -> None:
        queueing.enqueue(self._rq, spec, job_id, self.recovery)

    async def read(
        self, completion_id: str, after: str, count: int = 512, inclusive: bool = False
    ) -> list[tuple[str, Entry]]:
        """Entries after stream id `after` ("0" for all), or from it with `inclusive`; deltas
        without their token ids (the API relays text)."""
        start = "-" if after == "0" else after if inclusive else f"({after}"
        rows = await self._r.xrange(keys.events(completion_id), min=start, max="+", count=count)
        return [(_text(eid), entries.decode(fields, token_ids=False)) for eid, fields in rows]

    async def state(self, completion_id: str) -> JobState | None:
        fields = [
            JobField.STATUS,
            JobField.KIND,
            JobField.ATTEMPTS,
            JobField.START_BY,
            JobField.ENDED,
            JobField.MODEL,
            JobField.CREATED,
            JobField.OWNER,
            JobField.USAGE,
            JobField.DETACHED,
        ]
        values = await self._r.hmget(keys.job(completion_id), fields)
        status, kind, attempts, start_by, ended, model, created, owner, usage, detached = values
        if status is None:
            return None
        return JobState(
            status=_text(status),
            kind=_text(kind or b""),
            attempts=int(attempts or 0),
            start_by_ms=int(start_by) if start_by else None,
            ended=ended == b"1",
            model=_text(model or b""),
            created=int(created or 0),
            owner=_text(owner or b""),
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
            args=scripts.end_args(completion_id, entry, self.retention_s, only_if_status),
        )
        return bool(done)

    async def end_if_late(self, completion_id: str) -> bool:
        """A queued job past its start deadline ends: queue_timeout, or worker_lost if an
        earlier attempt ran. Returns True if the job is (now) late and ended."""
        state = await self.state(completion_id)
        if state is None or state.status != JobStatus.QUEUED or state.start_by_ms is None:
            return False
        if _ms() <= state.start_by_ms:
            return False
        await self.end(completion_id, scripts.late_error(state.attempts), only_if_status=JobStatus.QUEUED)
        return True

    async def cancel(self, completion_id: str, delay_s: float = 0.0) -> None:
        """Stop the job: at once if it is still queued, else at the running attempt's next
        token once `delay_s` has passed."""
        if delay_s <= 0:
            stopped = Finished(epoch=0, finish_reason="stop", prompt_tokens=0, completion_tokens=0)
            if await self.end(completion_id, stopped, only_if_status=JobStatus.QUEUED):
                return
        job_key = keys.job(completion_id)
        if await self._r.exists(job_key):
            await self._r.hset(job_key, JobField.CANCEL_AT, _ms() + int(delay_s * 1000))

    async def purge(self, completion_id: str, attempts: int) -> None:
        """Delete the job's data now, whatever its state (see contract.queueing.purge)."""
        await anyio.to_thread.run_sync(queueing.purge, self._rq, completion_id, attempts)

    async def live_models(self, models: Sequence[str] | None = None) -> dict[str, int]:
        """Model -> number of workers that announced it recently."""
        if models is None:
            models = sorted(_text(m) for m in await self._r.smembers(keys.MODELS))
        since = _ms() - self._stale_ms
        async with self._r.pipeline(transaction=False) as pipe:
            for model in models:
                pipe.zcount(keys.workers(model), since, "+inf")
            counts = await pipe.execute()
        return {m: int(c) for m, c in zip(models, counts, strict=True) if c}

    async def slots(self, models: Sequence[str]) -> dict[str, int]:
        """Model -> jobs its live workers can run at once: their announced SLOTS, summed."""
        since = _ms() - self._stale_ms
        async with self._r.pipeline(transaction=False) as pipe:
            for model in models:
                pipe.zrangebyscore(keys.workers(model), since, "+inf")
            live = await pipe.execute()
        served = [(m, names) for m, names in zip(models, live, strict=True) if names]
        async with self._r.pipeline(transaction=False) as pipe:
            for model, names in served:
                pipe.hmget(keys.worker_slots(model), names)
            counts = await pipe.execute() if served else []
        total = {m: sum(int(c) for c in cs if c) for (m, _), cs in zip(served, counts, strict=True)}
        return {m: total.get(m, 0) for m in models}

    async def forget_silent_workers(self) -> None:
        """Drop the workers that stopped announcing (a killed one never says goodbye), so
        that their entries do not pile up; one that comes back announces itself again."""
        models = [_text(m) for m in await self._r.smembers(keys.MODELS)]
        before = _ms() - self._stale_ms
        async with self._r.pipeline(transaction=False) as pipe:
            for model in models:
                pipe.zrangebyscore(keys.workers(model), "-inf", f"({before}")
            silent = await pipe.execute()
        async with self._r.pipeline(transaction=False) as pipe:
            for model, names in zip(models, silent, strict=True):
                if names:
                    # by score, not by name: an announcement made meanwhile stays (its
                    # slots come back with the next one)
                    pipe.zremrangebyscore(keys.workers(model), "-inf", f"({before}")
                    pipe.hdel(keys.worker_slots(model), *names)
            await pipe.execute()

    async def unfinished(self, owner: str) -> int:
        """How many jobs this key created have not ended (pruning those that have)."""
        ids = await self._r.zrange(keys.owner_jobs(owner), 0, -1)
        if not ids:
            return 0
        async with self._r.pipeline(transaction=False) as pipe:
            for cid in ids:
                pipe.hmget(keys.job(_text(cid)), [JobField.STATUS, JobField.ENDED])
            rows = await pipe.execute()
        # gone (no status: expired or purged) or ended
        done = [cid for cid, (status, ended) in zip(ids, rows, strict=True) if not status or ended == b"1"]
        if done:
            await self._r.zrem(keys.owner_jobs(owner), *done)
        return len(ids) - len(done)

    async def admission_view(self, model: str) -> tuple[int, int]:
        """(live workers, jobs waiting) for one model, in one round trip."""
        async with self._r.pipeline(transaction=False) as pipe:
            pipe.zcount(keys.workers(model), _ms() - self._stale_ms, "+inf")
            pipe.llen(queue_key(model))
            workers, depth = await pipe.execute()
        return int(workers), int(depth)

    async def queue_depths(self, models: Sequence[str]) -> dict[str, int]:
        """Model -> jobs waiting in its RQ queue (not yet taken by a worker)."""
        async with self._r.pipeline(transaction=False) as pipe:
            for model in models:
                pipe.llen(queue_key(model))
            counts = await pipe.execute()
        return dict(zip(models, (int(c) for c in counts), strict=True))

    async def in_flight(self) -> dict[str, int]:
        """Model -> attempts running now."""
        ids = await self._r.zrange(keys.RUNNING, 0, -1)
        if not ids:
            return {}
        async with self._r.pipeline(transaction=False) as pipe:
            for cid in ids:
                pipe.hget(keys.job(_text(cid)), JobField.MODEL)
            models = await pipe.execute()
        out: dict[str, int] = {}
        for model in models:
            if model is not None:
                out[_text(model)] = out.get(_text(model), 0) + 1
        return out

    async def stats(self) -> dict[str, int]:
        """The cluster-wide counters (contract.keys.STATS)."""
        return {_text(k): int(v) for k, v in (await self._r.hgetall(keys.STATS)).items()}

    # --- the reaper's view ---

    async def running(self) -> list[tuple[str, int, str, bool]]:
        """Running attempts: (completion id, epoch, worker name, heartbeat alive)."""
        ids = [_text(i) for i in await self._r.zrange(keys.RUNNING, 0, -1)]
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
                await self._r.zrem(keys.RUNNING, cid)  # a stale index entry
                continue
            out.append((cid, int(epoch), _text(worker or b""), bool(alive)))
        return out

    async def abandon(self, completion_id: str, epoch: int) -> int:
        """Take the job from a dead attempt (see contract.queueing.abandon)."""
        return await anyio.to_thread.run_sync(
            queueing.abandon, self._rq, completion_id, epoch, self.recovery, "crash"
        )


def queue_key(model: str) -> str:
    """The Redis list of a model's waiting jobs (RQ's key, honouring RQ_KEY_PREFIX)."""
    return Queue.redis_queue_namespace_prefix + keys.queue_name(model)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
