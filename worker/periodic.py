"""A thread that does one thing every few seconds until stopped, riding out Redis outages.

The heartbeat and the presence announcements run this way: on their own thread and
connection, so they keep going while llama.cpp computes (ctypes releases the GIL) and stop
the moment the process dies. A Redis error does not end the thread: it is logged once when
the outage begins and once when it ends, and the next period tries again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import redis

log = logging.getLogger(__name__)


class Periodic:
    def __init__(self, name: str, every_s: float, action: Callable[[], None]) -> None:
        self._name = name
        self._every = every_s
        self._action = action
        self._failing = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        while not self._stop.wait(self._every):
            try:
                self._action()
            except redis.RedisError as exc:
                if not self._failing:
                    log.warning(
                        "%s: Redis unavailable (%s); retrying every %.1fs", self._name, exc, self._every
                    )
                self._failing = True
                continue
            if self._failing:
                log.info("%s: Redis is back", self._name)
            self._failing = False
