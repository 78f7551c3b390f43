"""api/endpoints/messages/routes.py: the Messages paths and `count_tokens`: a count is a job of no
tokens that takes nothing only generating needs, answered with the worker's exact count."""

from __future__ import annotations

import json

import pytest
from starlette.routing import Match

from api.endpoints.catalog import MESSAGES
from api.endpoints.messages.routes import CountObjects, CountRequest, routes
from api.http.errors import APIError
from api.http.parsing import parse
from api.settings import Limits
from contract.entries import Delta, Failed, Finished, Started
from contract.jobspec import Message

LIMITS = Limits()
TOOL = {"name": "weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}
COUNT = CountObjects("msg_count", 1_700_000_000, "m")


def count(**body) -> CountRequest:
    return parse(CountRequest, json.dumps({"model": "m", **body}).encode())


def finished(prompt_tokens: int) -> Finished:
    return Finished(finish_reason="stop", prompt_tokens=prompt_tokens, completion_tokens=0)


def test_messages_are_created_counted_retrieved_deleted_and_cancelled_at_their_own_paths():
    got = {(r.path, m) for r in routes() for m in r.methods or () if m != "HEAD"}
    one = MESSAGES.path + "/{completion_id}"
    assert got == {
        (MESSAGES.path + "/count_tokens", "POST"),
        (MESSAGES.path, "POST"),
        (one, "GET"),
        (one, "DELETE"),
        (one + "/cancel", "POST"),
    }
    assert {r.endpoint.__self__.endpoint for r in routes()} == {MESSAGES}  # type: ignore[attr-defined]


def test_a_post_to_count_tokens_is_a_count_not_a_message_named_count_tokens():
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/messages/count_tokens",
        "root_path": "",
        "headers": [],
    }
    full = [r for r in routes() if r.matches(scope)[0] == Match.FULL]
    assert [r.endpoint.__name__ for r in full] == ["count_tokens"]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_tokens", 16),
        ("stream", False),
        ("stop_sequences", ["\n"]),
        ("temperature", 0.5),
        ("top_p", 0.9),
        ("top_k", 5),
        ("metadata", {"user_id": "u"}),
        ("service_tier", "auto"),
    ],
)
def test_what_only_generating_takes_is_a_400_naming_it(field, value):
    with pytest.raises(APIError) as caught:
        count(messages=[{"role": "user", "content": "x"}], **{field: value})
    assert (caught.value.status, caught.value.param) == (400, field)


def test_a_count_is_the_message_s_prompt_in_a_job_of_no_tokens():
    request = count(
        system="Be brief.",
        tools=[TOOL],
        tool_choice={"type": "tool", "name": "weather"},
        messages=[{"role": "user", "content": "Weather in Oslo?"}],
    )
    request.enforce(LIMITS)
    spec = request.to_spec("msg_count", LIMITS)
    assert spec.max_tokens == 0 and spec.kind == "chat" and spec.id == "msg_count"
    assert spec.messages == (Message("system", "Be brief."), Message("user", "Weather in Oslo?"))
    assert [t.name for t in spec.tools] == ["weather"] and spec.tool_choice == "function:weather"
    assert request.wanted_tokens() == (None, "max_tokens")


def test_a_count_keeps_the_message_rules():
    with pytest.raises(APIError) as caught:
        count(messages=[{"role": "assistant", "content": "x"}]).to_spec("msg_count", LIMITS)
    assert "first message must be the user's" in caught.value.message


def test_the_count_is_the_prompt_s_tokens_once_the_worker_has_tokenized_it():
    started = Started(worker="w1", prompt_tokens=42)
    assert COUNT.answer([]) is None
    assert COUNT.answer([("1-0", started)]) is None  # tokenizing: no answer yet
    answer = COUNT.answer([("1-0", started), ("1-1", finished(42))])
    assert answer is not None and (answer.status, answer.body) == (200, {"input_tokens": 42})


def test_a_count_whose_edit_cleared_tool_uses_says_the_count_before_them():
    started = Started(worker="w1", prompt_tokens=900, cleared_tool_uses=2, cleared_input_tokens=700)
    answer = COUNT.answer([("1-0", started), ("1-1", finished(200))])
    assert answer is not None
    assert answer.body == {"input_tokens": 200, "context_management": {"original_input_tokens": 900}}
    again = Started(worker="w2", prompt_tokens=200, epoch=1)  # a later attempt that cleared nothing
    answer = COUNT.answer([("1-0", started), ("2-0", again), ("2-1", finished(200))])
    assert answer is not None and answer.body == {"input_tokens": 200}


@pytest.mark.parametrize(
    ("code", "status", "kind"),
    [
        ("queue_timeout", 529, "overloaded_error"),  # no worker in time: the SDKs retry
        ("context_length_exceeded", 400, "invalid_request_error"),
        ("worker_lost", 529, "overloaded_error"),
        ("some_new_code", 500, "api_error"),
    ],
)
def test_a_failed_count_is_anthropic_s_error(code, status, kind):
    failed = Failed(message="it failed", type="server_error", code=code)
    answer = COUNT.answer([("1-0", Started(worker="w1", prompt_tokens=3)), ("1-1", failed)])
    assert answer is not None
    assert (answer.status, answer.body) == (
        status,
        {"type": "error", "error": {"type": kind, "message": "it failed"}},
    )


def test_the_first_end_answers_the_count():
    stray = Delta(text="x", token_ids=(1,))
    rows = [
        ("1-0", finished(7)),
        ("1-1", stray),
        ("1-2", Failed(message="late", type="t", code="worker_error")),
    ]
    answer = COUNT.answer(rows)
    assert answer is not None and answer.body == {"input_tokens": 7}
