"""worker/redis/retrying.py: a call is tried again through connection errors for a while,
then the last error is raised; any other error is raised at once."""

from __future__ import annotations

import time

import pytest
import redis

from worker.redis.outage import Outage
from worker.redis.retrying import retry


def flaky(failures: int, error: Exception):
    calls = []

    def call() -> str:
        calls.append(1)
        if len(calls) <= failures:
            raise error
        return "answered"

    return call, calls


def test_a_call_is_tried_again_until_redis_answers():
    call, calls = flaky(3, redis.ConnectionError("reset"))
    outage = Outage("test")
    assert retry(call, wait_s=5, outage=outage) == "answered"
    assert len(calls) == 4 and not outage.ongoing


def test_the_last_error_is_raised_once_the_wait_is_over():
    call, calls = flaky(10_000, redis.TimeoutError("no answer"))
    started = time.monotonic()
    with pytest.raises(redis.TimeoutError):
        retry(call, wait_s=0.3, outage=Outage("test"))
    assert time.monotonic() - started < 0.3 + 1.0 and len(calls) > 1


def test_an_error_of_the_command_is_not_tried_again():
    call, calls = flaky(1, redis.ResponseError("WRONGTYPE"))
    with pytest.raises(redis.ResponseError):
        retry(call, wait_s=5, outage=Outage("test"))
    assert len(calls) == 1
