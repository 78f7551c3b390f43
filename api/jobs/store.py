"""The API's handle on jobs in Redis. It creates and enqueues jobs, reads events, ends, cancels and
purges. It also does what the reaper needs of running attempts.

Like arq's `Job`, this is exactly what the API may do to a job. Every write goes through the
contract's keys and Lua scripts.
"""

from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import replace

import anyio
import anyio.to_thread
import redis
import redis.asyncio as aredis
from redis.exceptions import RedisError

from api.jobs.acks import Confirms, RedoSteps, confirm_new_job
from api.jobs.indexes import ShardIndexes
from api.jobs.owners import (
    RECORD_GRACE_MS,
    Idempotency,
    IdempotencyConflict,
    MinuteUsage,
    OwnerLimit,
    OwnerRate,
    Owners,
    Quota,
    now_ms,
    this_minute,
)
from api.jobs.routing import Router
from api.jobs.state import STATE_FIELDS, JobState, RunningAttempt, Submission, Sweep, job_state, record_fields
from contract import entries, keys, queueing, tiers
from contract.entries import CANCELLED, Failed, Finished, Rows, as_text
from contract.jobspec import JobSpec
from contract.keys import JobField, JobStatus
from contract.lua import jobs, library, queues
from contract.prefixes import cache_scope, is_public
from contract.servers import Servers
from contract.settings import Recovery

log = logging.getLogger(__name__)


