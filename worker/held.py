"""The prompt prefixes this worker's slots hold in their KV cache, as contract/prefixes.py
digests, for cache-aware routing (api/routing.py): the presence thread announces them.

A slot holds what its last job left: that job's prompt and answer, kept for the next job
that shares a prefix with them (worker/batching.py). So a slot's digests are set when its
job ends and dropped when the slot takes another job (the cache beyond what they share is
written over). Bounded whatever the traffic: at most MAX_DIGESTS a slot.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from contract.prefixes import MAX_DIGESTS


class HeldPrefixes:
    def __init__(self, slots: int) -> None:
        self._slots: list[tuple[str, ...]] = [() for _ in range(slots)]
        self._lock = threading.Lock()
        self.version = 0  # bumped at every change: the presence thread rewrites the set then
        self.changed: Callable[[], None] = lambda: None  # the presence thread's poke

    def held(self, slot: int, digests: list[str]) -> None:
        """A job in `slot` ended: the slot holds these prefixes now."""
        with self._lock:
            self._slots[slot] = tuple(digests[:MAX_DIGESTS])
            self.version += 1
        self.changed()  # announced now: a conversation's next turn may come at once

    def taken(self, slot: int) -> None:
        """A job took `slot`: what it held is being written over."""
        with self._lock:
            if self._slots[slot]:
                self._slots[slot] = ()
                self.version += 1

    def digests(self) -> tuple[int, set[str]]:
        """(version, every digest held) at one moment."""
        with self._lock:
            return self.version, {d for slot in self._slots for d in slot}
