"""The relay's reading of one job's stream (api/streaming/relay.py), on fakeredis: after a failover
that took back entries it had sent, with the worker that would have written them again, the
next attempt goes on from an earlier entry, and the relay ends the stream rather than send
text that contradicts what it sent (docs/protocol.md, "Failover")."""

from __future__ import annotations

import asyncio

from api.jobs.store import JobStore
from api.streaming.relay import _JobReader
from contract import entries, errors, keys
from contract.entries import Delta, Failed, Started
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
