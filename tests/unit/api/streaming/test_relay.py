"""The relay's reading of one job's stream (api/streaming/relay.py), on fakeredis: after a failover
that took back entries it had sent, with the worker that would have written them again, the
next attempt goes on from an earlier entry, and the relay ends the stream rather than send
text that contradicts what it sent (docs/protocol.md, "Failover"). A resume's cursor after
every entry is waited for while the job runs, and ends the stream once the job has ended."""

from __future__ import annotations

import asyncio
import math

import pytest

from api.jobs.store import JobStore
from api.streaming.relay import AHEAD_LOOK_S, _JobReader
from contract import entries, errors, keys
from contract.entries import Delta, Failed, Finished, Started
from contract.keys import JobField, JobStatus
from contract.settings import Recovery
from tests.fake_servers import FakePair

CID = "chatcmpl-relay"


def write(r, entry_id: str, entry) -> None:
    r.xadd(keys.events(CID), entries.encode(entry), id=entry_id)


def read_after(pair: FakePair, cursor: str) -> list:
    async def go() -> list:
        store = JobStore(pair.aio(), pair.sync(), queue_wait_s=60, recovery=Recovery())
        return await _JobReader(store, CID, cursor, inclusive=False, outage_s=1.0).read()

    return asyncio.run(go())


def rolled_back() -> FakePair:
    """A job's stream after a failover: "3-0" ("b") was sent, then lost with its worker; the
    next attempt goes on from "2-0"."""
    pair = FakePair()
    r = pair.sync().streams
    write(r, "1-0", Started(epoch=1, worker="w1", prompt_tokens=3, after="0-0"))
    write(r, "2-0", Delta(epoch=1, text="a", token_ids=(1,)))
    write(r, "4-0", Started(epoch=2, worker="w2", prompt_tokens=3, after="2-0"))
    write(r, "5-0", Delta(epoch=2, text="c", token_ids=(7,)))
    return pair


def test_an_attempt_going_on_from_before_what_was_sent_ends_the_stream():
    pair = rolled_back()
    rows = read_after(pair, "3-0")
    assert len(rows) == 1 and isinstance(rows[0][1], Failed)
    assert rows[0][1].code == errors.ROLLED_BACK.code


def test_a_reader_that_was_not_sent_the_lost_entries_reads_on():
    pair = rolled_back()
    assert [i for i, _ in read_after(pair, "2-0")] == ["4-0", "5-0"]
    assert [i for i, _ in read_after(pair, "0")] == ["1-0", "2-0", "4-0", "5-0"]  # a replay


def test_a_job_missing_for_a_moment_is_not_gone_at_once(monkeypatch):
    """In a failover a read may reach the replaced primary, which lacks a job made since:
    the relay looks again before it says not_found."""
    monkeypatch.setattr("api.streaming.relay.GONE_AFTER_S", 0.3)
    pair = FakePair()

    async def go() -> tuple[list, float, list]:
        store = JobStore(pair.aio(), pair.sync(), queue_wait_s=60, recovery=Recovery())
        reader = _JobReader(store, CID, "0", inclusive=False, outage_s=1.0)
        first = await reader.read()
        again_in = reader.look_again_in()
        await asyncio.sleep(0.35)
        return first, again_in, await reader.read()

    first, again_in, later = asyncio.run(go())
    assert first == [] and 0 < again_in <= 0.6
    assert isinstance(later[0][1], Failed) and later[0][1].code == errors.NOT_FOUND.code


def job(status: str, *, stream: bool = True) -> FakePair:
    """A job in `status` with two entries, and its terminal one if it has ended."""
    pair = FakePair()
    r = pair.sync().streams
    ended = status in JobStatus.ENDED
    r.hset(keys.job(CID), mapping={JobField.STATUS: status, JobField.ENDED: int(ended)})
    if stream:
        write(r, "1-0", Started(epoch=1, worker="w1", prompt_tokens=3))
        write(r, "2-0", Delta(epoch=1, text="a", token_ids=(1,)))
        if ended:
            write(r, "3-0", Finished(epoch=1, finish_reason="stop", prompt_tokens=3, completion_tokens=1))
    return pair


def end(pair: FakePair) -> None:
    r = pair.sync().streams
    write(r, "3-0", Finished(epoch=1, finish_reason="stop", prompt_tokens=3, completion_tokens=1))
    r.hset(keys.job(CID), mapping={JobField.STATUS: JobStatus.DONE, JobField.ENDED: 1})


def resume(pair: FakePair, cursor: str):
    """A reader from a client's cursor (read again: chat's resume, api/endpoints/chat/events.py)."""
    store = JobStore(pair.aio(), pair.sync(), queue_wait_s=60, recovery=Recovery())
    return _JobReader(store, CID, cursor, inclusive=True, outage_s=1.0)


@pytest.mark.parametrize("cursor", ["3-1", "99999999999999-0"])
def test_a_cursor_after_an_ended_jobs_terminal_entry_ends_the_stream_at_once(cursor):
    rows = asyncio.run(resume(job(JobStatus.DONE), cursor).read())
    assert len(rows) == 1 and isinstance(rows[0][1], Failed)
    assert rows[0][1].code == errors.INVALID_CURSOR.code and "last event, 3-0" in rows[0][1].message


def test_a_cursor_at_the_terminal_entry_reads_it():
    rows = asyncio.run(resume(job(JobStatus.DONE), "3-0").read())
    assert [(i, type(e)) for i, e in rows] == [("3-0", Finished)]


def test_a_cursor_ahead_of_a_running_job_is_waited_for_until_the_job_ends():
    """It may be an entry a replica has yet to see: the stream waits, looking again every
    AHEAD_LOOK_S, since the job's end (written before the cursor) wakes no read of the stream."""
    pair = job(JobStatus.RUNNING)

    async def go() -> tuple[list, float, list]:
        reader = resume(pair, "99999999999999-0")
        waiting = await reader.read()
        again_in = reader.look_again_in()
        end(pair)
        return waiting, again_in, await reader.read()

    waiting, again_in, ended = asyncio.run(go())
    assert waiting == [] and 0 < again_in <= AHEAD_LOOK_S + 0.1
    assert isinstance(ended[0][1], Failed) and ended[0][1].code == errors.INVALID_CURSOR.code


def test_a_reader_that_has_read_an_entry_waits_to_be_woken():
    """Past the client's cursor the reader's own is an entry of the stream: nothing to look for."""
    pair = job(JobStatus.RUNNING)

    async def go() -> tuple[list, list, float]:
        reader = resume(pair, "2-0")
        return await reader.read(), await reader.read(), reader.look_again_in()

    first, then, again_in = asyncio.run(go())
    assert [i for i, _ in first] == ["2-0"] and then == [] and again_in == math.inf


def test_an_ended_job_whose_stream_expired_first_is_not_found(monkeypatch):
    monkeypatch.setattr("api.streaming.relay.GONE_AFTER_S", 0.3)
    pair = job(JobStatus.DONE, stream=False)

    async def go() -> tuple[list, list]:
        reader = resume(pair, "3-0")
        first = await reader.read()
        await asyncio.sleep(0.35)
        return first, await reader.read()

    first, later = asyncio.run(go())
    assert first == [] and isinstance(later[0][1], Failed) and later[0][1].code == errors.NOT_FOUND.code
