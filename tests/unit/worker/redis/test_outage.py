"""worker/redis/outage.py: tries back off with equal jitter up to a cap, and an outage is
logged once when it begins and once when it ends."""

from __future__ import annotations

import logging

from worker.redis.outage import FIRST_DELAY_S, MAX_DELAY_S, Outage


def test_each_try_waits_half_to_all_of_a_doubling_delay_up_to_the_cap():
    outage = Outage("loop")
    for tries in range(1, 40):
        full = min(MAX_DELAY_S, FIRST_DELAY_S * 2 ** (tries - 1))
        assert full / 2 <= outage.failed(OSError("down")) <= full


def test_an_outage_is_said_once_when_it_begins_and_once_when_it_ends(caplog):
    outage = Outage("loop")
    with caplog.at_level(logging.WARNING, logger="worker.redis.outage"):
        outage.ok()  # nothing to say while Redis answers
        for _ in range(5):
            outage.failed(OSError("down"))
        assert outage.ongoing
        outage.ok()
        outage.ok()
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2 and "unreachable" in said[0] and "is back" in said[1]
    assert outage.failed(OSError("down")) <= FIRST_DELAY_S  # a new outage starts again from the first delay
