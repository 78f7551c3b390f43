import json

import pytest

from api.bodies import ChatRequest, CompletionRequest, parse
from api.errors import APIError
from api.settings import Limits

LIMITS = Limits()


def chat(**kw):
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    body.update(kw)
    return json.dumps(body).encode()


def err(model, body) -> APIError:
    with pytest.raises(APIError) as info:
        parse(model, body)
    e = info.value
    assert e.status == 400 and e.type == "invalid_request_error" and e.message
    return e


def test_minimal_chat_request_gets_openai_defaults():
    spec = parse(ChatRequest, chat()).to_spec("chatcmpl-1", LIMITS)
    assert spec.kind == "chat" and spec.model == "m"
    assert spec.temperature == 1.0 and spec.top_p == 1.0
    assert spec.max_tokens == LIMITS.max_tokens  # never unbounded: MAX_TOKENS_LIMIT
    assert spec.stop == () and spec.seed is None


def test_every_honoured_field_reaches_the_job():
    req = parse(
        ChatRequest,
        chat(
            max_tokens=50,
            temperature=0,
            top_p=0.5,
            stop="x",
            seed=7,
            presence_penalty=0.5,
            frequency_penalty=-1,
            stream=True,
            stream_options={"include_usage": True},
            n=1,
        ),
    )
    spec = req.to_spec("chatcmpl-1", LIMITS)
    assert (spec.max_tokens, spec.temperature, spec.top_p, spec.stop, spec.seed) == (50, 0.0, 0.5, ("x",), 7)
    assert (spec.presence_penalty, spec.frequency_penalty) == (0.5, -1.0)
    assert req.streaming and req.include_usage


def test_max_completion_tokens_wins_over_max_tokens():
    spec = parse(ChatRequest, chat(max_tokens=50, max_completion_tokens=9)).to_spec("c", LIMITS)
    assert spec.max_tokens == 9


def test_content_parts_are_joined_and_developer_is_a_system_message():
    body = chat(
        messages=[
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": None},
        ]
    )
    spec = parse(ChatRequest, body).to_spec("c", LIMITS)
    assert [(m.role, m.content) for m in spec.messages] == [
        ("system", "be brief"),
        ("user", "ab"),
        ("assistant", ""),
    ]


def test_unknown_fields_and_nulls_are_ignored():
    spec = parse(ChatRequest, chat(user="u", logit_bias=None, temperature=None, foo={"x": 1})).to_spec(
        "c", LIMITS
    )
    assert spec.temperature == 1.0


def test_legacy_prompt_as_string_or_one_element_list_and_default_max_tokens():
    a = parse(CompletionRequest, json.dumps({"model": "m", "prompt": "p"}).encode()).to_spec("cmpl-1", LIMITS)
    b = parse(CompletionRequest, json.dumps({"model": "m", "prompt": ["p"]}).encode()).to_spec(
        "cmpl-1", LIMITS
    )
    assert a == b and a.kind == "text" and a.prompt == "p" and a.max_tokens == 16


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"{not json", None),
        (b"[1, 2]", None),
        (json.dumps({"messages": [{"role": "user", "content": "x"}]}).encode(), "model"),
        (chat(messages=[]), "messages"),
        (chat(messages="hi"), "messages"),
        (chat(messages=[{"role": "wizard", "content": "x"}]), "messages.0.role"),
        (
            chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
            "messages.0.content",
        ),
        (chat(max_tokens=0), "max_tokens"),
        (chat(max_tokens="12"), "max_tokens"),
        (chat(max_tokens=1.5), "max_tokens"),
        (chat(temperature=2.5), "temperature"),
        (chat(temperature="hot"), "temperature"),
        (chat(top_p=1.5), "top_p"),
        (chat(presence_penalty=-3), "presence_penalty"),
        (chat(stop=5), "stop"),
        (chat(stop=[""]), "stop"),
        (chat(n=2), "n"),
        (chat(stream="yes"), "stream"),
        (chat(stream_options={"include_usage": True}), "stream_options"),
        (chat(seed=1.5), "seed"),
    ],
)
def test_bad_chat_input_names_the_parameter(body, param):
    e = err(ChatRequest, body)
    if param is not None:
        assert e.param is not None and e.param.startswith(param), (e.param, e.message)


@pytest.mark.parametrize("prompt", [["a", "b"], [], 5, None, [1, 2]])
def test_bad_legacy_prompt(prompt):
    e = err(CompletionRequest, json.dumps({"model": "m", "prompt": prompt}).encode())
    assert e.param and e.param.startswith("prompt")


def test_error_body_has_the_openai_shape():
    e = err(ChatRequest, chat(max_tokens=0))
    assert set(e.body()["error"]) == {"message", "type", "param", "code"}


def test_pathologically_nested_json_is_a_400_not_a_500():
    deep = ("[" * 100_000 + "]" * 100_000).encode()
    assert err(ChatRequest, deep).code is None
    nested = (
        '{"model": "m", "messages": [{"role": "user", "content": "x"}], "foo": '
        + "[" * 50_000
        + "]" * 50_000
        + "}"
    )
    err(ChatRequest, nested.encode())
