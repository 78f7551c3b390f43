"""contract/lua/attempts.py on fakeredis with real Lua: an attempt's CLAIM, APPEND, BEAT,
CLEAR_SUSPECT and FAIL, each fenced by the job's epoch and the claim's token."""

from __future__ import annotations

import dataclasses

import fakeredis
import pytest
import redis

from contract import entries, errors, keys
from contract.entries import Delta, Failed, Finished
from contract.keys import JobField, JobStatus
from contract.lua import attempts, library
from tests.unit.contract.lua.job import CID, RECOVERY, abandon, stream
from tests.unit.recorded import DIGEST
from worker.attempts.attempt import Claims, Fenced, JobGone, NotRecorded
from worker.attempts.publisher import Publisher
from worker.redis.link import Link


def _new(batch):
    """Entries to APPEND as new ones (Redis gives them their ids)."""
    return [("*", e) for e in batch]


def test_claim_starts_epoch_one_and_appends_are_accepted(r):
    pub = Publisher(Link(r, "w1", RECOVERY))
    claims = Claims(Link(r, "w1", RECOVERY), 3000)
    attempt = claims.claim(CID, DIGEST)
    assert attempt.epoch == 1 and not attempt.cancelled
    pub.started(attempt, 5)
    pub.delta(attempt, "hi", (7,))
    pub.finished(attempt, "stop", 5, 1)
    kinds = [type(e).__name__ for e in stream(r)]
    assert kinds == ["Started", "Delta", "Finished"]
    assert r.hget(keys.job(CID), JobField.STATUS) == b"done"
    assert 0 < r.ttl(keys.events(CID)) <= 60 and 0 < r.ttl(keys.job(CID)) <= 60


def test_entries_get_the_ids_their_worker_chose_or_new_ones_past_a_stream_ahead_of_it(r):
    """A worker chooses its entries' ids (worker/attempts/attempt.py `Attempt.next_ids`); one whose
    clock is behind the stream's newest id (written by a worker whose clock runs ahead) gets
    ids after it instead."""
    pub = Publisher(Link(r, "w1", RECOVERY))
    attempt = Claims(Link(r, "w1", RECOVERY), 3000).claim(CID, DIGEST)
    pub.started(attempt, 5)
    pub.flush(attempt)
    chosen = r.xrange(keys.events(CID))[-1][0].decode()
    assert attempt.newest == tuple(int(x) for x in chosen.split("-"))  # the id the worker chose
    ahead = f"{int(chosen.split('-')[0]) + 3_600_000}-0"
    r.xadd(keys.events(CID), {"x": "1"}, id=ahead)  # as a worker an hour ahead would have
    pub.delta(attempt, "hi", (7,))
    pub.flush(attempt)
    last = r.xrange(keys.events(CID))[-1][0].decode()
    assert last.startswith(ahead.split("-")[0] + "-") and last != ahead
    assert isinstance(entries.decode(r.xrange(keys.events(CID))[-1][1]), Delta)


def test_stream_created_by_first_append_lives_as_long_as_the_job(r):
    pub = Publisher(Link(r, "w1", RECOVERY))
    claims = Claims(Link(r, "w1", RECOVERY), 3000)
    attempt = claims.claim(CID, DIGEST)
    pub.started(attempt, 1)
    assert 900 < r.ttl(keys.events(CID)) <= 1000


def test_a_stale_attempt_cannot_write_one_more_token(r):
    old = Publisher(Link(r, "w-old", RECOVERY))
    old_claims = Claims(Link(r, "w-old", RECOVERY), 3000)
    new = Publisher(Link(r, "w-new", RECOVERY))
    new_claims = Claims(Link(r, "w-new", RECOVERY), 3000)
    a1 = old_claims.claim(CID, DIGEST)
    old.delta(a1, "a", (1,))
    old.flush(a1)
    r.delete(keys.alive(CID))  # its heartbeat stopped: the next claim takes over
    a2 = new_claims.claim(CID, DIGEST)
    assert a2.epoch == a1.epoch + 1
    old.delta(a1, "b", (2,))  # written behind: the refusal comes back with the next call
    with pytest.raises(Fenced):
        old.flush(a1)
    with pytest.raises(Fenced):
        old.delta(a1, "b2", (2,))
    new.delta(a2, "c", (3,))
    new.flush(a2)
    assert [e.text for e in stream(r) if isinstance(e, Delta)] == ["a", "c"]


