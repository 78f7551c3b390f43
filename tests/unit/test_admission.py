"""Per-key limits apply to API keys only: without keys every client shares the owner "",
and one shared count must not cap the whole server (found by bench/scale_out.py: 429s at
64 open streams with no keys configured)."""

from __future__ import annotations

import pytest

from api import admission
from api.errors import APIError
from api.settings import Settings


def test_stream_limit_is_per_key():
    settings = Settings(max_streams_per_key=2)
    admission.admit_stream(settings, "owner-a", 1)
    with pytest.raises(APIError) as exc:
        admission.admit_stream(settings, "owner-a", 2)
    assert exc.value.status == 429 and exc.value.code == "too_many_streams"
    assert exc.value.headers == {"Retry-After": str(settings.retry_after_s)}


def test_no_keys_no_stream_limit():
    admission.admit_stream(Settings(max_streams_per_key=2), "", 10_000)


def test_zero_means_no_limit():
    admission.admit_stream(Settings(max_streams_per_key=0), "owner-a", 10_000)
