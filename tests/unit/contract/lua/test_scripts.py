"""The fenced Lua scripts, on fakeredis with real Lua (lupa)."""

import dataclasses

import fakeredis
import pytest
import redis

from contract import entries, keys, tiers
from contract.entries import Delta, Failed, Finished
from contract.keys import JobField, JobStatus
from contract.lua import attempts, jobs, library, queues
from contract.settings import Recovery
from tests.unit.recorded import DIGEST, record_queued
from worker.attempts.attempt import Claims, Fenced, JobGone, NotRecorded
from worker.attempts.publisher import Publisher
from worker.redis.link import Link

RECOVERY = Recovery(retention_s=60)

CID = "chatcmpl-test"


@pytest.fixture
def r():
    client = fakeredis.FakeRedis()
    record_queued(client, CID)
    client.expire(keys.job(CID), 1000)
    return client


def stream(r):
    return [entries.decode(f) for _, f in r.xrange(keys.events(CID))]


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


def test_end_fences_out_the_running_attempt(r):
    pub = Publisher(Link(r, "w1", RECOVERY))
    claims = Claims(Link(r, "w1", RECOVERY), 3000)
    a = claims.claim(CID, DIGEST)
    end = r.register_script(jobs.END)
    lost = Failed(epoch=0, message="gone", type="server_error", code="worker_lost")
    assert end(keys=library.job_keys(CID), args=jobs.end_args(CID, lost, 60)) == 1
    assert end(keys=library.job_keys(CID), args=jobs.end_args(CID, lost, 60)) == 0
    assert r.zscore(keys.running(keys.shard(CID)), CID) is None and not r.exists(keys.alive(CID))
    with pytest.raises(Fenced):
        pub.delta(a, "x", (1,))
        pub.flush(a)
    last = stream(r)[-1]
    assert isinstance(last, Failed) and last.code == "worker_lost" and last.epoch == a.epoch + 1
    assert r.hget(keys.job(CID), JobField.STATUS) == b"failed"


def test_end_only_if_status_leaves_a_running_job_alone(r):
    Claims(Link(r, "w1", RECOVERY), 3000).claim(CID, DIGEST)
    end = r.register_script(jobs.END)
    timeout = Failed(epoch=0, message="late", type="server_error", code="queue_timeout")
    args = jobs.end_args(CID, timeout, 60, only_if_status=JobStatus.QUEUED)
    assert end(keys=library.job_keys(CID), args=args) == 0
    assert stream(r) == []


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


def test_a_requeued_job_past_its_deadline_ends_with_worker_lost_unless_a_worker_takes_it(r):
    r.hset(keys.job(CID), mapping={JobField.START_BY: 1, JobField.ATTEMPTS: 1})
    end_if_late = r.register_script(jobs.END_IF_LATE)
    snap = r.dump(keys.job(CID))
    assert end_if_late(keys=library.job_keys(CID), args=jobs.end_if_late_args(CID, 60)) == 1
    assert stream(r)[-1].code == "worker_lost"
    r.delete(keys.job(CID), keys.events(CID))
    r.restore(keys.job(CID), 0, snap)
    # a worker that takes it now is not late: it runs (the pool was working through its queue)
    assert Claims(Link(r, "w1", RECOVERY), 3000).claim(CID, DIGEST).epoch == 1


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


def test_other_redis_errors_are_not_mistaken_for_fencing(r, monkeypatch):
    pub = Publisher(Link(r, "w1", RECOVERY))
    claims = Claims(Link(r, "w1", RECOVERY), 3000)
    a = claims.claim(CID, DIGEST)

    def refused(todo):
        return [redis.ResponseError("OOM command not allowed") for _ in todo]

    monkeypatch.setattr(pub, "_append_all", refused)
    with pytest.raises(redis.ResponseError):
        pub.finished(a, "stop", 1, 1)


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


def _abandon(r, epoch, max_attempts=3, charge=True, suspect_after=0, max_requeues=20, counted=True, group=0):
    script = r.register_script(jobs.ABANDON)
    recovery = dataclasses.replace(RECOVERY, max_attempts=max_attempts, max_requeues=max_requeues)
    args = jobs.abandon_args(
        CID,
        epoch,
        charge=charge,
        suspect_after=suspect_after,
        recovery=recovery,
        counted=counted,
        group=group,
    )
    outcome, _, _, _ = script(keys=library.job_keys(CID), args=args)
    return outcome