def test_nothing_is_written_after_the_terminal_entry(r):
    pub = Publisher(Link(r, "w1", RECOVERY))
    claims = Claims(Link(r, "w1", RECOVERY), 3000)
    a = claims.claim(CID, DIGEST)
    pub.finished(a, "stop", 1, 0)
    with pytest.raises(Fenced):
        pub.delta(a, "late", (1,))
        pub.flush(a)
    with pytest.raises(JobGone):
        claims.claim(CID, DIGEST)
    assert sum(entries.is_terminal(e) for e in stream(r)) == 1


def test_cancel_flag_is_returned_by_the_append_once_due(r):
    pub = Publisher(Link(r, "w1", RECOVERY))
    claims = Claims(Link(r, "w1", RECOVERY), 3000)
    a = claims.claim(CID, DIGEST)
    pub.delta(a, "a", (1,))
    pub.flush(a)
    assert not a.cancelled
    r.hset(keys.job(CID), JobField.CANCEL_AT, 0)  # due long ago
    pub.delta(a, "b", (2,))
    pub.flush(a)
    assert a.cancelled


def test_cancel_in_the_future_is_not_due_yet(r):
    import time

    r.hset(keys.job(CID), JobField.CANCEL_AT, int(time.time() * 1000) + 60_000)
    a = Claims(Link(r, "w1", RECOVERY), 3000).claim(CID, DIGEST)
    assert not a.cancelled


def test_claim_refuses_a_job_past_its_start_deadline_and_ends_it(r):
    r.hset(keys.job(CID), JobField.START_BY, 1)
    with pytest.raises(JobGone):
        Claims(Link(r, "w1", RECOVERY), 3000).claim(CID, DIGEST)
    (last,) = stream(r)
    assert isinstance(last, Failed) and last.code == "queue_timeout"


def test_claim_refuses_a_vanished_job():
    with pytest.raises(JobGone):
        Claims(Link(fakeredis.FakeRedis(), "w1", RECOVERY), 3000).claim("chatcmpl-none", DIGEST)


def test_append_to_a_vanished_job_is_fenced(r):
    pub = Publisher(Link(r, "w1", RECOVERY))
    claims = Claims(Link(r, "w1", RECOVERY), 3000)
    a = claims.claim(CID, DIGEST)
    r.delete(keys.job(CID))
    with pytest.raises(Fenced):
        pub.delta(a, "x", (1,))
        pub.flush(a)


def test_finished_entry_records_usage(r):
    pub = Publisher(Link(r, "w1", RECOVERY))
    claims = Claims(Link(r, "w1", RECOVERY), 3000)
    a = claims.claim(CID, DIGEST)
    pub.finished(a, "length", 11, 7)
    assert stream(r)[-1] == Finished(
        epoch=a.epoch, finish_reason="length", prompt_tokens=11, completion_tokens=7
    )


def test_claim_marks_the_attempt_running_and_alive(r):
    a = Claims(Link(r, "w1", RECOVERY), 3000).claim(CID, DIGEST)
    assert r.zscore(keys.running(keys.shard(CID)), CID) is not None
    assert r.get(keys.alive(CID)) == str(a.epoch).encode() and 0 < r.pttl(keys.alive(CID)) <= 3000
    assert r.hget(keys.job(CID), JobField.ATTEMPTS) == b"1"
    assert r.hget(keys.job(CID), JobField.WORKER) == b"w1"


