"""Hypothesis: whatever JSON a client sends, parsing and limits either give a valid request
or a 400 with an OpenAI-style error naming the problem; never another exception."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api.endpoints.chat.body import ChatRequest
from api.endpoints.completions.body import CompletionRequest
from api.http.errors import APIError
from api.http.parsing import parse
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
    from api.streaming.cursor import BadCursor, Cursor

    try:
        cursor = Cursor.parse(raw)
    except BadCursor:
        return
    ms, seq = (int(x) for x in cursor.entry_id.split("-"))
    assert 0 <= ms < 2**64 and 0 <= seq < 2**64


@settings(max_examples=500)
@given(st.text())
def test_an_id_a_endpoint_owns_is_safe_to_log_and_key(raw):
    from api.endpoints.catalog import CHAT

    job_id = CHAT.id_prefix + raw
    if CHAT.owns(job_id):
        assert (
            job_id.isascii()
            and job_id.isprintable()
            and "{" not in job_id
            and "}" not in job_id
            and len(job_id) <= 80
        )


RESPONSE_FIELDS = [
    "model",
    "input",
    "instructions",
    "max_output_tokens",
    "temperature",
    "top_p",
    "text",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "stream",
    "background",
    "store",
    "truncation",
]
item = st.fixed_dictionaries(
    {"type": st.sampled_from(["message", "function_call", "function_call_output", "item_reference", "x"])},
    optional={
        "role": st.sampled_from(["user", "assistant", "system", "developer", "tool"]),
        "content": values,
        "call_id": st.text(max_size=6),
        "name": st.text(max_size=6),
        "arguments": st.text(max_size=10),
        "output": values,
        "id": st.text(max_size=10),
    },
)
response_bodies = st.dictionaries(
    st.sampled_from(RESPONSE_FIELDS), values | st.lists(item, max_size=4) | st.text(max_size=30), max_size=8
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(response_bodies)
def test_responses_bodies(body):
    """The Responses body: whatever items it holds, a valid job or an OpenAI-style 400 (its
    references resolve to nothing here: the endpoint finds them, tests/integration)."""
    from api.endpoints.responses.body import ResponsesRequest

    try:
        req = parse(ResponsesRequest, json.dumps(body).encode())
        req.bind([], {ref: {"type": "message", "role": "user", "content": []} for ref in req.references()})
        req.enforce(LIMITS)
        req.to_spec("resp_fuzz", LIMITS)
    except APIError as exc:
        assert exc.status == 400 and exc.body()["error"]["message"]


batch_line = st.fixed_dictionaries(
    {},
    optional={
        "custom_id": st.text(max_size=6) | st.integers(),
        "method": st.sampled_from(["POST", "GET", "x"]),
        "url": st.sampled_from(["/v1/chat/completions", "/v1/completions", "/v1/embeddings"]),
        "body": bodies | values,
    },
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(batch_line | values, min_size=0, max_size=5), st.sampled_from(["\n", "\r\n"]))
def test_batch_files(rows, newline):
    """A batch input file: every line checked as its endpoint would, or a 400 naming the
    line; never another exception."""
    from api.batches.lines import parse_lines

    content = newline.join(json.dumps(r) for r in rows).encode()
    try:
        lines = parse_lines(content, LIMITS, max_lines=4)
    except APIError as exc:
        assert exc.status == 400 and exc.body()["error"]["param"] == "file"
        return
    assert 1 <= len(lines) <= 4 and len({ln.custom_id for ln in lines}) == len(lines)
