"""worker/redis/periodic.py: a thing done every period, sooner when poked, once for a burst of pokes."""

from __future__ import annotations

import threading
import time

from worker.redis.periodic import Periodic


def test_a_burst_of_pokes_does_the_thing_once_more_after_the_minimum_gap():
    done: list[float] = []
    first = threading.Event()

    def action() -> None:
        done.append(time.monotonic())
        first.set()

    p = Periodic("test", 60, action, min_gap_s=0.3)
    p.start()
    try:
        assert first.wait(5)
        for _ in range(20):
            p.poke()
        deadline = time.monotonic() + 5
        while len(done) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.4)  # no third time for the same burst
    finally:
        p.stop()
    assert len(done) == 2 and done[1] - done[0] >= 0.3