def test_terminal_entry_clears_the_running_index(r):
    pub = Publisher(Link(r, "w1", RECOVERY))
    claims = Claims(Link(r, "w1", RECOVERY), 3000)
    a = claims.claim(CID, DIGEST)
    pub.finished(a, "stop", 1, 0)
    assert r.zscore(keys.running(keys.shard(CID)), CID) is None and not r.exists(keys.alive(CID))


def test_beat_refreshes_only_the_current_attempt(r):
    claims = Claims(Link(r, "w1", RECOVERY), 3000)
    a1 = claims.claim(CID, DIGEST)
    beat = r.register_script(attempts.BEAT)
    job = [keys.job(CID), keys.alive(CID)]
    assert beat(keys=job, args=[a1.epoch, 5000, a1.token]) == 1
    assert r.pttl(keys.alive(CID)) > 3000
    r.delete(keys.alive(CID))
    a2 = claims.claim(CID, DIGEST)
    assert beat(keys=job, args=[a1.epoch, 5000, a1.token]) == 0
    assert r.get(keys.alive(CID)) == str(a2.epoch).encode()  # the stale beat changed nothing
    assert beat(keys=job, args=[a2.epoch, 5000, "another claim's token"]) == 0


def test_append_writes_several_entries_of_one_attempt_in_order(r):
    a = Claims(Link(r, "w1", RECOVERY), 3000).claim(CID, DIGEST)
    append = r.register_script(attempts.APPEND)
    batch = [
        Delta(epoch=a.epoch, text="x", token_ids=(1,)),
        Delta(epoch=a.epoch, text="y", token_ids=(2, 3)),
        Finished(epoch=a.epoch, finish_reason="stop", prompt_tokens=1, completion_tokens=3),
    ]
    append(keys=library.job_keys(CID), args=attempts.append_args(CID, a.claim, 0, _new(batch), 60))
    assert stream(r) == batch
    assert r.hget(keys.job(CID), JobField.STATUS) == b"done"


@pytest.mark.parametrize(
    "batch",
    [
        [
            Finished(epoch=1, finish_reason="stop", prompt_tokens=1, completion_tokens=0),
            Delta(epoch=1, text="late", token_ids=(1,)),
        ],  # terminal not last
        [Delta(epoch=1, text="a", token_ids=(1,)), Delta(epoch=2, text="b", token_ids=(2,))],  # two attempts
        [Delta(epoch=0, text="a", token_ids=(1,))],  # not stamped by the attempt
    ],
)
def test_append_args_refuse_malformed_batches(batch):
    with pytest.raises(ValueError):
        attempts.append_args(CID, attempts.Claim(1, "token", "w1", 3000), 0, _new(batch), 60)
    with pytest.raises(ValueError):  # an attempt is stamped with its epoch, never 0
        attempts.append_args(CID, attempts.Claim(0, "token", "w1", 3000), 0, [], 60)


def test_a_burst_of_deltas_is_written_behind_in_order(r):
    pub = Publisher(Link(r, "w1", RECOVERY))
    claims = Claims(Link(r, "w1", RECOVERY), 3000)
    a = claims.claim(CID, DIGEST)
    pub.started(a, 1)
    for i in range(2000):
        pub.delta(a, f"<{i}>", (i,))
    pub.finished(a, "length", 1, 2000)
    texts = [e.text for e in stream(r) if isinstance(e, Delta)]
    assert texts == [f"<{i}>" for i in range(2000)]
    assert a.published == 2000