def test_abandon_requeues_and_fences_out_the_dead_attempt(r):
    pub = Publisher(Link(r, "w1", RECOVERY))
    claims = Claims(Link(r, "w1", RECOVERY), 3000)
    a = claims.claim(CID, DIGEST)
    pub.delta(a, "x", (1,))
    pub.flush(a)
    assert _abandon(r, a.epoch) == 1
    assert r.hget(keys.job(CID), JobField.STATUS) == b"queued"
    assert r.zscore(keys.running(keys.shard(CID)), CID) is None
    with pytest.raises(Fenced):
        pub.delta(a, "y", (2,))
        pub.flush(a)
    assert _abandon(r, a.epoch) == 0  # idempotent: that attempt is no longer current
    b = claims.claim(CID, DIGEST)
    assert b.epoch > a.epoch
    assert claims.progress(CID).token_ids == (1,)


def test_abandon_after_the_last_attempt_ends_with_worker_lost(r):
    claims = Claims(Link(r, "w1", RECOVERY), 3000)
    a = claims.claim(CID, DIGEST)
    assert _abandon(r, a.epoch, max_attempts=1) == 2
    last = stream(r)[-1]
    assert isinstance(last, Failed) and last.code == "worker_lost"
    assert r.hget(keys.job(CID), JobField.STATUS) == b"failed"


def test_progress_collects_every_published_token_id(r):
    pub = Publisher(Link(r, "w1", RECOVERY))
    claims = Claims(Link(r, "w1", RECOVERY), 3000)
    a = claims.claim(CID, DIGEST)
    pub.started(a, 9)
    pub.delta(a, "ab", (1, 2))
    pub.delta(a, "c", (3,))
    pub.flush(a)
    _abandon(r, a.epoch)
    b = claims.claim(CID, DIGEST)
    pub.started(b, 9)
    pub.delta(b, "d", (4,))
    pub.flush(b)
    p = claims.progress(CID)
    assert p.prompt_tokens == 9 and p.token_ids == (1, 2, 3, 4)


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
    assert _abandon(r, a.epoch, charge=False, suspect_after=1) == 1
    old = claims.claim(CID, DIGEST)
    assert old.suspect
    assert _abandon(r, old.epoch, charge=False, suspect_after=1) == 1  # its worker froze...
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
        assert _abandon(r, a.epoch, max_attempts=2, charge=True, suspect_after=1) == 1
        assert r.hget(keys.job(CID), JobField.CHARGED) == b"1"
        b = claims.claim(CID, DIGEST)
        assert b.suspect and claims.clear_suspect(b)
        assert r.hget(keys.job(CID), JobField.CHARGED) is None
        assert _abandon(r, b.epoch, max_attempts=2, charge=False) == 1  # a bystander's death
    assert r.hget(keys.job(CID), JobField.STATUS) == b"queued"  # three charged deaths, none in a row


def test_a_claim_runs_only_the_spec_the_api_recorded(r):
    claim = r.register_script(attempts.CLAIM)
    planted = claim(keys=library.job_keys(CID), args=attempts.claim_args("w1", CID, 3000, 60, "t", "other"))
    assert planted[0] == -2
    assert r.hget(keys.job(CID), JobField.EPOCH) == b"0"  # nothing changed: no attempt fenced
    with pytest.raises(NotRecorded):
        Claims(Link(r, "w1", RECOVERY), 3000).claim(CID, "other")


def test_a_death_charged_or_not(r):
    """Uncharged deaths (a bystander in a batch) requeue up to MAX_REQUEUES; charged ones
    end the job after MAX_ATTEMPTS; a suspect mark stays and routes the continuation."""
    claims = Claims(Link(r, "w1", RECOVERY), 3000)
    for _ in range(5):
        a = claims.claim(CID, DIGEST)
        assert _abandon(r, a.epoch, max_attempts=2, charge=False, suspect_after=1) == 1
    assert r.hget(keys.job(CID), JobField.SUSPECT) == b"1"
    assert r.hget(keys.job(CID), JobField.CHARGED) is None
    a = claims.claim(CID, DIGEST)
    assert a.suspect
    assert _abandon(r, a.epoch, max_attempts=2, charge=True) == 1
    a = claims.claim(CID, DIGEST)
    assert _abandon(r, a.epoch, max_attempts=2, charge=True) == 2  # the second charged death
    assert stream(r)[-1].code == "worker_lost"


