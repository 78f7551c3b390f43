"""api/http/reading.py: a body is read within its size and its time, and JSON only when it
is sent as JSON."""

from __future__ import annotations

import asyncio

import pytest
from starlette.requests import Request

from api.http.errors import APIError
from api.http.reading import read_body, read_json


def request(chunks: list[bytes], headers: dict[str, str], delay_s: float = 0.0) -> Request:
    pending = list(chunks)

    async def receive() -> dict:
        await asyncio.sleep(delay_s)
        chunk = pending.pop(0) if pending else b""
        return {"type": "http.request", "body": chunk, "more_body": bool(pending)}

    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    return Request({"type": "http", "method": "POST", "path": "/", "headers": raw}, receive)


def status(coro) -> int:
    with pytest.raises(APIError) as caught:
        asyncio.run(coro)
    return caught.value.status


def test_a_body_within_its_limit_is_read_whole():
    assert asyncio.run(read_body(request([b"ab", b"cd"], {}), limit=4, timeout_s=1)) == b"abcd"


def test_a_body_over_its_limit_is_refused_declared_or_not():
    assert status(read_body(request([b"x"], {"content-length": "10"}), limit=4, timeout_s=1)) == 413
    assert status(read_body(request([b"abc", b"de"], {}), limit=4, timeout_s=1)) == 413


def test_a_body_that_trickles_past_its_time_is_refused():
    assert status(read_body(request([b"a", b"b", b"c"], {}, delay_s=0.2), limit=10, timeout_s=0.3)) == 408


def test_json_must_say_it_is_json():
    plain = {"content-type": "text/plain"}
    assert status(read_json(request([b"{}"], plain), limit=10, timeout_s=1)) == 415
    typed = {"content-type": "Application/JSON; charset=utf-8"}
    assert asyncio.run(read_json(request([b"{}"], typed), limit=10, timeout_s=1)) == b"{}"