def test_a_retried_append_writes_nothing_twice(r):
    """A pipeline whose reply was lost (Redis restarted after executing it) is sent again:
    the attempt's entry numbers make the retry skip what was written."""
    a = Claims(Link(r, "w1", RECOVERY), 3000).claim(CID, DIGEST)
    append = r.register_script(attempts.APPEND)
    first = [Delta(epoch=a.epoch, text="x", token_ids=(1,)), Delta(epoch=a.epoch, text="y", token_ids=(2,))]
    ids = append(keys=library.job_keys(CID), args=attempts.append_args(CID, a.claim, 0, _new(first), 60))[1:]
    again = append(keys=library.job_keys(CID), args=attempts.append_args(CID, a.claim, 0, _new(first), 60))
    assert again[1:] == ids  # the retry: nothing written, the ids it had
    more = [*first, Delta(epoch=a.epoch, text="z", token_ids=(3,))]  # retried with one more queued
    append(keys=library.job_keys(CID), args=attempts.append_args(CID, a.claim, 0, _new(more), 60))
    assert [e.text for e in stream(r)] == ["x", "y", "z"]
    with pytest.raises(redis.ResponseError, match="BEHIND 3"):  # a gap is never papered over
        append(keys=library.job_keys(CID), args=attempts.append_args(CID, a.claim, 5, _new(first), 60))


def test_the_publisher_resends_after_a_lost_reply_without_duplicates(r, monkeypatch):
    pub = Publisher(Link(r, "w1", RECOVERY))
    a = Claims(Link(r, "w1", RECOVERY), 3000).claim(CID, DIGEST)
    real = pub._append_all
    lost = []

    def executed_then_lost(todo):
        real(todo)  # Redis wrote it...
        if not lost:
            lost.append(1)
            raise redis.ConnectionError("connection reset")  # ...and the reply never came
        return real(todo)

    monkeypatch.setattr(pub, "_append_all", executed_then_lost)
    pub.delta(a, "once", (1,))
    pub.flush(a)
    assert [e.text for e in stream(r)] == ["once"] and a.written == 1 and a.published == 1


def test_a_retried_claim_returns_the_same_attempt(r):
    claim = r.register_script(attempts.CLAIM)
    args = attempts.claim_args("w1", CID, 3000, 60, "token-1", DIGEST)
    first = claim(keys=library.job_keys(CID), args=args)
    again = claim(keys=library.job_keys(CID), args=args)  # its reply was lost: sent again
    assert first == again and first[0] == 1
    assert r.hget(keys.job(CID), JobField.ATTEMPTS) == b"1"
    other_args = attempts.claim_args("w2", CID, 3000, 60, "token-2", DIGEST)
    assert claim(keys=library.job_keys(CID), args=other_args)[0] == -3  # alive: a duplicate entry
    r.delete(keys.alive(CID))
    other = claim(keys=library.job_keys(CID), args=other_args)
    assert other[0] == 2


def test_a_suspect_is_cleared_only_by_the_job_s_current_attempt(r):
    """A suspect that went on past where its batch died is cleared, so that a later death
    is no longer charged to it; an attempt fenced out meanwhile clears nothing."""
    claims = Claims(Link(r, "w1", RECOVERY), 3000)
    a = claims.claim(CID, DIGEST)
    assert abandon(r, a.epoch, charge=False, suspect_after=1) == 1
    old = claims.claim(CID, DIGEST)
    assert old.suspect
    assert abandon(r, old.epoch, charge=False, suspect_after=1) == 1  # its worker froze...
    new = claims.claim(CID, DIGEST)  # ...and another took the job over
    assert not claims.clear_suspect(old)
    assert r.hget(keys.job(CID), JobField.SUSPECT) == b"1"
    forged = dataclasses.replace(new, token="not-the-claim")
    assert not claims.clear_suspect(forged)
    assert claims.clear_suspect(new)
    assert r.hget(keys.job(CID), JobField.SUSPECT) is None


def test_a_cleared_suspect_s_charged_deaths_start_again(r):
    """MAX_ATTEMPTS counts deaths in a row where the job stands: a job that went on past
    where it died is no poison, and deaths charged before (a lone job on a preemptible GPU, a
    suspect whose worker was killed meanwhile) no longer count toward ending it."""
    claims = Claims(Link(r, "w1", RECOVERY), 3000)
    for _ in range(3):
        a = claims.claim(CID, DIGEST)
        assert abandon(r, a.epoch, max_attempts=2, charge=True, suspect_after=1) == 1
        assert r.hget(keys.job(CID), JobField.CHARGED) == b"1"
        b = claims.claim(CID, DIGEST)
        assert b.suspect and claims.clear_suspect(b)
        assert r.hget(keys.job(CID), JobField.CHARGED) is None
        assert abandon(r, b.epoch, max_attempts=2, charge=False) == 1  # a bystander's death
    assert r.hget(keys.job(CID), JobField.STATUS) == b"queued"  # three charged deaths, none in a row


