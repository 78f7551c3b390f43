"""The publisher's write-behind: what one round trip to Redis carries."""

from __future__ import annotations

import time

import fakeredis
import pytest

from contract import entries, keys
from contract.entries import Delta
from contract.settings import Recovery
from tests.unit.recorded import DIGEST, record_queued
from worker.attempts.attempt import Claims, Fenced
from worker.attempts.publisher import Publisher
from worker.redis.link import Link

RECOVERY = Recovery(retention_s=60)

IDS = [f"chatcmpl-pub{i}" for i in range(4)]
WARM = "chatcmpl-warm"


class CountingPublisher(Publisher):
    """The real publisher, recording the attempts each round trip carries."""

    def __init__(self, *args, **kw) -> None:
        self.trips: list[list[str]] = []
        super().__init__(*args, **kw)

    def _append_all(self, todo):
        self.trips.append([g.attempt.job_id for g in todo])
        return super()._append_all(todo)


def publish_one_step(linger_s: float, gap_s: float = 0.02) -> tuple[CountingPublisher, fakeredis.FakeRedis]:
    r = fakeredis.FakeRedis()
    for job_id in [WARM, *IDS]:
        record_queued(r, job_id)
    pub = CountingPublisher(Link(r, "w1", RECOVERY), linger_s=linger_s)
    claims = Claims(Link(r, "w1", RECOVERY), 3000)
    warm = claims.claim(WARM, DIGEST)  # the first write loads the Lua script into Redis: not counted
    pub.delta(warm, "w", (0,))
    pub.flush(warm)
    pub.trips.clear()
    attempts = [claims.claim(job_id, DIGEST) for job_id in IDS]
    for i, a in enumerate(attempts):  # one batch step: the job threads publish a few ms apart
        pub.delta(a, f"t{i}", (i,))
        time.sleep(gap_s)
    for a in attempts:
        pub.flush(a)
    return pub, r


def test_with_linger_one_round_trip_carries_every_job_of_a_step():
    pub, r = publish_one_step(linger_s=0.5)
    assert pub.trips == [IDS]
    for i, job_id in enumerate(IDS):
        deltas = [entries.decode(f) for _, f in r.xrange(keys.events(job_id))]
        assert deltas == [Delta(epoch=1, text=f"t{i}", token_ids=(i,))]


def test_without_linger_each_delta_is_written_at_once():
    """The deltas come 200 ms apart: a writer slow to wake on a loaded machine (20 ms apart,
    it once carried two in one trip) still has each alone."""
    pub, _ = publish_one_step(linger_s=0.0, gap_s=0.2)
    assert pub.trips == [[job_id] for job_id in IDS]


def test_a_lone_attempt_is_written_without_the_linger():
    """The linger waits for the other slots' tokens of a step: with no other attempt running
    there are none, and it only delayed the first token (bench/stages.py: 2 ms on `Started`
    and again on the first delta)."""
    r = fakeredis.FakeRedis()
    record_queued(r, WARM)
    pub = CountingPublisher(Link(r, "w1", RECOVERY), linger_s=5.0, crowded=lambda: False)
    attempt = Claims(Link(r, "w1", RECOVERY), 3000).claim(WARM, DIGEST)
    started = time.monotonic()
    pub.delta(attempt, "w", (0,))
    pub.flush(attempt)
    assert time.monotonic() - started < 2.5  # not the 5 s linger (generous: a shared machine)
    assert [entries.decode(f) for _, f in r.xrange(keys.events(WARM))] == [
        Delta(epoch=1, text="w", token_ids=(0,))
    ]


class BeatenPublisher(Publisher):
    """The real publisher, with the heartbeat's BEAT landing between a write and its caller
    waking: the END just written has fenced the attempt, and the beat learns it first."""

    def _write(self, batch):
        super()._write(batch)
        for item in batch:
            if item.attempt.ended:
                item.attempt.move("fence")


def test_an_end_the_heartbeat_learns_of_first_is_still_the_callers_end():
    """CI caught this: the attempt's own Finished fenced it, a beat said so before `finished`
    returned, and the attempt was traced and logged as fenced where it ended `length`."""
    r = fakeredis.FakeRedis()
    record_queued(r, WARM)
    pub = BeatenPublisher(Link(r, "w1", RECOVERY))
    a = Claims(Link(r, "w1", RECOVERY), 3000).claim(WARM, DIGEST)
    pub.delta(a, "w", (0,))
    pub.finished(a, "length", 3, 1)  # raised Fenced
    assert a.ended and a.fenced
    assert entries.decode(r.xrange(keys.events(WARM))[-1][1]).finish_reason == "length"
    with pytest.raises(Fenced):  # anything after the end is refused as before
        pub.delta(a, "x", (1,))
