"""What one API key's owner holds and spends, kept on the queues server. That is its
unfinished jobs (MAX_JOBS_PER_KEY), its request rate, byte and token budgets, and its
Idempotency-Keys.

A job is counted against its owner first (contract.lua.accounting.ADMIT). Then the job store
records it on the streams server (RECORD). Two servers take two steps. An API process may
die in between. What it leaves behind is dropped later. The count goes when the owner next
reaches its limit (`forget_ended`). The idempotency key goes when a retry finds no job
behind it after `RECORD_GRACE_MS` (api/jobs/store.py).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import anyio
import redis.asyncio as aredis
from redis.exceptions import RedisError

from api.http.ratelimits import Budgets
from contract import keys
from contract.entries import Failed, Finished, as_text, decode
from contract.keys import JobField
from contract.lua import accounting, queues

RECORD_GRACE_MS = 10_000
"""An owner's job admitted this long ago and still not recorded will never be: its API died
in between."""


def now_ms() -> int:
    return int(time.time() * 1000)


def this_minute() -> int:
    """The minute since the epoch: the per-minute budgets' window."""
    return int(time.time() // 60)


@dataclass(frozen=True)
class Idempotency:
    """A request's Idempotency-Key, as one owner's key of one request."""

    # contract.keys.idempotency(owner, sha256 of the header)
    key: str
    # the request's own digest: a retry must carry the same request
    digest: str

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
    """The owner is over its request rate, byte or token budget this minute."""

    def __init__(self, what: str, requests: int = 0, tokens: int = 0) -> None:
        super().__init__(what)
        # "requests", "bytes" or "tokens"
        self.what = what
        # counted this minute
        self.requests, self.tokens = requests, tokens


@dataclass(frozen=True)
class Quota:
    """An owner's limits, checked and counted in one step (0: no limit)."""

    unfinished_jobs: int = 0
    # per minute: requests, bytes, tokens
    budgets: Budgets = field(default_factory=Budgets)
    # what this request counts against the byte budget
    request_bytes: int = 0
    # what this job reserves: its prompt's bound and its max_tokens
    tokens: int = 0
    # the prompt's bound among them (api/jobs/reservation.py)
    prompt_tokens: int = 0

    @property
    def limited(self) -> bool:
        return bool(self.unfinished_jobs) or self.budgets != Budgets()


@dataclass(frozen=True)
class MinuteUsage:
    """An owner's counts this minute once a job was admitted (for the rate-limit headers)."""

    minute: int
    requests: int
    tokens: int


class Owners:
    def __init__(
        self, queues: aredis.Redis, streams: aredis.Redis, job_ttl_s: int, cached_token_weight: float = 1.0
    ) -> None:
        self._q = queues
        # read only: which of an owner's jobs have ended
        self._streams = streams
        self._job_ttl_s = job_ttl_s
        # CACHED_TOKEN_WEIGHT
        self._cached_weight = cached_token_weight
        self._admit = queues.register_script(accounting.ADMIT)
        self._settle = queues.register_script(accounting.SETTLE)

    async def admit(
        self, job_id: str, owner: str, idempotency: Idempotency | None, quota: Quota, counted: bool
    ) -> list:
        """Count the job against its owner (contract.lua.accounting.ADMIT: its reply).
        Without an owner's limits or an Idempotency-Key there is nothing to check, and no
        round trip."""
        limited = owner and quota.limited
        if not limited and idempotency is None:
            return [b"new", 0, 0]
        minute = this_minute()
        unfinished = keys.owned(owner, keys.OwnerIndex.JOBS)
        return await self._admit(
            keys=[
                unfinished,
                idempotency.key if idempotency else unfinished,
                keys.requests_per_minute(owner, minute) if owner else unfinished,
                keys.bytes_per_minute(owner, minute) if owner else unfinished,
                keys.tokens_per_minute(owner, minute) if owner else unfinished,
                keys.owned(owner, keys.OwnerIndex.RESERVED_TOKENS) if owner else unfinished,
            ],
            args=[
                job_id,
                idempotency.holding(job_id) if idempotency else "",
                self._job_ttl_s,
                quota.unfinished_jobs,
                quota.budgets.requests_per_minute,
                quota.budgets.bytes_per_minute,
                quota.request_bytes,
                "1" if owner and counted and quota.unfinished_jobs else "0",
                quota.budgets.tokens_per_minute if owner else 0,
                quota.tokens,
                quota.prompt_tokens,
                minute,
            ],
        )

    async def take_back(self, job_id: str, owner: str, idempotency: Idempotency | None) -> None:
        """Undo an `admit` whose job could not be recorded. This is best effort: what stays
        is dropped later, as after a crash."""
        with anyio.CancelScope(shield=True), contextlib.suppress(RedisError, OSError):
            await self._q.zrem(keys.owned(owner, keys.OwnerIndex.JOBS), job_id)
            if idempotency:
                await self.free(idempotency, idempotency.holding(job_id))

    async def forget_ended(self, owner: str) -> int:
        """Drop from the owner's unfinished jobs those that have ended, expired, or were
        admitted but never recorded. Returns how many went."""
        index = keys.owned(owner, keys.OwnerIndex.JOBS)
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

    async def settle(self, owner: str, job_id: str, end: Finished | Failed | None) -> int:
        """Charge an ended job's owner what it used in place of what it reserved. This
        happens once. Returns the tokens charged, or -1 when there was nothing to settle. If
        `end` is a Failed, its prompt's bound is charged. If it is None (the job is gone),
        its whole reservation is."""
        return (await self._settle_all(owner, [(job_id, end)]))[0]

    async def settle_ended(self, owner: str) -> int:
        """Settle the owner's reservations whose jobs have ended or have gone. Their API
        never read the end: the client went away. Returns how many."""
        reserved = await self._q.hgetall(keys.owned(owner, keys.OwnerIndex.RESERVED_TOKENS))
        if not reserved:
            return 0
        ids = [as_text(job_id) for job_id in reserved]
        async with self._streams.pipeline(transaction=False) as pipe:
            for job_id in ids:
                pipe.exists(keys.job(job_id))
                pipe.xrevrange(keys.events(job_id), count=1)
            rows = await pipe.execute()
        ended = []
        for i, job_id in enumerate(ids):
            exists, last = rows[2 * i], rows[2 * i + 1]
            end = decode(last[0][1]) if last else None
            # else still running
            if not exists or isinstance(end, Finished | Failed):
                ended.append((job_id, end if isinstance(end, Finished | Failed) else None))
        return sum(charged >= 0 for charged in await self._settle_all(owner, ended)) if ended else 0

    async def _settle_all(self, owner: str, ends: list[tuple[str, Finished | Failed | None]]) -> list[int]:
        """SETTLE each (job id, end), in one round trip."""
        minute = this_minute()
        counts = [keys.owned(owner, keys.OwnerIndex.RESERVED_TOKENS), keys.tokens_per_minute(owner, minute)]
        async with self._q.pipeline(transaction=False) as pipe:
            for job_id, end in ends:
                await self._settle(keys=counts, args=[job_id, minute, self._used(end)], client=pipe)
            return [int(charged) for charged in await pipe.execute()]

    def _used(self, end: Finished | Failed | None) -> str:
        """SETTLE's charge for an end. For a finish, it is its usage (a cached prompt token
        weighs CACHED_TOKEN_WEIGHT). For a failure it is '' (the prompt's bound). For a gone
        job it is '-' (the whole reservation)."""
        if isinstance(end, Finished):
            cached = min(end.cached_tokens, end.prompt_tokens)
            prompt = end.prompt_tokens - cached + round(cached * self._cached_weight)
            return str(prompt + end.completion_tokens)
        return "" if isinstance(end, Failed) else "-"

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
