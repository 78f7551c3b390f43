"""When a worker may start proving a group of suspects. Proofs and the continuations read
again take turns, so neither waits on the other for ever.

While suspects prove themselves, the jobs still reading their context wait
(worker/engine/steps/plan.py). A death then is the suspects'. Starting a proof whenever the
last one ended once held a worker's continuations 25 s behind one proof after another.
Starting none while a continuation was read left suspects 75 s in the suspect queue. That was
in a crash storm, where a dead batch's jobs arrive every few seconds. So after each proof, the
continuations get at least as long as it took. Then the next group may start beside them. A
proof thus takes at most about half the worker's time from them.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class ProofTurns:
    """The times of this worker's last proof (its first suspect's start to its last one's end)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._began = self._ended = clock()
        self._proving = False

    def began(self) -> None:
        """The first suspect of a group started."""
        if not self._proving:
            self._proving, self._began = True, self._clock()

    def ended(self) -> None:
        """The group's last suspect was cleared or ended."""
        if self._proving:
            self._proving, self._ended = False, self._clock()

    def may_start(self, reading_again: int) -> bool:
        """Whether a new group may start now. None may be proving. The `reading_again`
        continuations here must have had their turn since the last proof ended."""
        if self._proving:
            return False
        return not reading_again or self._clock() - self._ended >= self._ended - self._began
