"""Redis calls that ride out a Redis restart or failover: retried with backoff for a while,
then given up (the caller decides what giving up means)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

import redis

log = logging.getLogger(__name__)

T = TypeVar("T")


def retry(call: Callable[[], T], wait_s: float) -> T:
    """Run `call`, retrying connection errors with doubling backoff (50 ms to 1 s) for up to
    `wait_s`; the last error is raised after that."""
    deadline = time.monotonic() + wait_s
    delay = 0.05
    while True:
        try:
            return call()
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            if time.monotonic() + delay > deadline:
                raise
            log.warning("Redis unreachable (%s); retrying in %.2fs", exc, delay)
            time.sleep(delay)
            delay = min(delay * 2, 1.0)
