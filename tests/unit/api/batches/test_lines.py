"""A batch input file's lines are checked as their endpoint would check the bodies, and the
first bad one is named by its number."""

from __future__ import annotations

import json

import pytest

from api.batches.lines import parse_lines
from api.http.errors import APIError
from api.settings import Limits

LIMITS = Limits()


def line(custom_id: str = "a", url: str = "/v1/chat/completions", **body) -> str:
    payload = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **body}
    if url == "/v1/completions":
        payload = {"model": "m", "prompt": "hi", **body}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": payload})


def test_good_lines_keep_their_order_ids_and_numbers():
    content = "\n".join([line("x"), "", line("y", "/v1/completions", max_tokens=3)]).encode()
    lines = parse_lines(content, LIMITS, 10)
    assert [(ln.number, ln.custom_id, ln.url) for ln in lines] == [
        (1, "x", "/v1/chat/completions"),
        (3, "y", "/v1/completions"),
    ]
    assert lines[1].request().to_spec("cmpl-1", LIMITS).max_tokens == 3


@pytest.mark.parametrize(
    ("rows", "words"),
    [
        ([line(), "[1]"], "Line 2"),
        ([line(), line()], "Line 2: custom_id 'a' is used by an earlier line"),
        ([line(temperature=9)], "Line 1: Invalid 'temperature'"),
        (
            [line(tools=[{"type": "function", "function": {"name": "bad name"}}])],
            "Line 1: Invalid 'tools[0].function.name'",
        ),
        ([line(stream=True)], "neither streamed nor in the background"),
        (
            [json.dumps({"custom_id": "a", "method": "GET", "url": "/v1/completions", "body": {}})],
            "method must be POST",
        ),
        (
            [json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {}, "x": 1})],
            "Line 1: x",
        ),
        ([], "no request lines"),
    ],
)
def test_the_first_bad_line_is_named(rows, words):
    with pytest.raises(APIError) as caught:
        parse_lines("\n".join(rows).encode(), LIMITS, 10)
    assert caught.value.status == 400 and caught.value.param == "file" and words in caught.value.message


def test_too_many_lines_or_not_utf8():
    with pytest.raises(APIError, match="limit is 2"):
        parse_lines("\n".join(line(str(i)) for i in range(3)).encode(), LIMITS, 2)
    with pytest.raises(APIError, match="UTF-8"):
        parse_lines(b"\xff\xfe", LIMITS, 2)
