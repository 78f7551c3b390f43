"""worker/attempts/attempt.py: an attempt carries one state, moved by name, and its flags
read as the flags they replace did, combinations included (the claim on fakeredis)."""

from __future__ import annotations

import threading

import fakeredis
import pytest

from contract import keys
from contract.keys import JobField
from contract.lifecycle.attempt import IllegalMove
from contract.settings import Recovery
from tests.unit.recorded import DIGEST, record_queued
from worker.attempts.attempt import Attempt, Claims, Fenced
from worker.redis.link import Link

CID = "chatcmpl-attempt"


def started(suspect: bool = False) -> Attempt:
    a = Attempt(CID, 1, from_suspects=suspect)
    a.move("start")
    return a


def test_a_new_attempt_is_claimed_and_starts_running_or_proving_for_a_suspect():
    a = Attempt(CID, 1)
    assert (a.state, a.made) == ("claimed", ("claim",))
    assert not (a.fenced or a.cancelled or a.preempted or a.ended or a.suspect or a.resumed)
    assert a.move("start") == "running"
    s = started(suspect=True)
    assert s.state == "proving" and s.suspect
    assert s.move("clear") == "running" and not s.suspect and s.from_suspects


def test_an_illegal_move_is_refused_and_leaves_the_state_as_it_was():
    a = started()
    with pytest.raises(IllegalMove):
        a.move("clear")  # not a suspect
    with pytest.raises(IllegalMove):
        a.move("start")
    assert (a.state, a.made) == ("running", ("claim", "start"))
    a.move("hand off")
    with pytest.raises(IllegalMove):
        a.move("end")


def test_a_cancel_and_a_preemption_both_hold_in_either_order():
    """The text path answers the cancel first, an embedding the preemption: both are read."""
    first = started()
    assert first.move("preempt") == "yielding" and first.move("cancel") == "stopping"
    second = started()
    assert second.move("cancel") == "stopping" and second.move("preempt") == "stopping"
    assert all(a.cancelled and a.preempted and not a.ended for a in (first, second))


def test_asks_that_come_late_still_count():
    """The runner may pick a line that just ended (it is still counted as running), and a
    resent write's reply may say a cancel is due: both read true afterwards, as before."""
    a = started()
    a.move("end")
    assert a.move("preempt") == "ended" == a.move("cancel") and a.preempted and a.cancelled


def test_a_beat_that_fences_an_ended_attempt_leaves_it_ended():
    a = started()
    a.move("end")
    assert a.move("fence") == "fenced" and a.fenced and a.ended
    assert a.move("fence") == "fenced" and a.made == ("claim", "start", "end", "fence")
    with pytest.raises(Fenced):
        a.check()


def test_a_suspect_stays_one_until_cleared_whatever_its_state():
    s = Attempt(CID, 2, from_suspects=True)
    assert s.suspect and s.move("cancel") == "stopping" and s.move("start") == "stopping"
    assert s.suspect and s.move("clear") == "stopping" and not s.suspect


def test_moves_from_several_threads_at_once_all_count():
    """The heartbeat fences, the writer learns a cancel, the runner preempts: in any order."""
    a = started()
    names = ["fence", "cancel", "preempt"] * 50
    threads = [threading.Thread(target=a.move, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert a.state == "fenced" and a.preempted and a.cancelled
    assert sorted(a.made) == sorted(["claim", "start", *set(names)])  # each once: fenced stays fenced


def test_a_claim_that_finds_a_cancel_due_is_stopping_from_the_start():
    r = fakeredis.FakeRedis()
    record_queued(r, CID)
    r.hset(keys.job(CID), JobField.CANCEL_AT, 0)
    a = Claims(Link(r, "w1", Recovery(retention_s=60)), 3000).claim(CID, DIGEST)
    assert (a.state, a.made) == ("stopping", ("claim", "cancel")) and a.cancelled
