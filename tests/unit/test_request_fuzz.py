"""Hypothesis: whatever JSON a client sends, parsing and limits either give a valid request
or a 400 with an OpenAI-style error naming the problem; never another exception."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api.bodies import ChatRequest, CompletionRequest, parse
from api.errors import APIError
from api.settings import Limits

scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20)
values = st.recursive(
    scalars,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
    max_leaves=12,
)
FIELDS = [
    "model",
    "messages",
    "prompt",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "stop",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "n",
    "stream",
    "stream_options",
    "background",
]
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "developer", "tool", "x"]), "content": values}
)
bodies = st.dictionaries(
    st.sampled_from(FIELDS),
    values | st.lists(message, max_size=3) | st.text(max_size=30),
    max_size=8,
)
LIMITS = Limits(max_messages=2, max_prompt_chars=50, max_tokens=100, max_stop=2, max_stop_chars=5)


def check(model, raw: bytes) -> None:
    try:
        req = parse(model, raw)
        req.enforce(LIMITS)
    except APIError as exc:
        assert exc.status == 400
        body = exc.body()["error"]
        assert set(body) == {"message", "type", "param", "code"} and body["message"]
        assert body["type"] == "invalid_request_error"
        return
    spec = req.to_spec("chatcmpl-fuzz", LIMITS)  # a valid request always makes a valid job
    assert spec.model == req.model


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(bodies)
def test_chat_bodies(body):
    check(ChatRequest, json.dumps(body).encode())


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(bodies)
def test_completion_bodies(body):
    check(CompletionRequest, json.dumps(body).encode())


@settings(max_examples=200)
@given(st.binary(max_size=64) | values.map(lambda v: json.dumps(v).encode()))
def test_arbitrary_bytes(raw):
    check(ChatRequest, raw)


@settings(max_examples=500)
@given(st.one_of(st.text(), st.from_regex(r"\d{1,22}-\d{1,22}(/usage)?", fullmatch=True)))
def test_any_cursor_parses_into_a_valid_stream_id_or_is_refused(raw):
    """What reaches Redis's shared XREAD is always a valid stream id (the review's cursor
    attack: parts past 2^64 - 1 failed the read of every stream of the replica)."""
    from api.cursor import BadCursor, Cursor

    try:
        cursor = Cursor.parse(raw)
    except BadCursor:
        return
    ms, seq = (int(x) for x in cursor.entry_id.split("-"))
    assert 0 <= ms < 2**64 and 0 <= seq < 2**64


@settings(max_examples=500)
@given(st.text())
def test_an_id_a_surface_owns_is_safe_to_log_and_key(raw):
    from api.surfaces import CHAT

    cid = CHAT.id_prefix + raw
    if CHAT.owns(cid):
        assert cid.isascii() and cid.isprintable() and "{" not in cid and "}" not in cid and len(cid) <= 80
