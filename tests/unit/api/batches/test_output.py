"""api/batches/output.py on fakeredis: a batch ends only when the primary agrees that it may.

The driver decides from what it reads, and behind one name a read may reach a demoted primary
(a connection opened before a managed failover): for seconds it answers from its own data. In
CI (test_failover.py, "one name") the driver read there that a line was answered, which the
new primary had lost with the failover, and completed the batch with that line "never
answered"; the line's job had run and finished."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import fakeredis
import pytest

from api.batches.output import finalize
from api.batches.routes import BatchStatus
from contract import keys

BATCH = "batch_abc"


def primary(sent: int, open_lines: dict[str, str]) -> fakeredis.FakeAsyncRedis:
    r = fakeredis.FakeAsyncRedis()

    async def fill() -> None:
        await r.hset(
            keys.batch(BATCH), mapping={"status": "in_progress", "total": 3, "next": sent, "owner": "o"}
        )
        if open_lines:
            await r.hset(keys.batch(BATCH, keys.BatchPart.OPEN), mapping=open_lines)

    asyncio.run(fill())
    return r


@pytest.mark.parametrize(
    ("sent", "open_lines"),
    [
        (3, {"1": "chatcmpl-x"}),  # the demoted node had line 1 answered; the primary has it open
        (2, {}),  # the demoted node had line 2 sent; the primary never sent it
    ],
)
def test_a_batch_read_as_done_is_not_ended_while_the_primary_has_a_line_to_go(sent, open_lines):
    r = primary(sent, open_lines)
    read = {"status": "in_progress", "total": "3", "next": "3", "owner": "o"}  # what the driver read
    asyncio.run(finalize(SimpleNamespace(redis=r), BATCH, read, BatchStatus.COMPLETED))  # type: ignore[arg-type]
    assert asyncio.run(r.hget(keys.batch(BATCH), "status")) == b"in_progress"  # the next tick reads again


def test_a_cancelled_batch_ends_with_lines_never_sent_but_none_open():
    r = primary(1, {"0": "chatcmpl-x"})
    read = {"status": "cancelling", "total": "3", "next": "1", "owner": "o"}
    asyncio.run(r.hset(keys.batch(BATCH), "status", "cancelling"))
    asyncio.run(finalize(SimpleNamespace(redis=r), BATCH, read, BatchStatus.CANCELLED))  # type: ignore[arg-type]
    assert asyncio.run(r.hget(keys.batch(BATCH), "status")) == b"cancelling"  # its open job ends first