def test_a_claim_runs_only_the_spec_the_api_recorded(r):
    claim = r.register_script(attempts.CLAIM)
    planted = claim(keys=library.job_keys(CID), args=attempts.claim_args("w1", CID, 3000, 60, "t", "other"))
    assert planted[0] == -2
    assert r.hget(keys.job(CID), JobField.EPOCH) == b"0"  # nothing changed: no attempt fenced
    with pytest.raises(NotRecorded):
        Claims(Link(r, "w1", RECOVERY), 3000).claim(CID, "other")


def test_a_cleared_suspect_loses_its_group(r):
    claims = Claims(Link(r, "w1", RECOVERY), 3000)
    r.hset(keys.job(CID), mapping={JobField.SUSPECT: "1", JobField.GROUP: "0"})
    a = claims.claim(CID, DIGEST)
    assert abandon(r, a.epoch, charge=False, group=4) == 1
    b = claims.claim(CID, DIGEST)
    assert b.group == 2 and claims.clear_suspect(b)
    assert r.hget(keys.job(CID), JobField.GROUP) is None


def _claim(r, token: str = "token-1", worker: str = "w1") -> attempts.Claim:
    """CLAIM the job as a worker would, returning what its writes are checked against."""
    claim = r.register_script(attempts.CLAIM)
    epoch = claim(keys=library.job_keys(CID), args=attempts.claim_args(worker, CID, 3000, 60, token, DIGEST))[
        0
    ]
    return attempts.Claim(epoch, token, worker, 3000)


def test_a_claim_of_an_ended_job_is_refused_and_changes_nothing(r):
    r.hset(keys.job(CID), JobField.ENDED, "1")
    claim = r.register_script(attempts.CLAIM)
    args = attempts.claim_args("w1", CID, 3000, 60, "t", DIGEST)
    assert args == ["w1", CID, "3000", "60", "t", DIGEST]
    assert claim(keys=library.job_keys(CID), args=args) == [0, 0, 0, 0]
    assert r.hget(keys.job(CID), JobField.EPOCH) == b"0" and not r.exists(keys.alive(CID))


def test_fail_ends_the_attempt_s_own_job_with_its_entry(r):
    mine = _claim(r)
    r.hset(keys.job(CID), JobField.SPEC, "{}")
    fail = r.register_script(attempts.FAIL)
    full = errors.STORAGE_FULL.entry(epoch=mine.epoch)
    args = attempts.fail_args(CID, mine, full, 60)
    assert args[:4] == [str(mine.epoch), "token-1", "60", CID]
    assert fail(keys=library.job_keys(CID), args=args) == 1
    assert stream(r) == [dataclasses.replace(full, epoch=mine.epoch + 1)]
    assert r.hmget(keys.job(CID), JobField.STATUS, JobField.ENDED, JobField.SPEC) == [b"failed", b"1", None]
    assert not r.exists(keys.alive(CID)) and r.zscore(keys.running(keys.shard(CID)), CID) is None
    assert 0 < r.ttl(keys.job(CID)) <= 60
    assert fail(keys=library.job_keys(CID), args=args) == 0  # once ended, never again
    assert len(stream(r)) == 1


def test_fail_of_an_attempt_no_longer_current_does_nothing(r):
    mine = _claim(r)
    fail = r.register_script(attempts.FAIL)
    full = errors.STORAGE_FULL.entry()
    forged = dataclasses.replace(mine, token="another claim's")
    assert fail(keys=library.job_keys(CID), args=attempts.fail_args(CID, forged, full, 60)) == 0
    stale = dataclasses.replace(mine, epoch=mine.epoch - 1)
    assert fail(keys=library.job_keys(CID), args=attempts.fail_args(CID, stale, full, 60)) == 0
    assert stream(r) == [] and r.hget(keys.job(CID), JobField.STATUS) == b"running"
    assert r.exists(keys.alive(CID))


