"""A worker's slots: how many jobs it holds at once (SLOTS), and an embedding worker's guest
slot.

The worker's loop reserves a slot before it takes a job from the queue. So waiting jobs stay
where any worker can take them. An embedding worker packs the inputs of every job it holds
into each decode. The keys that sent them take turns (worker/engine/embedding/packing.py). So
what keeps another key waiting is not a decode but a slot. One key's jobs can hold every slot
for minutes (64 jobs of 300,000 tokens each). So one slot more, the guest slot, opens while
one key's jobs hold every slot. It takes another key's job from the queue. It never takes one
of the key holding the slots (contract.lua.queues.TAKE). That job is embedded beside them from
the next decode on. And every slot takes the waiting job of the key with the fewest jobs
running here. The guest slot opens only for keys. A key is a job's owner, a hash of its API
key. A server without keys has one tenant. The guest slot holds one job at a time, so a
worker holds at most SLOTS + 1 jobs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class Slots:
    def __init__(self, slots: int, guest: bool = False) -> None:
        self._slots = slots
        # an embedding worker's: one slot more while one key holds them all
        self._guest = guest
        # reserved or running
        self._held = 0
        self._cv = threading.Condition()
        # the owners of the running jobs ("" for one not read yet, or a server without keys)
        self.owners: Callable[[], list[str]] = lambda: []

    def reserve(self, timeout: float) -> bool:
        """Wait up to `timeout` for a free slot (or the guest slot) and hold it. Whether the
        guest slot is open is asked again at every call and every release. The worker's loop
        calls at least once a second."""
        with self._cv:
            if not self._cv.wait_for(self._free, timeout):
                return False
            self._held += 1
            return True

    @property
    def turns(self) -> bool:
        """Whether keys take turns here (an embedding worker's): TAKE is told the owners."""
        return self._guest

    def in_guest(self) -> bool:
        """Whether the slot reserved last is the guest slot: it takes another key's job only."""
        with self._cv:
            return self._held > self._slots

    def release(self) -> None:
        with self._cv:
            if self._held <= 0:
                raise ValueError("released a slot never reserved")
            self._held -= 1
            self._cv.notify_all()

    def _free(self) -> bool:
        if self._held < self._slots:
            return True
        if not self._guest or self._held > self._slots:
            return False
        owners = self.owners()
        return len(owners) == self._slots and len(set(owners)) == 1 and owners[0] != ""