def test_a_job_that_went_on_is_cleared_of_its_charges_stalls_and_suspicion(r):
    """An attempt that wrote SUSPECT_TOKENS tokens (after its Started entry) went on past
    where the job last died: whoever killed its worker, it was not the job, so the death is
    not charged, its earlier charges and stalls no longer count, and it is no suspect."""
    pub = Publisher(Link(r, "w1", RECOVERY))
    claims = Claims(Link(r, "w1", RECOVERY), 3000)
    a = claims.claim(CID, DIGEST)
    assert _abandon(r, a.epoch, charge=True, suspect_after=1) == 1  # alone, standing still
    assert r.hmget(keys.job(CID), JobField.CHARGED, JobField.STALLS, JobField.SUSPECT) == [b"1", b"1", b"1"]
    b = claims.claim(CID, DIGEST)
    pub.started(b, 3)
    for token in range(RECOVERY.suspect_tokens):
        pub.delta(b, "x", (token,))
    pub.flush(b)
    assert _abandon(r, b.epoch, charge=True, suspect_after=1) == 1
    assert r.hmget(keys.job(CID), JobField.CHARGED, JobField.STALLS, JobField.SUSPECT) == [None] * 3
    assert r.hget(keys.job(CID), JobField.REQUEUES) == b"1"  # only the standing still one counts


def test_a_batch_job_standing_still_becomes_a_suspect_at_its_second_stall(r):
    pub = Publisher(Link(r, "w1", RECOVERY))
    claims = Claims(Link(r, "w1", RECOVERY), 3000)
    a = claims.claim(CID, DIGEST)
    pub.started(a, 3)
    pub.delta(a, "x", (1,))  # one token: SUSPECT_TOKENS is two
    pub.flush(a)
    assert _abandon(r, a.epoch, charge=False, suspect_after=2) == 1
    assert r.hget(keys.job(CID), JobField.STALLS) == b"1" and r.hget(keys.job(CID), JobField.SUSPECT) is None
    b = claims.claim(CID, DIGEST)
    assert _abandon(r, b.epoch, charge=False, suspect_after=0) == 1  # a death a suspect explains
    assert r.hget(keys.job(CID), JobField.STALLS) == b"1"
    c = claims.claim(CID, DIGEST)
    assert _abandon(r, c.epoch, charge=False, suspect_after=2) == 1
    assert r.hget(keys.job(CID), JobField.SUSPECT) == b"1" and r.hget(keys.job(CID), JobField.CHARGED) is None


def test_a_suspect_dying_in_a_group_steps_in_groups_half_as_large_after(r):
    """Group testing: a death among g suspects stepping together is none's alone (nobody is
    charged), but each may then step with ceil(g / 2) at most, so a job that kills where it
    stands is alone after log2(g) such deaths; one that goes on is cleared of it."""
    pub = Publisher(Link(r, "w1", RECOVERY))
    claims = Claims(Link(r, "w1", RECOVERY), 3000)
    r.hset(keys.job(CID), mapping={JobField.SUSPECT: "1", JobField.GROUP: "0"})  # in any group
    groups = []
    for stepped in (25, 13, 30, 7, 2):
        a = claims.claim(CID, DIGEST)
        groups.append(a.group)
        assert a.suspect and _abandon(r, a.epoch, charge=False, group=stepped) == 1
    assert groups == [0, 13, 7, 7, 4]  # a larger group later does not widen it
    assert int(r.hget(keys.job(CID), JobField.GROUP)) == 1 and r.hget(keys.job(CID), JobField.CHARGED) is None
    a = claims.claim(CID, DIGEST)
    pub.started(a, 3)
    for token in range(RECOVERY.suspect_tokens):
        pub.delta(a, "x", (token,))
    pub.flush(a)
    assert _abandon(r, a.epoch, charge=False, group=8) == 1  # it went on: nobody's culprit
    assert r.hmget(keys.job(CID), JobField.SUSPECT, JobField.GROUP) == [None, None]


