"""Drives the running batches: sends their lines as jobs, collects the answers, writes the
output and error files.

Every API process runs one; a Redis lock lets one act at a time (as the reaper). Each tick,
for each batch not ended: the lines whose job has ended are answered (their output line
written once, counted once: `_ANSWER`); then, while it runs, lines are sent as jobs until
BATCH_IN_FLIGHT of its lines are open; a cancelled or expired batch has its open jobs
cancelled instead; a batch with every line answered is finalized. A line's job is an ordinary
job of its endpoint's surface, at `batch` tier, owned by the batch's key, crash-safe like any
other; its id is held by an Idempotency-Key made of the batch and the line, so a driver that
dies between sending a line and recording it sends it again to the same job.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time

from api.background import Background, Leader, every
from api.batch_lines import Line
from api.batches import ENDED, BatchStatus, batch_hash
from api.files import FileRecord, files_of
from api.jobstore import JobState
from api.owners import Idempotency
from api.services import Services
from api.surfaces import BATCHABLE, BY_NAME
from contract import errors, keys
from contract.entries import as_text
from contract.keys import JobField

log = logging.getLogger(__name__)

# KEYS: results, open, batch; ARGV: line, output line, counter, input tokens, output tokens.
_ANSWER = """
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 1 then
  redis.call('HINCRBY', KEYS[3], ARGV[3], 1)
  redis.call('HINCRBY', KEYS[3], 'input_tokens', ARGV[4])
  redis.call('HINCRBY', KEYS[3], 'output_tokens', ARGV[5])
