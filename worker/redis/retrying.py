"""Redis calls that ride out a Redis restart or failover. They are retried for a while, then given
up. (The caller decides what giving up means.)"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import redis
from redis.exceptions import ClusterDownError, TryAgainError

from worker.redis.outage import Outage

T = TypeVar("T")

# A cluster node failing over answers CLUSTERDOWN or TRYAGAIN for a moment (a streams cluster).
TRANSIENT = (redis.ConnectionError, redis.TimeoutError, ClusterDownError, TryAgainError)


def retry(call: Callable[[], T], wait_s: float, outage: Outage) -> T:
    """Run `call`, retrying connection errors for up to `wait_s`. `outage` does the backoff and the
    logging. After that, the last error is raised."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            result = call()
        except TRANSIENT as exc:
            delay = outage.failed(exc)
            if time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)
            continue
        outage.ok()
        return result
