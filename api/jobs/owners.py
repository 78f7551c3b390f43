"""What one API key's owner holds and spends, kept on the queues server: its unfinished jobs
(MAX_JOBS_PER_KEY), its request rate and byte budget, its Idempotency-Keys.

A job is counted against its owner (contract.lua.accounting.ADMIT) before the job store records it
on the streams server (RECORD): two servers, two steps. What an API process that dies in
between leaves behind is dropped later: the count when the owner next reaches its limit
(`forget_ended`), the idempotency key when a retry finds no job behind it after
`RECORD_GRACE_MS` (api/jobs/store.py).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import anyio
import redis.asyncio as aredis
from redis.exceptions import RedisError

from contract import keys
from contract.entries import as_text
from contract.keys import JobField
from contract.lua import accounting, queues

RECORD_GRACE_MS = 10_000
"""An owner's job admitted this long ago and still not recorded will never be: its API died
in between."""


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class Idempotency:
    """A request's Idempotency-Key, as one owner's key of one request."""

    key: str  # contract.keys.idempotency(owner, sha256 of the header)
    digest: str  # the request's own digest: a retry must carry the same request

    def holding(self, job_id: str) -> str:
        """What the key holds once it names the job `job_id`."""
        return f"{job_id} {self.digest}"


class IdempotencyConflict(Exception):
    """The Idempotency-Key was used before for a different request."""


class OwnerLimit(Exception):
    """The owner already has the most unfinished jobs allowed."""

    def __init__(self, unfinished: int) -> None:
        super().__init__(unfinished)
        self.unfinished = unfinished


class OwnerRate(Exception):
    """The owner is over its request rate or byte budget this minute."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what  # "requests" or "bytes"


@dataclass(frozen=True)
class Quota:
    """An owner's limits, checked and counted in one step (0: no limit)."""

    unfinished_jobs: int = 0
    requests_per_minute: int = 0
    bytes_per_minute: int = 0
    request_bytes: int = 0  # what this request counts against the byte budget


class Owners:
    def __init__(self, queues: aredis.Redis, streams: aredis.Redis, job_ttl_s: int) -> None:
        self._q = queues
        self._streams = streams  # read only: which of an owner's jobs have ended
        self._job_ttl_s = job_ttl_s
        self._admit = queues.register_script(accounting.ADMIT)

    async def admit(
        self, job_id: str, owner: str, idempotency: Idempotency | None, quota: Quota, counted: bool
    ) -> list:
        """Count the job against its owner (contract.lua.accounting.ADMIT: its reply). Without an
        owner's limits or an Idempotency-Key there is nothing to check: no round trip."""
        limited = owner and (quota.unfinished_jobs or quota.requests_per_minute or quota.bytes_per_minute)
        if not limited and idempotency is None:
            return [b"new"]
        minute = int(time.time() // 60)
        unfinished = keys.owned(owner, keys.Owned.JOBS)
        return await self._admit(
            keys=[
                unfinished,
                idempotency.key if idempotency else unfinished,
                keys.requests_per_minute(owner, minute) if owner else unfinished,
                keys.bytes_per_minute(owner, minute) if owner else unfinished,
            ],
            args=[
                job_id,
                idempotency.holding(job_id) if idempotency else "",
                self._job_ttl_s,
                quota.unfinished_jobs,
                quota.requests_per_minute,
                quota.bytes_per_minute,
                quota.request_bytes,
                "1" if owner and counted and quota.unfinished_jobs else "0",
            ],
        )

    async def take_back(self, job_id: str, owner: str, idempotency: Idempotency | None) -> None:
        """Undo an `admit` whose job could not be recorded (best effort: what stays is dropped
        later, as after a crash)."""
        with anyio.CancelScope(shield=True), contextlib.suppress(RedisError, OSError):
            await self._q.zrem(keys.owned(owner, keys.Owned.JOBS), job_id)
            if idempotency:
                await self.free(idempotency, idempotency.holding(job_id))

    async def forget_ended(self, owner: str) -> int:
        """Drop from the owner's unfinished jobs those that have ended, expired, or were
        admitted but never recorded; returns how many went."""
        index = keys.owned(owner, keys.Owned.JOBS)
        held = await self._q.zrange(index, 0, -1, withscores=True)
        if not held:
            return 0
        async with self._streams.pipeline(transaction=False) as pipe:
            for job_id, _ in held:
                pipe.hget(keys.job(as_text(job_id)), JobField.ENDED)
                pipe.exists(keys.job(as_text(job_id)))
            rows = await pipe.execute()
        recent = now_ms() - RECORD_GRACE_MS
        gone = [
            job_id
            for i, (job_id, admitted) in enumerate(held)
            if rows[2 * i] == b"1" or (not rows[2 * i + 1] and admitted < recent)
        ]
        return int(await self._q.zrem(index, *gone)) if gone else 0

    async def holding(self, idempotency: Idempotency) -> tuple[str, int] | None:
        """What the key holds ("<job id> <digest>") and how long ago it was set (ms),
        or None."""
        async with self._q.pipeline(transaction=False) as pipe:
            pipe.get(idempotency.key)
            pipe.pttl(idempotency.key)
            held, ttl_ms = await pipe.execute()
        return None if held is None else (as_text(held), self._job_ttl_s * 1000 - ttl_ms)

    async def free(self, idempotency: Idempotency, held: str) -> None:
        """Delete the key if it still holds `held`."""
        await self._q.eval(queues.DELETE_IF, 1, idempotency.key, held)
