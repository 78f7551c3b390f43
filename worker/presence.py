"""Announces, every few seconds, that this worker serves its model.

The API lists and accepts only models with a recent announcement. It runs in its own thread
with its own connection, so it keeps going while llama.cpp computes (ctypes releases the
GIL) and stops the moment the process dies.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time

import redis

from contract import keys

log = logging.getLogger("tokenspool.worker")


class Presence:
    def __init__(self, client: redis.Redis, model: str, worker: str, every_s: float) -> None:
        self._r = client
        self._model = model
        self._worker = worker
        self._every = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="presence", daemon=True)

    def announce(self) -> None:
        with self._r.pipeline(transaction=False) as pipe:
            pipe.sadd(keys.MODELS, self._model)
            pipe.zadd(keys.workers(self._model), {self._worker: int(time.time() * 1000)})
            pipe.execute()

    def start(self) -> None:
        self.announce()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        with contextlib.suppress(redis.RedisError):
            self._r.zrem(keys.workers(self._model), self._worker)

    def _loop(self) -> None:
        while not self._stop.wait(self._every):
            try:
                self.announce()
            except redis.RedisError as exc:
                log.warning("could not announce worker: %s", exc)
