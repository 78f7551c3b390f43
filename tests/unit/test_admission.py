"""Per-key limits apply to API keys only: without keys every client shares the owner "",
and one shared count must not cap the whole server (found by bench/scale_out.py: 429s at
64 open streams with no keys configured)."""

from __future__ import annotations

import contextlib

import fakeredis
import pytest

from api.admission import Admission, OpenStreams
from api.errors import APIError
from api.registry import WorkerRegistry
from api.settings import Settings


def admission(settings: Settings, streams: OpenStreams) -> Admission:
    client = fakeredis.FakeAsyncRedis()
    return Admission(client, WorkerRegistry(client, 15.0), streams, settings)


_HELD = contextlib.ExitStack()  # streams held open for the length of the test run


def holding(owner: str, n: int) -> OpenStreams:
    streams = OpenStreams()
    for _ in range(n):
        _HELD.enter_context(streams.held(owner))
    return streams


def test_stream_limit_is_per_key():
    settings = Settings(max_streams_per_key=2)
    admission(settings, holding("owner-a", 1)).stream("owner-a")
    admission(settings, holding("owner-b", 2)).stream("owner-a")
    with pytest.raises(APIError) as exc:
        admission(settings, holding("owner-a", 2)).stream("owner-a")
    assert exc.value.status == 429 and exc.value.code == "too_many_streams"
    assert exc.value.headers == {"Retry-After": str(settings.retry_after_s)}


def test_no_keys_no_stream_limit():
    admission(Settings(max_streams_per_key=2), holding("", 10_000)).stream("")


def test_zero_means_no_limit():
    admission(Settings(max_streams_per_key=0), holding("owner-a", 10_000)).stream("owner-a")


def test_open_streams_count_while_held():
    streams = OpenStreams()
    with streams.held("a"), streams.held("a"):
        assert streams.count("a") == 2
    assert streams.count("a") == 0
