"""Per-attempt heartbeats, from a thread that keeps beating while llama.cpp computes.

Every `interval_s`, each attempt this process holds refreshes its liveness key. The BEAT
script does it, and the key is valid for `window_ms`. A process that hangs stops beating, and
is declared dead when the key expires. A process that dies is seen sooner, by its named
connections vanishing. BEAT also tells an attempt it has been fenced out. So a worker stops
even while it writes nothing (a long prefill). BEAT also tells it when a failover lost its
claim. Then `rolled_back` (the publisher's `resend`) writes again what it holds, which claims
again. The thread holds any number of attempts. One process may run several jobs at once.

The thread beats on its own. So a process stuck inside a native call (a hung driver) would
look alive for ever. To catch it, an attempt is no longer beaten for once no step computed
any of its rows for `stall_s`. Its rows are its prompt chunks and tokens. It is then declared
dead. A long prompt read a chunk a step beside other streams may take minutes to its first
token. Each chunk counts.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import redis

from contract import keys
from contract.lua import attempts
from worker.attempts.attempt import Attempt
from worker.redis.periodic import Periodic

log = logging.getLogger(__name__)


class Heartbeat:
    def __init__(
        self, client: redis.Redis, window_ms: int, interval_s: float, stall_s: float = 120.0
    ) -> None:
        self._beat = client.register_script(attempts.BEAT)
        self._stall = stall_s
        self._window_ms = window_ms
        self._attempts: dict[str, Attempt] = {}
        self._lock = threading.Lock()
        self._thread = Periodic("heartbeat", interval_s, self.beat)
        # the job runner's
        self.rolled_back: Callable[[Attempt], None] = lambda attempt: None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._thread.stop()

    def track(self, attempt: Attempt) -> None:
        with self._lock:
            self._attempts[attempt.job_id] = attempt

    def untrack(self, attempt: Attempt) -> None:
        with self._lock:
            if self._attempts.get(attempt.job_id) is attempt:
                del self._attempts[attempt.job_id]

    def beat(self) -> None:
        with self._lock:
            running = list(self._attempts.values())
        now = time.monotonic()
        for a in running:
            if now - a.progress_at > self._stall:
                log.error("%s made no progress for %.0fs: no longer alive", a.job_id, now - a.progress_at)
                continue
            current = self._beat(
                keys=[keys.job(a.job_id), keys.alive(a.job_id)],
                args=[a.epoch, self._window_ms, a.token],
            )
            if current == 2:
                log.warning("%s: a failover lost attempt %d's claim; claiming", a.job_id, a.epoch)
                self.rolled_back(a)
            elif not current:
                a.move("fence")
