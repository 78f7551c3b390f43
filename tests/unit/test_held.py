"""What a worker's slots hold, for cache-aware routing (worker/held.py): bounded whatever the
traffic, dropped when a slot takes another job."""

from __future__ import annotations

from contract.prefixes import MAX_DIGESTS
from worker.held import HeldPrefixes


def test_a_slot_holds_its_last_job_s_prefixes_until_it_takes_another():
    held = HeldPrefixes(2)
    pokes = []
    held.changed = lambda: pokes.append(1)
    held.held(0, ["a", "b"])
    held.held(1, [str(i) for i in range(100)])
    version, digests = held.digests()
    assert {"a", "b"} <= digests and len(digests) == 2 + MAX_DIGESTS and pokes == [1, 1]
    held.taken(0)
    assert held.digests()[1] == {str(i) for i in range(MAX_DIGESTS)} and held.version == version + 1
