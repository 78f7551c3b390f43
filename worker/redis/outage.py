"""How a worker loop lives through a Redis outage. It keeps trying, with capped and jittered
backoff, so a pool of workers does not reconnect in lockstep. It says so once when the outage
begins and once when it ends, not once per try."""

from __future__ import annotations

import logging
import threading
import time

from redis.backoff import EqualJitterBackoff

log = logging.getLogger(__name__)

FIRST_DELAY_S = 0.05
MAX_DELAY_S = 2.0
# half the delay, then up to double
BACKOFF = EqualJitterBackoff(cap=MAX_DELAY_S, base=FIRST_DELAY_S)


class Outage:
    """One loop's (or one connection's) view of Redis being away. Thread-safe."""

    def __init__(self, what: str) -> None:
        self._what = what
        self._lock = threading.Lock()
        self._since: float | None = None
        self._tries = 0

    @property
    def ongoing(self) -> bool:
        return self._since is not None

    def failed(self, exc: BaseException) -> float:
        """Note a failed try. Returns how long to wait before the next one."""
        with self._lock:
            if self._since is None:
                self._since = time.monotonic()
                log.warning("%s: Redis unreachable (%s); retrying until it is back", self._what, exc)
            self._tries += 1
            return BACKOFF.compute(self._tries - 1)

    def ok(self) -> None:
        """Note a try that reached Redis."""
        # the common case: no lock on the hot path
        if self._since is None:
            return
        with self._lock:
            if self._since is not None:
                log.warning("%s: Redis is back after %.1fs", self._what, time.monotonic() - self._since)
            self._since, self._tries = None, 0
