"""A thread that does one thing every few seconds until stopped, riding out Redis outages.

The heartbeat and the presence announcements run this way, on their own thread and connection. So
they keep going while llama.cpp computes (ctypes releases the GIL), and stop the moment the process
dies. A Redis error does not end the thread. The outage is logged once (worker/redis/outage.py).
While Redis is away, the thing is tried again sooner than its period. So it is done again as soon
as Redis is back.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import redis

from worker.redis.outage import Outage


class Periodic:
    def __init__(self, name: str, every_s: float, action: Callable[[], None], min_gap_s: float = 0.0) -> None:
        self._every = every_s
        # a poke waits this long after the last time, at least
        self._min_gap = min_gap_s
        self._action = action
        self._outage = Outage(name)
        self._stop = threading.Event()
        self._poke = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._poke.set()
        self._thread.join(timeout=5)

    def poke(self) -> None:
        """Do the thing soon rather than at the end of the period (something changed). It does it
        now, or `min_gap_s` after the last time, so a burst of pokes does it once."""
        self._poke.set()

    def _loop(self) -> None:
        # the first time at once
        wait, last = 0.0, -self._min_gap
        while True:
            self._poke.wait(wait)
            if (early := self._min_gap - (time.monotonic() - last)) > 0:
                self._stop.wait(early)
            self._poke.clear()
            if self._stop.is_set():
                return
            last = time.monotonic()
            try:
                self._action()
            # a restart, a failover, a refused command
            except redis.RedisError as exc:
                wait = min(self._outage.failed(exc), self._every)
                continue
            self._outage.ok()
            wait = self._every
