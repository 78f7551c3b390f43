"""CPU-heavy request work off the event loop. That is parsing a large body, compiling its
schemas to grammars, and checking a batch file.

Such work runs in one thread of its own per API process, one piece at a time. The loop keeps
relaying every other stream meanwhile. A thread holding the GIL gives it up every few
milliseconds. A flood of heavy requests waits its turn in this lane, rather than taking
every thread of the pool. Small bodies are handled on the loop as before: a thread hop costs
more than they do.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import anyio

T = TypeVar("T")

HEAVY_BYTES = 16 * 1024
"""A body larger than this is parsed, and made into a job, in the lane."""


class Lane:
    def __init__(self) -> None:
        self._limiter = anyio.CapacityLimiter(1)

    async def run(self, fn: Callable[..., T], *args: object) -> T:
        """`fn(*args)` in the lane's thread."""
        return await anyio.to_thread.run_sync(fn, *args, limiter=self._limiter)

    async def run_for(self, size: int, fn: Callable[..., T], *args: object) -> T:
        """`fn(*args)` for a body of `size` bytes: in the lane if it is heavy, else here."""
        return await self.run(fn, *args) if size > HEAVY_BYTES else fn(*args)
