"""worker/intake/lending.py: when a worker lends the slots kept for interactive jobs, and for which
waiting job it calls one back (fakeredis: the look and the claim are plain commands)."""

from __future__ import annotations

import time

import fakeredis

from contract import keys, tiers
from worker.intake.lending import Lending

MODEL = "m"


def lending(r, lend_after_s: float = 0.05) -> Lending:
    return Lending(r, MODEL, "w1", batch_slots=3, lend_slots=4, lend_after_s=lend_after_s, poll_s=0.01)


def queue(tier: str) -> str:
    name = tiers.suspect_queue_name(MODEL) if tier == "suspect" else tiers.queue_name(MODEL, tier)
    return keys.rq_queue_key(name)


def test_the_kept_slots_are_lent_only_after_a_quiet_spell_and_never_when_off():
    r = fakeredis.FakeRedis()
    on, off = lending(r), lending(r, lend_after_s=0)
    assert on.batch_limit(False) == off.batch_limit(False) == 3  # a new worker waits too
    time.sleep(0.06)
    assert (on.batch_limit(False), off.batch_limit(False)) == (4, 3)
    on.interactive_started()
    assert on.batch_limit(False) == 3
    assert on.lent(4) and not on.lent(3)


def test_lent_slots_go_to_lines_only_while_no_interactive_job_runs():
    r = fakeredis.FakeRedis()
    half = Lending(r, MODEL, "w1", batch_slots=8, lend_slots=16, lend_after_s=0.05, poll_s=0.01)
    time.sleep(0.06)
    assert half.batch_limit(interactive_running=False) == 16
    assert half.batch_limit(interactive_running=True) == 8  # lines end; none is taken past 8
    assert half.lent(9) and not half.lent(8)  # a full worker calls a lent line back
    half.interactive_started()
    assert half.batch_limit(interactive_running=False) == 8  # it ended, but only just


def test_a_job_is_called_back_for_once_it_waited_two_looks_and_by_one_worker_only():
    r = fakeredis.FakeRedis()
    a, b = lending(r), lending(r)
    assert a.call_back() is None  # nothing waits
    r.rpush(queue("default"), "job-1")
    assert a.call_back() is None  # just queued: an idle worker may be taking it now
    assert b.call_back() is None
    assert a.call_back() == "job-1"  # still there on the next look
    assert b.call_back() is None  # a claimed it: one batch line per waiting job
    r.lpop(queue("default"))
    r.rpush(queue("priority"), "job-2")
    a.call_back()
    assert a.call_back() == "job-2"


def test_batch_lines_waiting_are_not_interactive_demand():
    r = fakeredis.FakeRedis()
    a = lending(r)
    r.rpush(queue(tiers.BATCH), "line-1")
    r.rpush(queue("suspect"), "line-2")  # a batch line whose worker died waits here too
    assert a.call_back() is None and a.call_back() is None
    assert queue("default") in a.interactive_queues and queue("suspect") not in a.interactive_queues
