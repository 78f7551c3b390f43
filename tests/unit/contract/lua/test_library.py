"""contract/lua/library.py on fakeredis with real Lua: the keys every per-job script takes, the status
a terminal entry sets, the catalogue's entries as Lua literals, and closing a job (what it keeps)."""

from __future__ import annotations

import fakeredis
import pytest
from redis.crc import key_slot

from contract import entries, errors, keys
from contract.entries import Delta, Failed, Finished, Started
from contract.keys import JobField, JobStatus
from contract.lua import jobs, library
from tests.unit.recorded import record_queued

CID = "chatcmpl-lib"


@pytest.fixture
def r():
    client = fakeredis.FakeRedis()
    record_queued(client, CID)
    client.hset(keys.job(CID), JobField.SPEC, '{"model": "m"}')
    client.expire(keys.job(CID), 1000)
    return client


def stream(r) -> list:
    return [entries.decode(f) for _, f in r.xrange(keys.events(CID))]


def test_a_per_job_script_takes_the_job_s_keys_in_order_all_in_one_slot():
    shard = keys.shard(CID)
    taken = library.job_keys(CID)
    assert taken == [
        keys.job(CID),
        keys.events(CID),
        keys.running(shard),
        keys.alive(CID),
        keys.pending(shard),
    ]
    assert len({key_slot(k.encode()) for k in taken}) == 1


@pytest.mark.parametrize(
    ("entry", "status"),
    [
        (Finished(finish_reason="stop", prompt_tokens=1, completion_tokens=1), JobStatus.DONE),
        (Finished(finish_reason="length", prompt_tokens=1, completion_tokens=9), JobStatus.DONE),
        (Finished(finish_reason="tool_calls", prompt_tokens=1, completion_tokens=3), JobStatus.DONE),
        (Finished(finish_reason="cancelled", prompt_tokens=1, completion_tokens=0), JobStatus.CANCELLED),
        (errors.WORKER_ERROR.entry(), JobStatus.FAILED),
        (Delta(text="a", token_ids=(1,)), ""),
        (Started(worker="w1", prompt_tokens=3), ""),
    ],
)
def test_only_a_terminal_entry_sets_a_final_status(entry, status):
    assert library.final_status(entry) == status


def test_every_catalogue_error_reads_back_from_its_lua_literal_as_its_stream_fields():
    """LIB writes QUEUE_TIMEOUT and WORKER_LOST as Lua literals: a message with a quote, a
    backslash, a line break or a carriage return must come out as it went in."""
    r = fakeredis.FakeRedis()
    catalogue = [v for v in vars(errors).values() if isinstance(v, errors.ErrorCode)]
    tricky = Failed(message='say "no"\\ then\nstop\r\n', type="server_error", code="x")
    for entry in [e.entry() for e in catalogue] + [tricky]:
        fields = r.eval(f"return {library._lua_fields(entry)}", 0)
        expected = [x for k, v in entries.encode(entry).items() if k != entries.EPOCH for x in (k, v)]
        assert [f.decode() for f in fields] == expected


def test_a_job_ended_late_after_an_attempt_ran_ends_with_the_catalogue_s_worker_lost(r):
    r.hset(keys.job(CID), mapping={JobField.START_BY: 1, JobField.ATTEMPTS: 2, JobField.EPOCH: 4})
    end_if_late = r.register_script(jobs.END_IF_LATE)
    assert end_if_late(keys=library.job_keys(CID), args=jobs.end_if_late_args(CID, 60)) == 1
    assert stream(r) == [errors.WORKER_LOST.entry(epoch=5)]  # the epoch after the last attempt's


def test_closing_a_job_drops_it_from_its_indexes_and_its_request_and_starts_its_retention(r):
    shard = keys.shard(CID)
    r.zadd(keys.pending(shard), {CID: 1, "chatcmpl-other": 1})
    r.zadd(keys.running(shard), {CID: 1})
    r.set(keys.alive(CID), 1)
    end = r.register_script(jobs.END)
    assert end(keys=library.job_keys(CID), args=jobs.end_args(CID, errors.DEADLINE.entry(), 45)) == 1
    assert r.zrange(keys.pending(shard), 0, -1) == [b"chatcmpl-other"]
    assert r.zscore(keys.running(shard), CID) is None and not r.exists(keys.alive(CID))
    assert r.hmget(keys.job(CID), JobField.SPEC, JobField.DIGEST) == [None, None]
    assert r.hmget(keys.job(CID), JobField.ENDED, JobField.STATUS, JobField.EPOCH) == [b"1", b"failed", b"1"]
    assert 40 < r.ttl(keys.job(CID)) <= 45 and 40 < r.ttl(keys.events(CID)) <= 45


def test_a_job_whose_endpoint_shows_its_request_later_keeps_it_after_its_end(r):
    r.hset(keys.job(CID), JobField.KEEP_SPEC, "1")
    end = r.register_script(jobs.END)
    done = Finished(finish_reason="stop", prompt_tokens=2, completion_tokens=1)
    assert end(keys=library.job_keys(CID), args=jobs.end_args(CID, done, 60)) == 1
    assert r.hget(keys.job(CID), JobField.SPEC) == b'{"model": "m"}'
    assert r.hget(keys.job(CID), JobField.STATUS) == b"done"
    assert 0 < r.ttl(keys.job(CID)) <= 60


def test_a_cancel_is_due_from_its_time_on():
    """`cancel_due`, as CLAIM returns it: 0 without CANCEL_AT or before it, 1 from it on."""
    r = fakeredis.FakeRedis()
    script = r.register_script(library.LIB + "return cancel_due(KEYS[1])")
    r.hset("j", "x", "1")
    assert script(keys=["j"]) == 0
    now_ms = int(r.time()[0]) * 1000
    r.hset("j", JobField.CANCEL_AT, now_ms + 60_000)
    assert script(keys=["j"]) == 0
    r.hset("j", JobField.CANCEL_AT, now_ms - 1)
    assert script(keys=["j"]) == 1