end
return redis.call('HDEL', KEYS[2], ARGV[1])
"""


class BatchDriver:
    def __init__(self, services: Services) -> None:
        self._s = services
        self._leader = Leader(services.redis, keys.BATCH_DRIVER_LOCK)
        self._answer = services.redis.register_script(_ANSWER)
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
        for raw in await self._s.redis.zrange(keys.ACTIVE_BATCHES, 0, -1):
            await self.drive(as_text(raw))

    async def drive(self, batch_id: str) -> None:
        r = self._s.redis
        h = await batch_hash(self._s, batch_id)
        if not h or h["status"] in ENDED:
            async with r.pipeline(transaction=True) as pipe:
                pipe.zrem(keys.ACTIVE_BATCHES, batch_id)
                if h:
                    pipe.zrem(keys.owned(h["owner"], keys.Owned.RUNNING_BATCHES), batch_id)
                await pipe.execute()
            return
        if h["status"] == BatchStatus.FINALIZING:  # a driver died writing the files: write them again
            await self._finalize(batch_id, h, h["ending"])
            return
        now = int(time.time())
        if h["status"] == BatchStatus.VALIDATING:
            fields = {"status": BatchStatus.IN_PROGRESS, "in_progress_at": now}
            await r.hset(keys.batch(batch_id), mapping=fields)
            h["status"] = BatchStatus.IN_PROGRESS
        open_lines = await self._collect(batch_id, h)
        cancelling = h["status"] == BatchStatus.CANCELLING
        stopping = cancelling or now >= int(h["expires_at"])
        if stopping:
            for cid in open_lines.values():
                await self._s.jobs.cancel(cid)
            if not open_lines:
                ending = BatchStatus.CANCELLED if cancelling else BatchStatus.EXPIRED
                await self._finalize(batch_id, h, ending)
            return
        sent, total = int(h["next"]), int(h["total"])
        while len(open_lines) < self._s.settings.batches.batch_in_flight and sent < total:
            open_lines[sent] = await self._send(batch_id, h, sent)
            sent += 1
        if sent == total and not open_lines:
            await self._finalize(batch_id, h, BatchStatus.COMPLETED)

    async def _send(self, batch_id: str, h: dict[str, str], number: int) -> str:
        """Send line `number` as a job (the same job again, if a driver sent it and died)."""
        custom_id, body = json.loads(
            await self._s.redis.lindex(keys.batch(batch_id, keys.BatchPart.LINES), number)
        )
        line = Line(number + 1, custom_id, h["endpoint"], body)
        surface = BATCHABLE[h["endpoint"]]
        cid = surface.new_id()
        spec = dataclasses.replace(line.request().to_spec(cid, self._s.settings.limits), priority=keys.BATCH)
        digest = hashlib.sha256(f"{batch_id} {number}".encode()).hexdigest()
        submitted = await self._s.jobs.submit(
            spec,
            surface.name,
            int(time.time()),
            owner=h["owner"],
            detached=True,
            idempotency=Idempotency(keys.idempotency(h["owner"], digest), digest),
            start_by_ms=int(h["expires_at"]) * 1000,
            counted=False,  # its batch bounds it (BATCH_IN_FLIGHT): the key's interactive jobs do not wait
            fields={JobField.WAIT_UNTIL: str(int(h["expires_at"]) * 1000)},  # requeued, it may wait as long
        )
        cid = submitted.job.id
        async with self._s.redis.pipeline(transaction=True) as pipe:
            pipe.hset(keys.batch(batch_id, keys.BatchPart.OPEN), str(number), cid)
            pipe.hset(keys.batch(batch_id), "next", number + 1)
            await pipe.execute()
        return cid

    async def _collect(self, batch_id: str, h: dict[str, str]) -> dict[int, str]:
        """Answer the open lines whose job has ended; returns those still open."""
        opened = {
            int(k): as_text(v)
            for k, v in (await self._s.redis.hgetall(keys.batch(batch_id, keys.BatchPart.OPEN))).items()
        }
        still = {}
        for number, cid in opened.items():
            job = await self._s.jobs.state(cid)
            if job is not None and not job.ended:
                still[number] = cid
                continue
            out, failed, usage = await self._output(batch_id, h, number, cid, job)
            await self._answer(
                keys=[
                    keys.batch(batch_id, keys.BatchPart.RESULTS),
                    keys.batch(batch_id, keys.BatchPart.OPEN),
                    keys.batch(batch_id),
                ],
                args=[number, json.dumps(out), "failed" if failed else "completed", *usage],
            )
        return still

    async def _output(
        self, batch_id: str, h: dict[str, str], number: int, cid: str, job: JobState | None
    ) -> tuple[dict, bool, tuple[int, int]]:
        """A line's output line (OpenAI's BatchRequestOutput), whether it failed, its tokens."""
        raw = await self._s.redis.lindex(keys.batch(batch_id, keys.BatchPart.LINES), number)
        custom_id = json.loads(raw)[0]
        out = {
            "id": f"batch_req_{cid.split('-', 1)[1]}",
            "custom_id": custom_id,
            "response": None,
            "error": None,
        }
        if job is None:
            out["error"] = errors.NOT_FOUND.brief("The line's job expired before it was collected.")
            return out, True, (0, 0)
        if job.status == keys.JobStatus.CANCELLED:
            expired = h["status"] != BatchStatus.CANCELLING and time.time() >= int(h["expires_at"])
            out["error"] = (errors.BATCH_EXPIRED if expired else errors.BATCH_CANCELLED).brief()
            return out, True, (0, 0)
        surface = BY_NAME[job.surface]
        answer = surface.chunks_of(job).answer(await self._s.jobs.read(cid, "0", count=100_000))
        assert answer is not None  # the job has ended
        out["response"] = {"status_code": answer.status, "request_id": cid, "body": answer.body}
        usage = answer.body.get("usage") or {}
        return out, answer.status != 200, (usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0))

    async def _finalize(self, batch_id: str, h: dict[str, str], status: str) -> None:
        """Write the output file (the answered lines) and the error file (the failed ones and,
        for a cancelled or expired batch, the lines never sent), then end the batch."""
        r = self._s.redis
        now = int(time.time())
        await r.hset(
            keys.batch(batch_id),
            mapping={"status": BatchStatus.FINALIZING, "finalizing_at": now, "ending": status},
        )
        results = {
            int(k): json.loads(v)
            for k, v in (await r.hgetall(keys.batch(batch_id, keys.BatchPart.RESULTS))).items()
        }
        total = int(h["total"])
        never = [n for n in range(total) if n not in results]
        for n in never:  # cancelled or expired before they were sent
            custom_id = json.loads(await r.lindex(keys.batch(batch_id, keys.BatchPart.LINES), n))[0]
            error = errors.BATCH_CANCELLED if status == BatchStatus.CANCELLED else errors.BATCH_EXPIRED
            results[n] = {
                "id": f"batch_req_{batch_id[6:]}{n}",
                "custom_id": custom_id,
                "response": None,
                "error": error.brief(f"The batch was {status} before this request was sent."),
            }
        good = [results[n] for n in sorted(results) if results[n]["error"] is None and _ok(results[n])]
        bad = [results[n] for n in sorted(results) if not (results[n]["error"] is None and _ok(results[n]))]
        fields: dict[str, object] = {"status": status, f"{status}_at": now, "failed": len(bad)}
        fields["completed"] = len(good)
        retention = self._s.settings.batches.file_retention_s
        for kind, rows in (("output", good), ("error", bad)):
            if rows:
                file_id = f"file-{batch_id[6:]}{kind[0]}"
                content = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows).encode()
                record = FileRecord(
                    file_id,
                    h["owner"],
                    f"{batch_id}_{kind}.jsonl",
                    "batch_output",
                    len(content),
                    now,
                    now + retention,
                )
                await files_of(self._s).put(record, content)
                fields[f"{kind}_file_id"] = file_id
        async with r.pipeline(transaction=True) as pipe:
            pipe.hset(keys.batch(batch_id), mapping=fields)
            for key in (
                keys.batch(batch_id),
                keys.batch(batch_id, keys.BatchPart.LINES),
                keys.batch(batch_id, keys.BatchPart.RESULTS),
            ):
                pipe.expire(key, retention)
            pipe.delete(keys.batch(batch_id, keys.BatchPart.OPEN))
            pipe.zrem(keys.ACTIVE_BATCHES, batch_id)
            pipe.zrem(keys.owned(h["owner"], keys.Owned.RUNNING_BATCHES), batch_id)
            await pipe.execute()
        log.info("batch %s %s: %d answered, %d failed", batch_id, status, len(good), len(bad))


def _ok(row: dict) -> bool:
    return row["response"] is not None and row["response"]["status_code"] == 200