def test_a_suspect_an_earlier_release_marked_steps_alone(r):
    """Its reaper wrote no group: this release's worker runs it alone, as that one did, and a
    death among others does not widen it."""
    claims = Claims(Link(r, "w1", RECOVERY), 3000)
    r.hset(keys.job(CID), JobField.SUSPECT, "1")
    a = claims.claim(CID, DIGEST)
    assert a.suspect and a.group == 1
    assert _abandon(r, a.epoch, charge=False, group=4) == 1
    assert claims.claim(CID, DIGEST).group == 1


def test_a_new_suspect_may_step_in_any_group_whatever_it_had_before(r):
    """A group left from an earlier suspicion (an earlier worker's clear kept it) is reset."""
    claims = Claims(Link(r, "w1", RECOVERY), 3000)
    r.hset(keys.job(CID), JobField.GROUP, "2")
    a = claims.claim(CID, DIGEST)
    assert _abandon(r, a.epoch, charge=True, suspect_after=1) == 1
    assert r.hmget(keys.job(CID), JobField.SUSPECT, JobField.GROUP) == [b"1", b"0"]


def test_a_cleared_suspect_loses_its_group(r):
    claims = Claims(Link(r, "w1", RECOVERY), 3000)
    r.hset(keys.job(CID), mapping={JobField.SUSPECT: "1", JobField.GROUP: "0"})
    a = claims.claim(CID, DIGEST)
    assert _abandon(r, a.epoch, charge=False, group=4) == 1
    b = claims.claim(CID, DIGEST)
    assert b.group == 2 and claims.clear_suspect(b)
    assert r.hget(keys.job(CID), JobField.GROUP) is None


def test_requeues_going_on_are_not_counted(r):
    """MAX_REQUEUES bounds a job standing still; one that goes on between deaths (a bystander
    in a crash storm) is bounded by its own length."""
    pub = Publisher(Link(r, "w1", RECOVERY))
    claims = Claims(Link(r, "w1", RECOVERY), 3000)
    for i in range(6):
        a = claims.claim(CID, DIGEST)
        pub.started(a, 3)
        pub.delta(a, "xy", (2 * i,))
        pub.delta(a, "z", (2 * i + 1,))
        pub.flush(a)
        assert _abandon(r, a.epoch, charge=False, max_requeues=3) == 1
    assert r.hget(keys.job(CID), JobField.REQUEUES) is None


def test_requeues_are_bounded_even_uncharged(r):
    claims = Claims(Link(r, "w1", RECOVERY), 3000)
    outcomes = []
    for _ in range(4):
        a = claims.claim(CID, DIGEST)
        outcomes.append(_abandon(r, a.epoch, charge=False, max_requeues=3))
    assert outcomes == [1, 1, 1, 2]


def test_preemptions_do_not_use_up_the_requeues(r):
    """A batch line given back to make room is requeued however often that happens: only
    deaths and hand-offs count toward MAX_REQUEUES."""
    claims = Claims(Link(r, "w1", RECOVERY), 3000)
    for _ in range(6):
        a = claims.claim(CID, DIGEST)
        assert _abandon(r, a.epoch, charge=False, max_requeues=3, counted=False) == 1
    assert r.hget(keys.job(CID), JobField.REQUEUES) in (None, b"0")
    a = claims.claim(CID, DIGEST)
    assert _abandon(r, a.epoch, charge=False, max_requeues=3) == 1  # counted: the first of three


def test_a_requeue_may_wait_until_the_jobs_wait_until(r):
    """A requeued batch line keeps its batch's window to find a slot, not RESUME_WAIT alone."""
    a = Claims(Link(r, "w1", RECOVERY), 3000).claim(CID, DIGEST)
    window_end = int(r.time()[0]) * 1000 + 3_600_000
    r.hset(keys.job(CID), JobField.WAIT_UNTIL, window_end)
    _abandon(r, a.epoch, charge=False)
    assert int(r.hget(keys.job(CID), JobField.START_BY)) == window_end
    r.hset(keys.job(CID), JobField.WAIT_UNTIL, 1)  # long past: the resume wait applies
    b = Claims(Link(r, "w1", RECOVERY), 3000).claim(CID, DIGEST)
    _abandon(r, b.epoch, charge=False)
    start_by = int(r.hget(keys.job(CID), JobField.START_BY))
    assert 0 < start_by - int(r.time()[0]) * 1000 <= 31_000