class JobStore:
    def __init__(
        self,
        servers: Servers[aredis.Redis],
        rq_servers: Servers[redis.Redis],
        *,
        queue_wait_s: float,
        recovery: Recovery,
        deadline_s: float = 0.0,
        router: Router | None = None,
        acks: Servers[Confirms] | None = None,
        cached_token_weight: float = 1.0,
        public_prompts: frozenset[str] = frozenset(),
    ) -> None:
        self._q = servers.queues
        # the job's own keys
        self._r = servers.streams
        # RQ is synchronous: enqueueing runs in a worker thread
        self._rq = rq_servers
        self.queue_wait_s = queue_wait_s
        self.deadline_s = deadline_s
        self.recovery = recovery
        self._end = self._r.register_script(jobs.END)
        self._end_if_late = self._r.register_script(jobs.END_IF_LATE)
        self._record_script = self._r.register_script(jobs.RECORD)
        self._public = public_prompts  # PUBLIC_PROMPTS_FILE's digests (contract/prefixes.py)
        self.owners = Owners(self._q, self._r, recovery.job_ttl_s, cached_token_weight)
        self._dead_batch = self._q.register_script(queues.DEAD_BATCH)
        self._indexes = ShardIndexes(self._r)
        self._router = router  # cache-aware routing of new interactive jobs (api/jobs/routing.py)
        self._acks = acks  # each server's: a new job survives a failover before it is answered for

    async def submit(
        self,
        spec: JobSpec,
        endpoint: str,
        created: int,
        *,
        owner: str = "",
        include_usage: bool = False,
        detached: bool = False,
        idempotency: Idempotency | None = None,
        quota: Quota | None = None,
        fields: dict[str, str] | None = None,
        start_by_ms: int | None = None,
        counted: bool = True,
        cache_salt: str | None = None,
    ) -> Submission:
        """Record the job and enqueue it. For a retried request (same Idempotency-Key, same
        request), return the job the first one made instead. Raises OwnerLimit or OwnerRate when the
        owner is over its `quota`. Without an owner there is no limit. Raises IdempotencyConflict
        for a key reused for another request. Checking the limits and recording the job is one
        atomic step. `fields` go into the job's hash too, such as JobField.ECHO and JobField.INPUT.
        JobField.KEEP_SPEC there keeps the request after the job's end. A job not started by
        `start_by_ms` ends with queue_timeout. By default that is QUEUE_WAIT_SECONDS from now. A job
        not `counted` is not among its owner's unfinished jobs. That is a batch line: its batch
        bounds it. The job reads and fills the prompt cache of its owner, or of its `cache_salt`."""
        scope = cache_scope(owner, cache_salt)
        spec = replace(spec, cache_scope=scope, public_prompt=bool(scope) and is_public(spec, self._public))
        state = JobState(
            id=spec.id,
            endpoint=endpoint,
            model=spec.model,
            created=created,
            owner=owner,
            status=JobStatus.QUEUED,
            start_by_ms=start_by_ms or now_ms() + int(self.queue_wait_s * 1000),
            include_usage=include_usage,
            detached=detached,
            echo=(fields or {}).get(JobField.ECHO, ""),
        )
        spec_json = json.dumps(spec.to_dict(), ensure_ascii=False)  # UTF-8: a third of the escapes' size
        deadline_ms = now_ms() + int(self.deadline_s * 1000) if self.deadline_s > 0 else None
        key = idempotency.key if idempotency else None
        job_hash = {**record_fields(spec, spec_json, state, key, deadline_ms), **(fields or {})}
        # Charged for what it makes Redis keep, not for what was sent: the spec in the job's
        # hash and in RQ's record, and what its endpoint records (a response's history, say).
        stored = 2 * len(spec_json.encode()) + sum(len(v.encode()) for v in (fields or {}).values())
        quota = replace(quota, request_bytes=max(quota.request_bytes, stored)) if owner and quota else Quota()
        for _ in range(2):  # a second time if the key named a job that has since expired
            verdict = await self.owners.admit(spec.id, owner, idempotency, quota, counted)
            if verdict[0] == b"limit" and await self.owners.forget_ended(owner):
                verdict = await self.owners.admit(spec.id, owner, idempotency, quota, counted)
            if verdict[:2] == [b"rate", b"tokens"] and await self.owners.settle_ended(owner):
                verdict = await self.owners.admit(spec.id, owner, idempotency, quota, counted)
            if verdict[0] == b"new":
                try:
                    await self._record(spec.id, job_hash)
                except BaseException:
                    await self.owners.take_back(spec.id, owner, idempotency)
                    raise
                await self._enqueue(
                    spec, keep_on_failure=idempotency is not None, routed=counted, owner=owner
                )
                await self._confirm(spec, job_hash, routed=counted)
                return Submission(
                    state, new=True, spent=MinuteUsage(this_minute(), int(verdict[1]), int(verdict[2]))
                )
            if verdict[0] == b"limit":
                raise OwnerLimit(int(verdict[1]))
            if verdict[0] == b"rate":
                raise OwnerRate(as_text(verdict[1]), int(verdict[2]), int(verdict[3]))
            assert idempotency is not None
            held = await self.idempotent(idempotency)  # the key names a job (or did, a moment ago)
            if held is not None:
                return Submission(held, new=False)
        raise IdempotencyConflict(spec.id)  # the key was taken twice in a row: let the client retry

    async def idempotent(self, idempotency: Idempotency) -> JobState | None:
        """The job an earlier request with this Idempotency-Key made, if it still exists. Raises
        IdempotencyConflict if that request was another one."""
        holding = await self.owners.holding(idempotency)
        return await self._held(idempotency, holding) if holding is not None else None

    async def _held(self, idempotency: Idempotency, holding: tuple[str, int]) -> JobState | None:
        """The job an idempotency key holds, or None. A key whose job has expired is freed: a key
        lives as long as its job. So is a key whose job was never recorded because its API died. A
        job admitted moments ago may be on its way to its record, so it is waited for."""
        held, age_ms = holding
        held_id, _, held_digest = held.partition(" ")
        if held_digest != idempotency.digest:
            raise IdempotencyConflict(held_id)
        while (job := await self.state(held_id)) is None and age_ms < RECORD_GRACE_MS:
            await anyio.sleep(0.05)
            age_ms += 50
        if job is None:
            await self.owners.free(idempotency, held)
        return job

    async def _record(self, job_id: str, job_hash: dict[str, str | int]) -> bool:
        """RECORD the job with its hash; False if it was there already."""
        made = await self._record_script(
            keys=[keys.job(job_id), keys.pending(keys.shard(job_id))],
            args=[job_id, self.recovery.job_ttl_s, *(str(x) for pair in job_hash.items() for x in pair)],
        )
        return bool(made)

    async def _confirm(self, spec: JobSpec, job_hash: dict[str, str | int], routed: bool) -> None:
        """Return once a replica holds the new job. If a failover lost it, it is recorded and queued
        again on the primary there is now. See api/jobs/acks.py `confirm_new_job`."""
        if self._acks is None:
            return
        again = RedoSteps(
            record=lambda: self._record(spec.id, job_hash),
            entry_lost=lambda: self._entry_lost(spec.id),
            enqueue=lambda: self._enqueue(spec, True, routed, str(job_hash.get(JobField.OWNER, ""))),
        )
        await confirm_new_job(self._acks, spec.id, again)

    async def _entry_lost(self, job_id: str) -> bool:
        """The job waits to start, but the queues server has no RQ record of it. A worker deletes
        that record only after its claim has marked the job running."""
        if await self._r.hget(keys.job(job_id), JobField.STATUS) != JobStatus.QUEUED.encode():
            return False
        record = keys.rq_job(keys.rq_job_id(job_id, 0))
        return not await anyio.to_thread.run_sync(self._rq.queues.exists, record)

    async def _enqueue(self, spec: JobSpec, keep_on_failure: bool, routed: bool, owner: str = "") -> None:
        """Put the new job on its queue. With `routed`, that is the routed queue of the worker
        holding its prompt's prefix, if one does (api/jobs/routing.py). If that fails, the job is
        deleted. But a retry with its Idempotency-Key may come back for such a job. Then it stays
        pending instead, and the reaper enqueues it once Redis answers again."""
        try:
            route = await self._router.route(spec, owner) if self._router and routed else None
            worker, deadline_ms = (route.worker, route.deadline_ms) if route else (None, 0)
            where = {"worker": worker, "deadline_ms": deadline_ms, "owner": owner}  # owner: for TAKE's turns
            await anyio.to_thread.run_sync(
                lambda: queueing.enqueue(self._rq, spec.to_dict(), 0, self.recovery, **where)
            )
        except BaseException:
            if not keep_on_failure:
                with anyio.CancelScope(shield=True), contextlib.suppress(RedisError):
                    await anyio.to_thread.run_sync(queueing.purge, self._rq, spec.id)
            raise

    async def whole(self, job_id: str) -> Rows:
        """Every entry of the job, from its first: what a whole answer is built from."""
        return await self.read(job_id, "0", count=100_000)

    async def read(self, job_id: str, after: str, count: int = 512, inclusive: bool = False) -> Rows:
        """Entries after stream id `after` ("0" for all), or from it with `inclusive`. Deltas come
        without their token ids: the API relays text."""
        start = "-" if after == "0" else after if inclusive else f"({after}"
        rows = await self._r.xrange(keys.events(job_id), min=start, max="+", count=count)
        return [(as_text(eid), entries.decode(fields, token_ids=False)) for eid, fields in rows]

    async def last_id(self, job_id: str) -> str | None:
        """The id of the job's newest entry (None: its stream has none)."""
        rows = await self._r.xrevrange(keys.events(job_id), count=1)
        return as_text(rows[0][0]) if rows else None

    async def state(self, job_id: str) -> JobState | None:
        return job_state(job_id, await self._r.hmget(keys.job(job_id), STATE_FIELDS))

    async def stored(self, job_id: str, name: str) -> str | None:
        """One field of the job's hash that its endpoint recorded (`submit`'s `fields`)."""
        value = await self._r.hget(keys.job(job_id), name)
        return None if value is None else as_text(value)

    async def keep(self, job_id: str) -> int:
        """A client is attached again. Withdraw a pending disconnect cancel, and note when (the ms
        returned). So a connection that arrived before and is found gone later cancels nothing."""
        async with self._r.pipeline(transaction=True) as pipe:
            pipe.hdel(keys.job(job_id), JobField.CANCEL_AT)
            pipe.hset(keys.job(job_id), JobField.KEPT_AT, kept := now_ms())
            await pipe.execute()
        return kept

    async def end(self, job_id: str, entry: Failed | Finished, only_if_status: str = "") -> bool:
        """End the job with a terminal entry unless it has ended already."""
        done = await self._end(
            keys=library.job_keys(job_id),
            args=jobs.end_args(job_id, entry, self.recovery.retention_s, only_if_status),
        )
        if done and only_if_status == JobStatus.QUEUED:
            await self._drop_rq_records(job_id)
        return bool(done)

    async def wait_on(self, job_id: str) -> float:
        """A requeued job the pool can still run waits `RESUME_WAIT_SECONDS` more. Its start
        deadline moves. A job claimed meanwhile does not read it. Returns the seconds."""
        wait_s = self.recovery.resume_wait_s
        await self._r.hset(keys.job(job_id), JobField.START_BY, now_ms() + int(wait_s * 1000))
        return wait_s

    async def end_if_late(self, job_id: str) -> bool:
        """End a queued job past its start deadline (see contract.lua.jobs.END_IF_LATE)."""
        done = await self._end_if_late(
            keys=library.job_keys(job_id),
            args=jobs.end_if_late_args(job_id, self.recovery.retention_s),
        )
        if done:
            await self._drop_rq_records(job_id)
        return bool(done)

    async def _drop_rq_records(self, job_id: str) -> None:
        """A job ended while queued: RQ's copy of its request goes now (contract.queueing). Its
        queued attempt is the one just before the epoch its end set. Earlier attempts' records went
        when workers took them. The job has ended either way. A failure here leaves a record a
        worker will skip, and is not the caller's error."""
        with contextlib.suppress(RedisError):
            model, epoch = await self._r.hmget(keys.job(job_id), [JobField.MODEL, JobField.EPOCH])
            ended = int(epoch or 0)  # ending fenced the queued attempt out: it is this one's predecessor
            async with self._q.pipeline(transaction=False) as pipe:
                queueing.drop_rq_records(
                    pipe,
                    job_id,
                    as_text(model) if model else None,
                    range(max(ended - 1, 0), ended + 2),
                )
                await pipe.execute()

    async def cancel(self, job_id: str, delay_s: float = 0.0, arrived_ms: int | None = None) -> None:
        """Stop the job. If it is still queued, it stops at once. Else the running attempt stops at
        its next token once `delay_s` has passed. `arrived_ms` is when a gone client's request came.
        That client cancels nothing if another attached after it came (`keep`)."""
        if arrived_ms is not None:
            kept = await self._r.hget(keys.job(job_id), JobField.KEPT_AT)
            if kept is not None and int(kept) > arrived_ms:
                return
        if delay_s <= 0:
            stopped = Finished(finish_reason=CANCELLED, prompt_tokens=0, completion_tokens=0)
            if await self.end(job_id, stopped, only_if_status=JobStatus.QUEUED):
                return
        job_key = keys.job(job_id)
        if await self._r.exists(job_key):
            await self._r.hset(job_key, JobField.CANCEL_AT, now_ms() + int(delay_s * 1000))

    async def purge(self, job_id: str) -> None:
        """Delete the job's data now, whatever its state (see contract.queueing.purge)."""
        await anyio.to_thread.run_sync(queueing.purge, self._rq, job_id)

    async def survey(self, pending_older_than_ms: int) -> Sweep:
        """The running attempts of every shard, and the jobs pending for longer than
        `pending_older_than_ms`. Stale index entries of ended jobs are dropped."""
        ids, pending = await self._indexes.read(now_ms() - pending_older_than_ms)
        if not ids:
            return Sweep([], pending)
        async with self._r.pipeline(transaction=False) as pipe:
            for job_id in ids:
                pipe.hmget(
                    keys.job(job_id), [JobField.EPOCH, JobField.WORKER, JobField.ENDED, JobField.SUSPECT]
                )
                pipe.exists(keys.alive(job_id))
            rows = await pipe.execute()
        running = []
        for i, job_id in enumerate(ids):
            (epoch, worker, ended, suspect), alive = rows[2 * i], rows[2 * i + 1]
            if epoch is None or ended == b"1":
                await self._r.zrem(keys.running(keys.shard(job_id)), job_id)
                continue
            attempt = RunningAttempt(job_id, int(epoch), as_text(worker or b""), bool(alive), suspect == b"1")
            running.append(attempt)
        return Sweep(running, pending)

    async def abandon(
        self, job_id: str, epoch: int, *, charge: bool, suspect_after: int, group: int = 0
    ) -> queueing.Abandonment:
        """Take the job from a dead attempt (see contract.queueing.abandon)."""
        return await anyio.to_thread.run_sync(
            lambda: queueing.abandon(
                self._rq,
                job_id,
                epoch,
                self.recovery,
                "crash",
                charge=charge,
                suspect_after=suspect_after,
                group=group,
            )
        )

    async def dead_batch(self, worker: str, holding: int, suspects: int) -> tuple[int, int]:
        """How many jobs, and how many uncleared suspects, a worker found dead held. It is the most
        seen in any tick of the last 15 s. Its attempts need not all be found dead in the same
        tick."""
        jobs, group = await self._dead_batch(
            keys=[keys.dead_worker(worker), keys.dead_suspects(worker)], args=[holding, suspects]
        )
        return int(jobs), int(group)

    async def rescue(self, job_id: str) -> bool:
        """Enqueue a job left pending (see contract.queueing.rescue)."""
        return await anyio.to_thread.run_sync(queueing.rescue, self._rq, job_id, self.recovery)

    async def return_inbox(self, worker: str) -> int:
        """Put back on their queues the jobs a dead worker took but never claimed. Returns how many
        went back. Those started or ended meanwhile are only dropped."""
        box = keys.inbox(worker)
        back = 0
        for raw in await self._q.hkeys(box):
            rq_job_id = as_text(raw)
            job_id = keys.job_of(rq_job_id)
            model, status, suspect, epoch, priority = await self._r.hmget(
                keys.job(job_id),
                [JobField.MODEL, JobField.STATUS, JobField.SUSPECT, JobField.EPOCH, JobField.PRIORITY],
            )
            current = model is not None and keys.rq_job_id(job_id, int(epoch or 0)) == rq_job_id
            async with self._q.pipeline(transaction=True) as pipe:
                if current and status == JobStatus.QUEUED.encode():
                    name = tiers.attempt_queue_name(
                        as_text(model),
                        as_text(priority or b"default"),
                        continuation=int(epoch or 0) > 0,
                        suspect=suspect == b"1",
                    )
                    pipe.lpush(keys.rq_queue_key(name), rq_job_id)  # first: it was taken first
                    pipe.lpush(keys.wake(as_text(model)), 1)
                    back += 1
                pipe.hdel(box, rq_job_id)
                await pipe.execute()
        return back
