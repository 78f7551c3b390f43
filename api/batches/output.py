"""A batch's end: its output and error files, written a few lines at a time.

The output file holds the lines answered well. The error file holds the others. Then the
batch's own copies are given back.

The files are appended to in pieces of `PIECE_LINES` answers (api/batches/files.py `append`,
`seal`). So the API never holds more than a few lines' answers at once, however large the
batch. The files are charged to the batch's key like any file. Its lines' and answers'
charges are given back as the copies go (contract/lua/accounting.py). A driver that dies half
way through writes the files again from the start. The batch stays `finalizing` until its
last step.
"""

from __future__ import annotations

import json
import logging
import time

from api.batches.routes import BatchStatus
from api.files.store import FileRecord, files_of
from api.services import Services
from contract import errors, keys
from contract.lua import accounting

log = logging.getLogger(__name__)

# answers read and appended at a time
PIECE_LINES = 32


def never_sent(batch_id: str, number: int, custom_id: str | None, status: str, failure: str) -> dict:
    """The error line of a request the batch ended before answering."""
    if status == BatchStatus.FAILED:
        error = errors.BATCH_FAILED.brief(failure or None)
    elif status == BatchStatus.CANCELLED:
        error = errors.BATCH_CANCELLED.brief(f"The batch was {status} before this request was answered.")
    else:
        error = errors.BATCH_EXPIRED.brief(f"The batch was {status} before this request was answered.")
    return {
        "id": f"batch_req_{batch_id[6:]}{number}",
        "custom_id": custom_id,
        "response": None,
        "error": error,
    }


def _custom_id(raw: bytes) -> str | None:
    """A line's custom_id. It is None for a line that cannot be read. Its batch is failing
    for it, and its error file must still be written."""
    try:
        return str(json.loads(raw)[0])
    except (ValueError, LookupError, TypeError):
        return None


def answered_well(row: dict) -> bool:
    return row["error"] is None and row["response"] is not None and row["response"]["status_code"] == 200


class _File:
    """One of the batch's files as it is written."""

    def __init__(self, services: Services, batch_id: str, kind: str) -> None:
        self.id = f"file-{batch_id[6:]}{kind[0]}"
        self.name = f"{batch_id}_{kind}.jsonl"
        self._files = files_of(services.redis)
        self._r = services.redis
        self._piece = bytearray()
        self.bytes = 0
        self.lines = 0

    async def start(self) -> None:
        # what a driver that died left
        await self._r.delete(keys.file_content(self.id))

    def add(self, row: dict) -> None:
        self._piece += (json.dumps(row, ensure_ascii=False) + "\n").encode()
        self.lines += 1

    async def flush(self) -> None:
        if self._piece:
            await self._files.append(self.id, bytes(self._piece))
            self.bytes += len(self._piece)
            self._piece.clear()

    async def seal(self, owner: str, now: int, retention_s: int) -> str | None:
        """Store the file (None: it has no line)."""
        await self.flush()
        if not self.lines:
            return None
        record = FileRecord(self.id, owner, self.name, "batch_output", self.bytes, now, now + retention_s)
        await self._files.seal(record)
        return self.id


async def finalize(services: Services, batch_id: str, h: dict[str, str], status: str) -> None:
    """Write the batch's files and end it with `status`. The primary must still hold the
    status `h` holds, since a cancel may have changed it. It must hold no line open. For a
    batch that completes, every line must be sent. The primary is asked because `h` may have
    been read from a demoted primary (contract.lua.accounting.FINALIZE). If any check fails,
    nothing is done this time."""
    r = services.redis
    now = int(time.time())
    if h["status"] != BatchStatus.FINALIZING:
        fields = {"status": BatchStatus.FINALIZING, "finalizing_at": now, "ending": status}
        flat = [str(x) for pair in fields.items() for x in pair]
        began = await r.register_script(accounting.FINALIZE)(
            keys=[keys.batch(batch_id), keys.batch(batch_id, keys.BatchPart.OPEN)],
            args=[h["status"], int(status == BatchStatus.COMPLETED), *flat],
        )
        if began in (b"open", b"unsent"):
            log.warning(
                "batch %s: read as done, but the primary has a line %s: not ended", batch_id, began.decode()
            )
        if began != 1:
            return
    output, error = _File(services, batch_id, "output"), _File(services, batch_id, "error")
    for f in (output, error):
        await f.start()
    total = int(h["total"])
    for start in range(0, total, PIECE_LINES):
        numbers = list(range(start, min(start + PIECE_LINES, total)))
        results = await r.hmget(keys.batch(batch_id, keys.BatchPart.RESULTS), numbers)
        lines = None
        for n, raw in zip(numbers, results, strict=True):
            if raw is not None:
                row = json.loads(raw)
            # cancelled, expired or failed before it was answered
            else:
                if lines is None:
                    lines = await r.lrange(keys.batch(batch_id, keys.BatchPart.LINES), start, numbers[-1])
                row = never_sent(batch_id, n, _custom_id(lines[n - start]), status, h.get("failure", ""))
            (output if answered_well(row) else error).add(row)
        for f in (output, error):
            await f.flush()
    retention = services.settings.batches.file_retention_s
    fields = {"status": status, f"{status}_at": now, "completed": output.lines, "failed": error.lines}
    for kind, f in (("output", output), ("error", error)):
        if file_id := await f.seal(h["owner"], now, retention):
            fields[f"{kind}_file_id"] = file_id
    await _end(services, batch_id, h["owner"], fields, retention)
    log.info("batch %s %s: %d answered, %d failed", batch_id, status, output.lines, error.lines)


async def _end(services: Services, batch_id: str, owner: str, fields: dict, retention_s: int) -> None:
    """The batch ended. Its hash is kept for its retention. Its copies of lines and answers
    are deleted, and their charges given back."""
    r = services.redis
    async with r.pipeline(transaction=True) as pipe:
        pipe.hset(keys.batch(batch_id), mapping=fields)
        pipe.expire(keys.batch(batch_id), retention_s)
        for part in (keys.BatchPart.LINES, keys.BatchPart.RESULTS, keys.BatchPart.OPEN):
            pipe.delete(keys.batch(batch_id, part))
        pipe.zrem(keys.ACTIVE_BATCHES, batch_id)
        pipe.zrem(keys.owned(owner, keys.OwnerIndex.RUNNING_BATCHES), batch_id)
        await pipe.execute()
    await r.register_script(accounting.RELEASE)(
        keys=accounting.charge_keys(owner),
        args=[accounting.lines_charge(batch_id), accounting.results_charge(batch_id)],
    )


async def abandon(services: Services, batch_id: str, owner: str, why: str) -> None:
    """End a batch that cannot even be finalized: failed, without files. It is the last
    resort of a batch whose every drive fails. Such a batch must not stay active for ever."""
    now = int(time.time())
    fields = {"status": BatchStatus.FAILED, "failed_at": now, "failure": why}
    await _end(services, batch_id, owner, fields, services.settings.batches.file_retention_s)
    log.error("batch %s abandoned: %s", batch_id, why)
