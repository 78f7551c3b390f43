"""contract/lua/jobs.py on fakeredis with real Lua: RECORD, END, END_IF_LATE, ABANDON's requeues,
charges, suspects and groups, and INDEXES over every shard."""

from __future__ import annotations

import dataclasses

import fakeredis
import pytest

from contract import entries, errors, keys
from contract.entries import Failed, Finished
from contract.keys import JobField, JobStatus
from contract.lua import jobs, library
from contract.settings import Recovery
from tests.unit.contract.lua.job import CID, RECOVERY, abandon, stream
from tests.unit.recorded import DIGEST
from worker.attempts.attempt import Claims, Fenced
from worker.attempts.publisher import Publisher
from worker.redis.link import Link


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


def test_abandon_requeues_and_fences_out_the_dead_attempt(r):
    pub = Publisher(Link(r, "w1", RECOVERY))
    claims = Claims(Link(r, "w1", RECOVERY), 3000)
    a = claims.claim(CID, DIGEST)
    pub.delta(a, "x", (1,))
    pub.flush(a)
    assert abandon(r, a.epoch) == 1
    assert r.hget(keys.job(CID), JobField.STATUS) == b"queued"
    assert r.zscore(keys.running(keys.shard(CID)), CID) is None
    with pytest.raises(Fenced):
        pub.delta(a, "y", (2,))
        pub.flush(a)
    assert abandon(r, a.epoch) == 0  # idempotent: that attempt is no longer current
    b = claims.claim(CID, DIGEST)
    assert b.epoch > a.epoch
    assert claims.progress(CID).token_ids == (1,)


def test_abandon_after_the_last_attempt_ends_with_worker_lost(r):
    claims = Claims(Link(r, "w1", RECOVERY), 3000)
    a = claims.claim(CID, DIGEST)
    assert abandon(r, a.epoch, max_attempts=1) == 2
    last = stream(r)[-1]
    assert isinstance(last, Failed) and last.code == "worker_lost"
    assert r.hget(keys.job(CID), JobField.STATUS) == b"failed"


def test_a_death_charged_or_not(r):
    """Uncharged deaths (a bystander in a batch) requeue up to MAX_REQUEUES; charged ones
    end the job after MAX_ATTEMPTS; a suspect mark stays and routes the continuation."""
    claims = Claims(Link(r, "w1", RECOVERY), 3000)
    for _ in range(5):
        a = claims.claim(CID, DIGEST)
        assert abandon(r, a.epoch, max_attempts=2, charge=False, suspect_after=1) == 1
    assert r.hget(keys.job(CID), JobField.SUSPECT) == b"1"
    assert r.hget(keys.job(CID), JobField.CHARGED) is None
    a = claims.claim(CID, DIGEST)
    assert a.suspect
    assert abandon(r, a.epoch, max_attempts=2, charge=True) == 1
    a = claims.claim(CID, DIGEST)
    assert abandon(r, a.epoch, max_attempts=2, charge=True) == 2  # the second charged death
    assert stream(r)[-1].code == "worker_lost"


def test_a_job_that_went_on_is_cleared_of_its_charges_stalls_and_suspicion(r):
    """An attempt that wrote SUSPECT_TOKENS tokens (after its Started entry) went on past
    where the job last died: whoever killed its worker, it was not the job, so the death is
    not charged, its earlier charges and stalls no longer count, and it is no suspect."""
    pub = Publisher(Link(r, "w1", RECOVERY))
    claims = Claims(Link(r, "w1", RECOVERY), 3000)
    a = claims.claim(CID, DIGEST)
    assert abandon(r, a.epoch, charge=True, suspect_after=1) == 1  # alone, standing still
    assert r.hmget(keys.job(CID), JobField.CHARGED, JobField.STALLS, JobField.SUSPECT) == [b"1", b"1", b"1"]
    b = claims.claim(CID, DIGEST)
    pub.started(b, 3)
    for token in range(RECOVERY.suspect_tokens):
        pub.delta(b, "x", (token,))
    pub.flush(b)
    assert abandon(r, b.epoch, charge=True, suspect_after=1) == 1
    assert r.hmget(keys.job(CID), JobField.CHARGED, JobField.STALLS, JobField.SUSPECT) == [None] * 3
    assert r.hget(keys.job(CID), JobField.REQUEUES) == b"1"  # only the standing still one counts


