"""The API's handle on jobs in Redis: create and enqueue, read events, end, cancel.

Like arq's `Job`, this is exactly what the API may do to a job; every write goes through the
contract's keys and Lua scripts.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Sequence

import anyio.to_thread
import redis
import redis.asyncio as aredis
from redis.exceptions import RedisError
from rq import Queue
from rq.serializers import JSONSerializer

from contract import entries, keys, scripts
from contract.entries import Entry, Failed
from contract.jobspec import JobSpec
from contract.keys import JobField, JobStatus


def _ms() -> int:
    return int(time.time() * 1000)


class JobStore:
    def __init__(
        self,
        client: aredis.Redis,
        rq_client: redis.Redis,
        *,
        retention_s: int,
        job_ttl_s: int,
        job_timeout_s: int,
        queue_wait_s: float,
        worker_stale_s: float,
    ) -> None:
        self._r = client
        self._rq = rq_client  # RQ is synchronous: enqueue runs in a worker thread
        self.retention_s = retention_s
        self._job_ttl = job_ttl_s
        self._job_timeout = job_timeout_s
        self.queue_wait_s = queue_wait_s
        self._stale_ms = int(worker_stale_s * 1000)
        self._end = client.register_script(scripts.END)

    async def submit(self, spec: JobSpec, created: int) -> None:
        """Record the job, then enqueue it; if enqueueing fails, nothing is left behind."""
        job_key = keys.job(spec.id)
        start_by = _ms() + int(self.queue_wait_s * 1000)
        async with self._r.pipeline(transaction=True) as pipe:
            pipe.hset(
                job_key,
                mapping={
                    JobField.MODEL: spec.model,
                    JobField.KIND: spec.kind,
                    JobField.CREATED: created,
                    JobField.STATUS: JobStatus.QUEUED,
                    JobField.EPOCH: 0,
                    JobField.START_BY: start_by,
                    JobField.SPEC: json.dumps(spec.to_dict()),
                },
            )
            pipe.expire(job_key, self._job_ttl)
            await pipe.execute()
        try:
            await anyio.to_thread.run_sync(self._enqueue, spec)
        except BaseException:
            with anyio.CancelScope(shield=True), contextlib.suppress(RedisError):
                await self._r.delete(job_key)
            raise

    def _enqueue(self, spec: JobSpec) -> None:
        queue = Queue(keys.queue_name(spec.model), connection=self._rq, serializer=JSONSerializer)
        queue.enqueue_call(
            func=keys.JOB_FUNCTION,
            args=(spec.to_dict(),),
            job_id=spec.id,
            timeout=self._job_timeout,
            ttl=self._job_ttl,
            result_ttl=self.retention_s,
            failure_ttl=self.retention_s,
            description=f"completion {spec.id}",
        )

    async def read(self, completion_id: str, after: str, count: int = 512) -> list[tuple[str, Entry]]:
        """Entries strictly after stream id `after` ("0" for all)."""
        start = "-" if after == "0" else f"({after}"
        rows = await self._r.xrange(keys.events(completion_id), min=start, max="+", count=count)
        return [(_text(eid), entries.decode(fields)) for eid, fields in rows]

    async def status(self, completion_id: str) -> str | None:
        value = await self._r.hget(keys.job(completion_id), JobField.STATUS)
        return _text(value) if value is not None else None

    async def end(self, completion_id: str, error: Failed, only_if_status: str = "") -> bool:
        """End the job with an error unless it has ended already."""
        done = await self._end(
            keys=[keys.job(completion_id), keys.events(completion_id)],
            args=scripts.end_args(error, self.retention_s, only_if_status),
        )
        return bool(done)

    async def cancel_after(self, completion_id: str, delay_s: float) -> None:
        """Ask the job to stop once `delay_s` has passed (0: at its next token)."""
        job_key = keys.job(completion_id)
        if await self._r.exists(job_key):
            await self._r.hset(job_key, JobField.CANCEL_AT, _ms() + int(delay_s * 1000))

    async def live_models(self, models: Sequence[str] | None = None) -> dict[str, int]:
        """Model -> number of workers that announced it recently."""
        if models is None:
            models = sorted(_text(m) for m in await self._r.smembers(keys.MODELS))
        since = _ms() - self._stale_ms
        async with self._r.pipeline(transaction=False) as pipe:
            for model in models:
                pipe.zcount(keys.workers(model), since, "+inf")
            counts = await pipe.execute()
        return {m: int(c) for m, c in zip(models, counts, strict=False) if c}


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