def test_beat_tells_an_attempt_whose_claim_a_failover_lost_from_one_fenced_out(r):
    mine = _claim(r)
    beat = r.register_script(attempts.BEAT)
    where = [keys.job(CID), keys.alive(CID)]
    r.hset(keys.job(CID), mapping={JobField.EPOCH: mine.epoch - 1, JobField.STATUS: JobStatus.QUEUED})
    r.hdel(keys.job(CID), JobField.CLAIM)  # the replica promoted never saw the claim
    assert beat(keys=where, args=[mine.epoch, 5000, mine.token]) == 2
    r.hset(keys.job(CID), mapping={JobField.EPOCH: mine.epoch, JobField.ENDED: "1"})
    assert beat(keys=where, args=[mine.epoch, 5000, mine.token]) == 0  # its job ended meanwhile
    r.delete(keys.job(CID))
    assert beat(keys=where, args=[mine.epoch, 5000, mine.token]) == 0  # gone


def test_an_append_after_a_failover_lost_the_claim_claims_again(r):
    mine = _claim(r)
    r.hset(
        keys.job(CID), mapping={JobField.EPOCH: 0, JobField.STATUS: JobStatus.QUEUED, JobField.ATTEMPTS: 0}
    )
    r.hdel(keys.job(CID), JobField.CLAIM, JobField.WORKER, JobField.SEQ)
    r.delete(keys.alive(CID), keys.running(keys.shard(CID)))
    r.zadd(keys.pending(keys.shard(CID)), {CID: 1})
    append = r.register_script(attempts.APPEND)
    delta = Delta(epoch=mine.epoch, text="a", token_ids=(1,))
    out = append(keys=library.job_keys(CID), args=attempts.append_args(CID, mine, 0, [("*", delta)], 60))
    assert out[0] == 0 and len(out) == 2
    job = r.hmget(
        keys.job(CID), JobField.EPOCH, JobField.STATUS, JobField.WORKER, JobField.CLAIM, JobField.SEQ
    )
    assert job == [str(mine.epoch).encode(), b"running", b"w1", b"token-1", b"1"]
    assert r.hget(keys.job(CID), JobField.ATTEMPTS) == b"1"
    assert r.get(keys.alive(CID)) == str(mine.epoch).encode() and 0 < r.pttl(keys.alive(CID)) <= 3000
    assert r.zscore(keys.running(keys.shard(CID)), CID) is not None
    assert r.zscore(keys.pending(keys.shard(CID)), CID) is None
    assert stream(r) == [delta]


def test_an_append_is_fenced_by_another_claim_of_its_epoch_or_an_end_its_claim_missed(r):
    mine = _claim(r)
    append = r.register_script(attempts.APPEND)
    delta = Delta(epoch=mine.epoch, text="a", token_ids=(1,))
    other = dataclasses.replace(mine, token="token-2")
    with pytest.raises(redis.ResponseError, match=r"^FENCED claimed again after a failover$"):
        append(keys=library.job_keys(CID), args=attempts.append_args(CID, other, 0, [("*", delta)], 60))
    ahead = dataclasses.replace(mine, epoch=mine.epoch + 1)
    r.hset(keys.job(CID), JobField.ENDED, "1")
    ahead_delta = Delta(epoch=ahead.epoch, text="a", token_ids=(1,))
    with pytest.raises(redis.ResponseError, match=r"^FENCED job ended$"):
        append(keys=library.job_keys(CID), args=attempts.append_args(CID, ahead, 0, [("*", ahead_delta)], 60))
    assert stream(r) == [] and r.hget(keys.job(CID), JobField.EPOCH) == str(mine.epoch).encode()