def test_a_batch_job_standing_still_becomes_a_suspect_at_its_second_stall(r):
    pub = Publisher(Link(r, "w1", RECOVERY))
    claims = Claims(Link(r, "w1", RECOVERY), 3000)
    a = claims.claim(CID, DIGEST)
    pub.started(a, 3)
    pub.delta(a, "x", (1,))  # one token: SUSPECT_TOKENS is two
    pub.flush(a)
    assert abandon(r, a.epoch, charge=False, suspect_after=2) == 1
    assert r.hget(keys.job(CID), JobField.STALLS) == b"1" and r.hget(keys.job(CID), JobField.SUSPECT) is None
    b = claims.claim(CID, DIGEST)
    assert abandon(r, b.epoch, charge=False, suspect_after=0) == 1  # a death a suspect explains
    assert r.hget(keys.job(CID), JobField.STALLS) == b"1"
    c = claims.claim(CID, DIGEST)
    assert abandon(r, c.epoch, charge=False, suspect_after=2) == 1
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
        assert a.suspect and abandon(r, a.epoch, charge=False, group=stepped) == 1
    assert groups == [0, 13, 7, 7, 4]  # a larger group later does not widen it
    assert int(r.hget(keys.job(CID), JobField.GROUP)) == 1 and r.hget(keys.job(CID), JobField.CHARGED) is None
    a = claims.claim(CID, DIGEST)
    pub.started(a, 3)
    for token in range(RECOVERY.suspect_tokens):
        pub.delta(a, "x", (token,))
    pub.flush(a)
    assert abandon(r, a.epoch, charge=False, group=8) == 1  # it went on: nobody's culprit
    assert r.hmget(keys.job(CID), JobField.SUSPECT, JobField.GROUP) == [None, None]


def test_a_suspect_an_earlier_release_marked_steps_alone(r):
    """Its reaper wrote no group: this release's worker runs it alone, as that one did, and a
    death among others does not widen it."""
    claims = Claims(Link(r, "w1", RECOVERY), 3000)
    r.hset(keys.job(CID), JobField.SUSPECT, "1")
    a = claims.claim(CID, DIGEST)
    assert a.suspect and a.group == 1
    assert abandon(r, a.epoch, charge=False, group=4) == 1
    assert claims.claim(CID, DIGEST).group == 1


def test_a_new_suspect_may_step_in_any_group_whatever_it_had_before(r):
    """A group left from an earlier suspicion (an earlier worker's clear kept it) is reset."""
    claims = Claims(Link(r, "w1", RECOVERY), 3000)
    r.hset(keys.job(CID), JobField.GROUP, "2")
    a = claims.claim(CID, DIGEST)
    assert abandon(r, a.epoch, charge=True, suspect_after=1) == 1
    assert r.hmget(keys.job(CID), JobField.SUSPECT, JobField.GROUP) == [b"1", b"0"]


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
        assert abandon(r, a.epoch, charge=False, max_requeues=3) == 1
    assert r.hget(keys.job(CID), JobField.REQUEUES) is None


def test_requeues_are_bounded_even_uncharged(r):
    claims = Claims(Link(r, "w1", RECOVERY), 3000)
    outcomes = []
    for _ in range(4):
        a = claims.claim(CID, DIGEST)
        outcomes.append(abandon(r, a.epoch, charge=False, max_requeues=3))
    assert outcomes == [1, 1, 1, 2]


