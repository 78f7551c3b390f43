"""Drives the running batches: sends their lines as jobs, collects the answers, ends them.

Their files are written by api/batches/output.py. Every API process runs a driver. A Redis
lock lets one act at a time, as for the reaper. Each tick drives every batch not ended, each
on its own (`DRIVEN_AT_ONCE` at a time). So one batch's failure or slowness holds no other
back. A batch whose drive fails `MAX_FAILURES` times in a row stops sending lines. It ends
`failed`, with its unanswered lines in its error file. Should even that fail as often again,
it ends without files.

For each batch, the lines whose job has ended are answered. Each output line is written once,
counted once and charged to the batch's key (contract/lua/accounting.py `ANSWER`). Then lines
are sent as jobs, until BATCH_IN_FLIGHT of its lines are open. That happens only while the
batch runs and its key holds no more than FILES_BYTES_PER_KEY. A cancelled, expired or
failing batch has its open jobs cancelled instead. A batch with every line answered is
finalized. Status changes are compare-and-set: a cancel that lands meanwhile is never undone.

A line's job is an ordinary job of the endpoint it names, at `batch` tier. It is owned by the
batch's key, and crash-safe like any other. Its id is held by an idempotency key of the
driver's own. No client's Idempotency-Key can name it. So a driver that dies between sending
a line and recording it sends it again to the same job. A line the endpoint now refuses is
answered at once with its error.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging
import time

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import OutOfMemoryError, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from api.batches.lines import Line
from api.batches.output import abandon, finalize
from api.batches.routes import CHARGE_MARGIN_S, ENDED, BatchStatus, batch_hash, set_status
from api.endpoints.catalog import BATCHABLE, BY_NAME, EMBEDDINGS
from api.http.errors import APIError
from api.jobs.owners import Idempotency
from api.jobs.state import JobState
from api.services import Services
from api.tasks import Background, Leader, every
from contract import errors, keys, tiers
from contract.entries import Finished, as_text
from contract.keys import JobField
from contract.lua import accounting

log = logging.getLogger(__name__)

DRIVEN_AT_ONCE = 16
# Redis away or full: tried again
AWAY = (RedisConnectionError, RedisTimeoutError, OutOfMemoryError)
# drives failed in a row before the batch fails (and as many more: abandoned)
MAX_FAILURES = 5
OVER_QUOTA = (
    "This key holds more than FILES_BYTES_PER_KEY bytes of files and batch answers: the "
    "batch's remaining requests were not sent."
)


class BatchDriver:
    def __init__(self, services: Services) -> None:
        self._s = services
        self._leader = Leader(services.redis, keys.BATCH_DRIVER_LOCK)
        self._answer = services.redis.register_script(accounting.ANSWER)
        interval = services.settings.batches.batch_interval_s
        self._task = Background("batches", lambda: every(interval, self.tick, "batch driver"))

    def start(self) -> None:
        self._task.start()

    async def stop(self) -> None:
        await self._task.stop()

    async def tick(self) -> None:
        lock_ms = int(max(self._s.settings.batches.batch_interval_s * 10, 5.0) * 1000)
        if not await self._leader.held(lock_ms):
            return
        gate = asyncio.Semaphore(DRIVEN_AT_ONCE)

        async def one(batch_id: str) -> None:
            async with gate:
                await self.drive_guarded(batch_id)

        batches = [as_text(raw) for raw in await self._s.redis.zrange(keys.ACTIVE_BATCHES, 0, -1)]
        await asyncio.gather(*(one(b) for b in batches))

    async def drive_guarded(self, batch_id: str) -> None:
        """Drive one batch. A failure is counted against it. A lost (or full) Redis is
        nobody's fault. It ends the tick's drives, counted against none. A command Redis
        refuses (NOPERM under an ACL, a wrong type) is the batch's failure, and logged."""
        r = self._s.redis
        try:
            h = await self.drive(batch_id)
        except (*AWAY, OSError) as exc:
            log.debug("batch %s: Redis unavailable: %s", batch_id, exc)
            return
        except Exception as exc:
            log.exception("batch %s: drive failed", batch_id)
            why = f"The server could not run this batch ({type(exc).__name__})."
            try:
                failures = await r.hincrby(keys.batch(batch_id), "failures", 1)
                if failures == MAX_FAILURES:
                    await r.hset(keys.batch(batch_id), "failure", why)
                elif failures >= 2 * MAX_FAILURES:
                    owner = as_text(await r.hget(keys.batch(batch_id), "owner") or b"")
                    await abandon(self._s, batch_id, owner, why)
            except (RedisError, OSError):
                return
            return
        # failures are counted in a row
        if h.get("failures"):
            await r.hdel(keys.batch(batch_id), "failures")

    async def drive(self, batch_id: str) -> dict[str, str]:
        """One step of the batch. Returns its hash as it was read."""
        r = self._s.redis
        h = await batch_hash(self._s, batch_id)
        if not h or h["status"] in ENDED:
            async with r.pipeline(transaction=True) as pipe:
                pipe.zrem(keys.ACTIVE_BATCHES, batch_id)
                if h:
                    pipe.zrem(keys.owned(h["owner"], keys.OwnerIndex.RUNNING_BATCHES), batch_id)
                await pipe.execute()
            return h
        # a driver died writing the files: write them again
        if h["status"] == BatchStatus.FINALIZING:
            await finalize(self._s, batch_id, h, h["ending"])
            return h
        now = int(time.time())
        if h["status"] == BatchStatus.VALIDATING:
            fields = {"status": BatchStatus.IN_PROGRESS, "in_progress_at": now}
            if not await set_status(self._s, batch_id, (BatchStatus.VALIDATING,), fields):
                # cancelled meanwhile: the next tick sees it
                return h
            h["status"] = BatchStatus.IN_PROGRESS
        open_lines = await self._collect(batch_id, h)
        if not h.get("failure") and await self._over_quota(h["owner"]):
            await r.hset(keys.batch(batch_id), "failure", OVER_QUOTA)
            h["failure"] = OVER_QUOTA
        ending = self._ending(h, now)
        if ending is not None:
            for job_id in open_lines.values():
                await self._s.jobs.cancel(job_id)
            if not open_lines:
                await finalize(self._s, batch_id, h, ending)
            return h
        sent, total = int(h["next"]), int(h["total"])
        while len(open_lines) < self._s.settings.batches.batch_in_flight and sent < total:
            job_id = await self._send(batch_id, h, sent)
            if job_id is not None:
                open_lines[sent] = job_id
            sent += 1
        if sent == total and not open_lines:
            await finalize(self._s, batch_id, h, BatchStatus.COMPLETED)
        return h

    @staticmethod
    def _ending(h: dict[str, str], now: int) -> str | None:
        """How a batch that must stop sending lines ends (None: it goes on)."""
        if h.get("failure"):
            return BatchStatus.FAILED
        if h["status"] == BatchStatus.CANCELLING:
            return BatchStatus.CANCELLED
        if now >= int(h["expires_at"]):
            return BatchStatus.EXPIRED
        return None

    async def _over_quota(self, owner: str) -> bool:
        """Whether the batch's key holds more than FILES_BYTES_PER_KEY. Its batches' answers
        count, so a batch stops growing once its key is full."""
        quota = self._s.settings.quotas.files_bytes_per_key
        held = await self._s.redis.get(keys.owned(owner, keys.OwnerIndex.FILE_HELD))
        return quota > 0 and int(held or 0) > quota

    async def _send(self, batch_id: str, h: dict[str, str], number: int) -> str | None:
        """Send line `number` as a job. If a driver sent it and died, it is the same job
        again. None if its endpoint now refuses it: it is then answered at once, with the error."""
        custom_id, body = json.loads(
            await self._s.redis.lindex(keys.batch(batch_id, keys.BatchPart.LINES), number)
        )
        line = Line(number + 1, custom_id, h["endpoint"], body)
        endpoint = BATCHABLE[h["endpoint"]]
        job_id = endpoint.new_id()
        try:
            request = line.request()
            spec = request.to_spec(job_id, self._s.settings.limits)
        except APIError as exc:
            out = {"id": f"batch_req_{job_id.split('-', 1)[1]}", "custom_id": custom_id, "response": None}
            out["error"] = {"code": exc.code, "message": exc.message}
            await self._record(batch_id, h, number, out, failed=True, usage=(0, 0))
            await self._s.redis.hset(keys.batch(batch_id), "next", number + 1)
            return None
        # no client's key (a SHA-256 in hex) looks like it
        line_key = f"batch:{batch_id}:{number}"
        submitted = await self._s.jobs.submit(
            dataclasses.replace(spec, priority=tiers.BATCH),
            endpoint.name,
            int(time.time()),
            owner=h["owner"],
            detached=True,
            idempotency=Idempotency(keys.idempotency(h["owner"], line_key), line_key),
            start_by_ms=int(h["expires_at"]) * 1000,
            cache_salt=request.cache_salt,
            # its batch bounds it (BATCH_IN_FLIGHT): the key's interactive jobs do not wait
            counted=False,
            # requeued, it may wait as long; and what its answer says of the request (an encoding)
            fields=request.job_fields(job_id) | {JobField.WAIT_UNTIL: str(int(h["expires_at"]) * 1000)},
        )
        job_id = submitted.job.id
        async with self._s.redis.pipeline(transaction=True) as pipe:
            pipe.hset(keys.batch(batch_id, keys.BatchPart.OPEN), str(number), job_id)
            pipe.hset(keys.batch(batch_id), "next", number + 1)
            await pipe.execute()
        return job_id

    async def _collect(self, batch_id: str, h: dict[str, str]) -> dict[int, str]:
        """Answer the open lines whose job has ended. Returns those still open."""
        opened = {
            int(k): as_text(v)
            for k, v in (await self._s.redis.hgetall(keys.batch(batch_id, keys.BatchPart.OPEN))).items()
        }
        still = {}
        for number, job_id in opened.items():
            job = await self._s.jobs.state(job_id)
            if job is not None and not job.ended:
                still[number] = job_id
                continue
            out, failed, usage = await self._output(batch_id, h, number, job_id, job)
            await self._record(batch_id, h, number, out, failed, usage)
            if job is not None and job.endpoint == EMBEDDINGS.name:
                # its vectors are in the answer, charged: not twice
                await self._s.jobs.purge(job_id)
        return still

    async def _record(
        self, batch_id: str, h: dict[str, str], number: int, out: dict, failed: bool, usage: tuple[int, int]
    ) -> None:
        """A line's answer, written once, counted once, charged to the batch's key."""
        # may be large
        line = await self._s.heavy.run(functools.partial(json.dumps, out, ensure_ascii=False))
        await self._answer(
            keys=[
                keys.batch(batch_id, keys.BatchPart.RESULTS),
                keys.batch(batch_id, keys.BatchPart.OPEN),
                keys.batch(batch_id),
                *accounting.charge_keys(h["owner"]),
            ],
            args=[
                number,
                line,
                "failed" if failed else "completed",
                *usage,
                accounting.results_charge(batch_id),
                int(h["expires_at"]) + CHARGE_MARGIN_S,
            ],
        )

    async def _output(
        self, batch_id: str, h: dict[str, str], number: int, job_id: str, job: JobState | None
    ) -> tuple[dict, bool, tuple[int, int]]:
        """A line's output line (OpenAI's BatchRequestOutput), whether it failed, its tokens."""
        raw = await self._s.redis.lindex(keys.batch(batch_id, keys.BatchPart.LINES), number)
        custom_id = json.loads(raw)[0]
        out = {
            "id": f"batch_req_{job_id.split('-', 1)[1]}",
            "custom_id": custom_id,
            "response": None,
            "error": None,
        }
        if job is None:
            # expected only past the job's retention: say what is left of it (field names only)
            left = await self._s.redis.hkeys(keys.job(job_id))
            log.warning(
                "batch %s line %d: job %s is gone before it was collected (fields left: %s)",
                batch_id,
                number + 1,
                job_id,
                sorted(as_text(f) for f in left) or "none",
            )
            out["error"] = errors.NOT_FOUND.brief("The line's job expired before it was collected.")
            return out, True, (0, 0)
        if job.status == keys.JobStatus.CANCELLED:
            ending = self._ending(h, int(time.time())) or BatchStatus.CANCELLED
            out["error"] = {
                BatchStatus.FAILED: errors.BATCH_FAILED.brief(h.get("failure") or None),
                BatchStatus.EXPIRED: errors.BATCH_EXPIRED.brief(),
            }.get(ending, errors.BATCH_CANCELLED.brief())
            return out, True, (0, 0)
        endpoint = BY_NAME[job.endpoint]
        rows = await self._s.jobs.whole(job_id)
        end = rows[-1][1] if rows else None
        # embeddings: built in the lane
        size = len(end.vectors) if isinstance(end, Finished) else 0
        answer = await self._s.heavy.run_for(size, endpoint.objects_of(job).answer, rows)
        # the job has ended
        assert answer is not None
        out["response"] = {"status_code": answer.status, "request_id": job_id, "body": answer.body}
        usage = answer.body.get("usage") or {}
        return out, answer.status != 200, (usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0))
