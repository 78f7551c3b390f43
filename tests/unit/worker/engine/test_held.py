"""What a worker's slots hold, for cache-aware routing (worker/engine/held.py): bounded whatever the
traffic, dropped when a slot takes another job, carried along when a cache is moved."""

from __future__ import annotations

from contract.prefixes import MAX_DIGESTS
from worker.engine.held import HeldPrefixes


def test_a_slot_holds_its_last_job_s_prefixes_until_it_takes_another():
    held = HeldPrefixes(2)
    pokes = []
    held.changed = lambda: pokes.append(1)
    a, b, c = object(), object(), object()
    held.taken(0, a)
    held.taken(1, b)
    held.held(a, ["a", "b"])
    held.held(b, [str(i) for i in range(100)])
    version, digests = held.digests()
    assert {"a", "b"} <= digests and len(digests) == 2 + MAX_DIGESTS and pokes == [1, 1]
    held.taken(0, c)
    assert held.digests()[1] == {str(i) for i in range(MAX_DIGESTS)} and held.version == version + 1


def test_a_job_ending_after_its_slot_was_taken_again_claims_nothing():
    held = HeldPrefixes(1)
    a, b = object(), object()
    held.taken(0, a)
    held.taken(0, b)  # the scheduler gave the slot to the next job first
    held.held(a, ["late"])
    assert held.digests()[1] == set()


def test_a_moved_cache_takes_its_prefixes_and_its_job_along():
    held = HeldPrefixes(3)
    ended, running = object(), object()
    held.taken(1, ended)
    held.held(ended, ["e"])
    held.taken(2, running)
    held.moved(1, 0)  # the ended conversation kept in a spare slot
    held.moved(2, 1)  # the running job moved into the gap
    late = object()
    held.held(running, ["r"])  # it ends: its slot is where it moved
    held.taken(0, late)  # the spare is taken: "e" goes, "r" stays
    assert held.digests()[1] == {"r"}


def test_the_host_tier_s_digests_are_held_too_and_a_public_head_is_not_its():
    held = HeldPrefixes(2)
    a, b = object(), object()
    held.taken(0, a)
    held.held(a, ["public-head", "a1"], public=True)
    held.taken(1, b)
    held.held(b, ["b0", "b1"])
    assert held.private(0) == ("a1",) and held.private(1) == ("b0", "b1")
    version = held.version
    held.hosted(frozenset({"a1", "old"}))
    held.hosted(frozenset({"a1", "old"}))  # the same set again: no change to announce
    assert held.version == version + 1
    held.taken(0, object())  # the slot written over; its state is in the tier
    assert held.digests()[1] == {"a1", "old", "b0", "b1"}
    held.close()
    held.hosted(frozenset({"late"}))
    assert held.digests()[1] == set()