def test_preemptions_do_not_use_up_the_requeues(r):
    """A batch line given back to make room is requeued however often that happens: only
    deaths and hand-offs count toward MAX_REQUEUES."""
    claims = Claims(Link(r, "w1", RECOVERY), 3000)
    for _ in range(6):
        a = claims.claim(CID, DIGEST)
        assert abandon(r, a.epoch, charge=False, max_requeues=3, counted=False) == 1
    assert r.hget(keys.job(CID), JobField.REQUEUES) in (None, b"0")
    a = claims.claim(CID, DIGEST)
    assert abandon(r, a.epoch, charge=False, max_requeues=3) == 1  # counted: the first of three


def test_a_requeue_may_wait_until_the_jobs_wait_until(r):
    """A requeued batch line keeps its batch's window to find a slot, not RESUME_WAIT alone."""
    a = Claims(Link(r, "w1", RECOVERY), 3000).claim(CID, DIGEST)
    window_end = int(r.time()[0]) * 1000 + 3_600_000
    r.hset(keys.job(CID), JobField.WAIT_UNTIL, window_end)
    abandon(r, a.epoch, charge=False)
    assert int(r.hget(keys.job(CID), JobField.START_BY)) == window_end
    r.hset(keys.job(CID), JobField.WAIT_UNTIL, 1)  # long past: the resume wait applies
    b = Claims(Link(r, "w1", RECOVERY), 3000).claim(CID, DIGEST)
    abandon(r, b.epoch, charge=False)
    start_by = int(r.hget(keys.job(CID), JobField.START_BY))
    assert 0 < start_by - int(r.time()[0]) * 1000 <= 31_000


def test_a_requeued_job_is_pending_until_enqueued(r):
    a = Claims(Link(r, "w1", RECOVERY), 3000).claim(CID, DIGEST)
    assert r.zscore(keys.pending(keys.shard(CID)), CID) is None  # a claim ends pending
    abandon(r, a.epoch, charge=False)
    assert r.zscore(keys.pending(keys.shard(CID)), CID) is not None


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