def test_a_requeued_job_is_pending_until_enqueued(r):
    a = Claims(Link(r, "w1", RECOVERY), 3000).claim(CID, DIGEST)
    assert r.zscore(keys.pending(keys.shard(CID)), CID) is None  # a claim ends pending
    _abandon(r, a.epoch, charge=False)
    assert r.zscore(keys.pending(keys.shard(CID)), CID) is not None


def test_take_moves_one_id_into_the_inbox_in_queue_order():
    r = fakeredis.FakeRedis()
    take = r.register_script(queues.TAKE)
    r.rpush(keys.rq_queue_key("m"), "new-1")
    r.rpush(keys.rq_queue_key(tiers.suspect_queue_name("m")), "suspect-1")
    names, new = tiers.queue_names("m"), [tiers.queue_name("m")]
    both = queues.take_keys(names, "w1")
    args = queues.take_args(names, tiers.suspect_queue_name("m"), 0)
    assert take(keys=both, args=args)[1] == b"suspect-1"  # suspects first
    new_args = queues.take_args(new, tiers.suspect_queue_name("m"), 0)
    assert take(keys=queues.take_keys(new, "w1"), args=new_args)[1] == b"new-1"
    assert not take(keys=both, args=args)
    assert set(r.hkeys(keys.inbox("w1"))) == {b"suspect-1", b"new-1"}


def test_take_gives_a_worker_only_suspects_that_may_step_with_its_own():
    """A worker running n suspects takes the first waiting one whose group allows n + 1."""
    r = fakeredis.FakeRedis()
    take = r.register_script(queues.TAKE)
    suspects = tiers.suspect_queue_name("m")
    names = list(tiers.queue_names("m"))
    r.rpush(keys.rq_queue_key(suspects), "s-old", "s-2", "s-any", "s-3")
    r.hset(keys.rq_job("s-2"), JobField.GROUP, 2)
    r.hset(keys.rq_job("s-any"), JobField.GROUP, 0)
    r.hset(keys.rq_job("s-3"), JobField.GROUP, 3)
    r.rpush(keys.rq_queue_key(tiers.queue_name("m")), "new-1")

    def taken(stepping: int) -> bytes:
        return take(keys=queues.take_keys(names, "w1"), args=queues.take_args(names, suspects, stepping))[1]

    assert taken(2) == b"s-any"  # a third: not s-2
    assert taken(2) == b"s-3"
    assert taken(2) == b"new-1"  # s-2 waits for a worker with one suspect at most
    assert taken(1) == b"s-2"
    assert taken(0) == b"s-old"  # an earlier release's: no group, alone
    no_suspects = [n for n in names if n != suspects]
    assert (
        take(keys=queues.take_keys(no_suspects, "w1"), args=queues.take_args(no_suspects, suspects, 0))
        is None
    )


@pytest.mark.parametrize("cluster", [False, True])
def test_indexes_reads_every_shard_s_running_and_old_pending_ids(cluster):
    r = fakeredis.FakeRedis()
    running = [f"chatcmpl-run{i}" for i in range(40)]  # more jobs than shards: every shard
    for job_id in running:
        r.zadd(keys.running(keys.shard(job_id)), {job_id: 5})
    old, fresh = [f"chatcmpl-old{i}" for i in range(5)], "chatcmpl-fresh"
    for job_id in old:
        r.zadd(keys.pending(keys.shard(job_id)), {job_id: 100})
    r.zadd(keys.pending(keys.shard(fresh)), {fresh: 300})
    indexes = r.register_script(jobs.INDEXES)
    groups = jobs.index_keys(cluster)
    assert len(groups) == (keys.SHARDS if cluster else 1)
    replies = [indexes(keys=group, args=[200, 64]) for group in groups]
    assert sorted(i.decode() for reply in replies for i in reply[0]) == sorted(running)
    assert sorted(i.decode() for reply in replies for i in reply[1]) == sorted(old)
    replies = [indexes(keys=group, args=["", 64]) for group in groups]
    assert all(reply[1] == [] for reply in replies)  # no pending asked for
    one_each = [indexes(keys=group, args=[200, 1]) for group in groups]
    assert len([i for reply in one_each for i in reply[1]]) == len({keys.shard(c) for c in old})
