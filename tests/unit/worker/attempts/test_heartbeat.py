import fakeredis

from contract import keys
from contract.keys import JobField
from contract.settings import Recovery
from tests.unit.recorded import DIGEST, record_queued
from worker.attempts.attempt import Claims
from worker.attempts.heartbeat import Heartbeat
from worker.redis.link import Link

RECOVERY = Recovery(retention_s=60)

CID = "chatcmpl-hb"


def setup():
    r = fakeredis.FakeRedis()
    record_queued(r, CID)
    attempt = Claims(Link(r, "w1", RECOVERY), 3000).claim(CID, DIGEST)
    return r, attempt


def test_beats_keep_a_progressing_attempt_alive():
    r, a = setup()
    hb = Heartbeat(r, window_ms=5000, interval_s=1, stall_s=60)
    hb.track(a)
    r.delete(keys.alive(CID))
    hb.beat()
    assert r.pttl(keys.alive(CID)) > 3000 and not a.fenced


def test_a_stalled_attempt_is_no_longer_beaten_for():
    r, a = setup()
    hb = Heartbeat(r, window_ms=5000, interval_s=1, stall_s=60)
    hb.track(a)
    a.progress_at -= 61  # stuck in a native call: no token for longer than stall_s
    r.delete(keys.alive(CID))
    hb.beat()
    assert not r.exists(keys.alive(CID))


def test_a_fenced_attempt_learns_it_from_the_beat():
    r, a = setup()
    hb = Heartbeat(r, window_ms=5000, interval_s=1)
    hb.track(a)
    r.hincrby(keys.job(CID), JobField.EPOCH, 1)
    hb.beat()
    assert a.fenced


def test_untracked_attempts_are_not_beaten():
    r, a = setup()
    hb = Heartbeat(r, window_ms=5000, interval_s=1)
    hb.track(a)
    hb.untrack(a)
    r.delete(keys.alive(CID))
    hb.beat()
    assert not r.exists(keys.alive(CID))