def test_record_writes_a_new_job_once_and_leaves_it_pending():
    r = fakeredis.FakeRedis()
    job_id = "chatcmpl-new"
    record = r.register_script(jobs.RECORD)
    where = [keys.job(job_id), keys.pending(keys.shard(job_id))]
    fields = [JobField.STATUS, JobStatus.QUEUED, JobField.EPOCH, "0", JobField.MODEL, "m"]
    assert record(keys=where, args=[job_id, 600, *fields]) == 1
    assert r.hgetall(keys.job(job_id)) == {b"status": b"queued", b"epoch": b"0", b"model": b"m"}
    assert 590 < r.ttl(keys.job(job_id)) <= 600
    seconds, micros = r.time()
    assert abs(r.zscore(keys.pending(keys.shard(job_id)), job_id) - (seconds * 1000 + micros // 1000)) < 2000
    # the same id again (a retried request): nothing of the first is changed
    assert record(keys=where, args=[job_id, 5, JobField.MODEL, "other", JobField.OWNER, "o"]) == 0
    assert (
        r.hget(keys.job(job_id), JobField.MODEL) == b"m" and r.hget(keys.job(job_id), JobField.OWNER) is None
    )
    assert r.ttl(keys.job(job_id)) > 590


def test_end_of_a_vanished_job_writes_nothing(r):
    r.delete(keys.job(CID))
    end = r.register_script(jobs.END)
    args = jobs.end_args(CID, errors.DEADLINE.entry(), 60)
    assert end(keys=library.job_keys(CID), args=args) == 0
    assert not r.exists(keys.events(CID), keys.job(CID))


def test_end_with_a_cancel_stamps_the_next_epoch_and_marks_the_job_cancelled(r):
    end = r.register_script(jobs.END)
    cancelled = Finished(epoch=9, finish_reason=entries.CANCELLED, prompt_tokens=4, completion_tokens=0)
    args = jobs.end_args(CID, cancelled, 60, only_if_status=JobStatus.QUEUED)
    assert args[:4] == [JobStatus.CANCELLED, "60", JobStatus.QUEUED, CID]
    assert end(keys=library.job_keys(CID), args=args) == 1
    assert stream(r) == [dataclasses.replace(cancelled, epoch=1)]  # the entry's own epoch is ignored
    assert r.hmget(keys.job(CID), JobField.STATUS, JobField.ENDED) == [b"cancelled", b"1"]


def test_end_if_late_leaves_a_job_that_is_not_late_alone(r):
    end_if_late = r.register_script(jobs.END_IF_LATE)
    args = jobs.end_if_late_args(CID, 60)
    assert args == [CID, "60"]
    assert end_if_late(keys=library.job_keys(CID), args=args) == 0  # no START_BY: never late
    r.hset(keys.job(CID), JobField.START_BY, int(r.time()[0]) * 1000 + 60_000)
    assert end_if_late(keys=library.job_keys(CID), args=args) == 0  # not yet
    r.hset(keys.job(CID), mapping={JobField.START_BY: 1, JobField.STATUS: JobStatus.RUNNING})
    assert end_if_late(keys=library.job_keys(CID), args=args) == 0  # started in time
    r.hset(keys.job(CID), JobField.STATUS, JobStatus.QUEUED)
    assert end_if_late(keys=library.job_keys(CID), args=args) == 1
    assert stream(r) == [errors.QUEUE_TIMEOUT.entry(epoch=1)]
    assert (
        end_if_late(keys=library.job_keys("chatcmpl-none"), args=jobs.end_if_late_args("chatcmpl-none", 60))
        == 0
    )


def test_abandon_of_an_ended_job_only_drops_it_from_the_running_index(r):
    a = Claims(Link(r, "w1", RECOVERY), 3000).claim(CID, DIGEST)
    r.hset(keys.job(CID), JobField.ENDED, "1")
    r.zadd(keys.running(keys.shard(CID)), {CID: 5})  # a stale index entry
    assert abandon(r, a.epoch) == 0
    assert r.zscore(keys.running(keys.shard(CID)), CID) is None
    assert r.hget(keys.job(CID), JobField.EPOCH) == str(a.epoch).encode()  # nothing else changed
    assert r.zscore(keys.pending(keys.shard(CID)), CID) is None


def test_abandon_reports_a_charged_death_and_the_requeue_s_suspect_group(r):
    script = r.register_script(jobs.ABANDON)
    a = Claims(Link(r, "w1", RECOVERY), 3000).claim(CID, DIGEST)
    args = jobs.abandon_args(CID, a.epoch, charge=True, suspect_after=1, recovery=RECOVERY)
    assert script(keys=library.job_keys(CID), args=args) == [1, 1, 1, 0]  # requeued, suspect, charged, any
    b = Claims(Link(r, "w1", RECOVERY), 3000).claim(CID, DIGEST)
    args = jobs.abandon_args(CID, b.epoch, charge=False, suspect_after=0, recovery=RECOVERY, group=6)
    assert script(keys=library.job_keys(CID), args=args) == [1, 1, 0, 3]  # died among six: three at most
    assert r.hget(keys.job(CID), JobField.WORKER) is None and r.hget(keys.job(CID), JobField.CLAIM) is None


def test_abandon_args_carry_the_recovery_settings_in_script_units():
    recovery = Recovery(max_attempts=4, max_requeues=9, suspect_tokens=5, resume_wait_s=2.5, retention_s=70)
    args = jobs.abandon_args("j", 3, charge=True, suspect_after=2, recovery=recovery, counted=False, group=8)
    assert args == ["3", "j", "1", "2", "4", "9", "2500", "70", "0", "6", "8"]


def test_index_keys_pair_each_shard_s_running_and_pending_indexes():
    (single,) = jobs.index_keys(cluster=False)
    assert single[:4] == [keys.running(0), keys.pending(0), keys.running(1), keys.pending(1)]
    assert len(single) == 2 * keys.SHARDS
    per_shard = jobs.index_keys(cluster=True)
    assert per_shard[7] == [keys.running(7), keys.pending(7)]
    assert all(keys.shard_of_key(a) == keys.shard_of_key(b) for a, b in per_shard)
