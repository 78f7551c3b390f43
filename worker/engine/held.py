"""The prompt prefixes this worker's slots hold in their KV cache, as contract/prefixes.py digests.

They serve cache-aware routing (api/jobs/routing.py). An ending job's thread writes them
(worker/intake/presence.py), and the presence thread keeps them alive.

A slot holds what its last job left: that job's prompt and answer. They are kept for the next
job that shares a prefix with them (worker/engine/batching.py). So a slot's digests are set
when its job ends. They are dropped when the slot takes another job. The cache beyond what
they share is then written over. They are carried along when the scheduler moves a cache to
another slot. The scheduler's thread gives slots out and moves caches. A job's own thread
says what it left when it ends, by its sequence (the owner). So a job that ends after its
slot was given out again claims nothing. Bounded whatever the traffic: at most MAX_DIGESTS a
slot.

The host tier (worker/engine/cache/) keeps a slot's state after the slot is written over. It
restores the state into any slot. Its prefixes are announced too (`hosted`). So a
conversation's next turn is routed here while its state is kept. That holds even once no slot
holds it. A public prompt's head is shared across scopes in the slots alone. So the tier is
given a slot's digests without it (`private`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from contract.prefixes import MAX_DIGESTS


class HeldPrefixes:
    def __init__(self, slots: int) -> None:
        self._slots: list[tuple[str, ...]] = [() for _ in range(slots)]
        # the slot's first digest is a public prompt's head
        self._public = [False] * slots
        # what the host tier keeps
        self._host: frozenset[str] = frozenset()
        # the sequence the slot was last given
        self._owner: list[object | None] = [None] * slots
        self._lock = threading.Lock()
        # the worker takes no more jobs: it claims nothing
        self._closed = False
        # bumped at every change: the presence thread rewrites the set then
        self.version = 0
        # writes the set for routing (worker/intake/presence.py), on the ending job's thread
        self.changed: Callable[[], None] = lambda: None

    def taken(self, slot: int, owner: object) -> None:
        """`owner` (a sequence) took `slot`: what it held is being written over."""
        with self._lock:
            self._owner[slot] = owner
            if self._slots[slot]:
                self._slots[slot] = ()
                self.version += 1

    def moved(self, src: int, dst: int) -> None:
        """The cache of `src` was copied to `dst`, over what `dst` held.

        `src` keeps only a copy no job owns."""
        with self._lock:
            if self._slots[src] or self._slots[dst]:
                self.version += 1
            self._slots[dst], self._owner[dst] = self._slots[src], self._owner[src]
            self._public[dst] = self._public[src]
            self._slots[src], self._owner[src] = (), None

    def forget(self, slot: int) -> None:
        """The slot's cache was emptied (a failed step, the warm-up's end)."""
        with self._lock:
            self._owner[slot] = None
            if self._slots[slot]:
                self._slots[slot] = ()
                self.version += 1

    def close(self) -> None:
        """The worker is leaving: it holds nothing any job could be routed to it for."""
        with self._lock:
            self._closed = True
            self._slots = [() for _ in self._slots]
            self._host = frozenset()
            self.version += 1

    def held(self, owner: object, digests: list[str], public: bool = False) -> None:
        """The job of `owner` ended: its slot, if still its own, holds these prefixes now.

        With `public`, the first is a public prompt's head."""
        with self._lock:
            slot = next((i for i, o in enumerate(self._owner) if o is owner), None)
            if slot is None or self._closed:
                return
            self._slots[slot] = tuple(digests[:MAX_DIGESTS])
            self._public[slot] = public
            self.version += 1
        # written now: a conversation's next turn may come at once
        self.changed()

    def private(self, slot: int) -> tuple[str, ...]:
        """The slot's prefixes that its own scope alone may read.

        The host tier keeps them with the slot's state."""
        with self._lock:
            return self._slots[slot][1:] if self._public[slot] else self._slots[slot]

    def hosted(self, digests: frozenset[str]) -> None:
        """The prefixes of the states the host tier keeps now."""
        with self._lock:
            if self._closed or digests == self._host:
                return
            self._host = digests
            self.version += 1

    def digests(self) -> tuple[int, set[str]]:
        """(version, every digest held, in the slots or the host tier) at one moment."""
        with self._lock:
            return self.version, {d for slot in self._slots for d in slot} | self._host
