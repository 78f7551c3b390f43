import json

import pytest

from api.endpoints.chat.body import ChatRequest
from api.endpoints.completions.body import CompletionRequest
from api.http.errors import APIError
from api.http.parsing import parse
from api.settings import Limits
from contract.jobspec import JobSpec

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


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_a_max_tokens_above_the_servers_limit_is_clamped_to_it(field):
    """opencode (the AI SDK) asks 32,000 by default: as on the Messages API, the job asks
    MAX_TOKENS_LIMIT, and its answer ends there or where the context is full ("length")."""
    req = parse(ChatRequest, chat(**{field: 32000}))
    req.enforce(LIMITS)
    assert req.to_spec("c", LIMITS).max_tokens == LIMITS.max_tokens


def test_the_legacy_completions_max_tokens_above_the_limit_is_still_refused():
    """No agent sends /v1/completions: it keeps OpenAI's rule, a 400 naming the parameter."""
    req = parse(CompletionRequest, json.dumps({"model": "m", "prompt": "p", "max_tokens": 32000}).encode())
    with pytest.raises(APIError) as info:
        req.enforce(LIMITS)
    assert info.value.param == "max_tokens" and "at most 8192" in info.value.message


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


def test_nulls_mean_the_default_and_the_no_op_fields_are_accepted():
    spec = parse(
        ChatRequest, chat(user="u", metadata={"k": "v"}, store=True, logit_bias=None, temperature=None)
    ).to_spec("c", LIMITS)
    assert spec.temperature == 1.0 and spec.logit_bias == ()


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"foo": {"x": 1}}, "foo"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"audio": {"voice": "x"}}, "audio"),
        ({"messages": [{"role": "user", "content": "x", "weird": 1}]}, "messages[0].weird"),
        (
            {"messages": [{"role": "tool", "tool_call_id": "c", "content": "x", "weird": 1}]},
            "messages[0].weird",
        ),
    ],
)
def test_what_the_server_does_not_implement_is_refused_by_name(extra, param):
    e = _late(extra) if _fails_late(extra) else err(ChatRequest, chat(**extra))
    assert e.code == "unsupported_parameter" and e.param == param and param in e.message


def test_a_participant_name_is_accepted_on_any_message():
    spec = parse(
        ChatRequest,
        chat(
            messages=[
                {"role": "system", "content": "s", "name": "a"},
                {"role": "user", "content": "x", "name": "bob"},
            ]
        ),
    ).to_spec("c", LIMITS)
    assert [m.content for m in spec.messages] == ["s", "x"]


@pytest.mark.parametrize(
    ("message", "param", "words"),
    [
        ({"role": "robot", "content": "x"}, "messages[0].role", "one of"),
        ({"content": "x"}, "messages[0].role", "Missing"),
        ({"role": "user", "content": "x", "tool_call_id": "c"}, "messages[0].tool_call_id", "only tool"),
        ({"role": "tool", "content": "x"}, "messages[0].tool_call_id", "Missing"),
    ],
)
def test_a_field_on_the_wrong_role_is_named(message, param, words):
    e = err(ChatRequest, chat(messages=[message]))
    assert e.param == param and words in e.message, (e.param, e.message)


def test_every_extension_reaches_the_job():
    body = chat(
        top_k=40,
        min_p=0.05,
        repeat_penalty=1.1,
        logit_bias={"15": -100, "3": 5.5},
        logprobs=True,
        top_logprobs=3,
        response_format={"type": "json_object"},
    )
    spec = parse(ChatRequest, body).to_spec("c", LIMITS)
    assert (spec.top_k, spec.min_p, spec.repeat_penalty) == (40, 0.05, 1.1)
    assert spec.logit_bias == ((3, 5.5), (15, -100.0))
    assert (spec.logprobs, spec.top_logprobs) == (True, 3)
    assert spec.response_format == {"type": "json_object"}


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def test_tools_choice_and_a_tool_round_trip_reach_the_job():
    messages = [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": None,
            "refusal": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "sunny"}]},
    ]
    body = chat(
        messages=messages,
        tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        parallel_tool_calls=False,
    )
    spec = parse(ChatRequest, body).to_spec("c", LIMITS)
    assert spec.tools[0].name == "get_weather" and spec.named_tool == "get_weather"
    assert spec.parallel_tool_calls is False
    assert spec.messages[1].tool_calls[0].arguments == '{"city":"Oslo"}'
    assert (spec.messages[2].role, spec.messages[2].tool_call_id, spec.messages[2].content) == (
        "tool",
        "call_1",
        "sunny",
    )
    JobSpecCheck = type(spec).from_dict(spec.to_dict())
    assert JobSpecCheck == spec


def test_a_json_schema_format_is_compiled_and_kept():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    body = chat(
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "x", "schema": schema, "strict": True},
        }
    )
    spec = parse(ChatRequest, body).to_spec("c", LIMITS)
    assert spec.response_format == {"type": "json_schema", "schema": schema}


@pytest.mark.parametrize(
    ("kw", "param", "words"),
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "number", "minimum": 3}},
                }
            },
            "response_format.json_schema.schema",
            "/minimum",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "^a$"}},
                }
            },
            "response_format.json_schema.schema",
            "pattern",
        ),
        ({"response_format": {"type": "json_schema"}}, "response_format", "json_schema"),
        ({"response_format": {"type": "xml"}}, "response_format.type", ""),
        ({"tool_choice": "required"}, "tool_choice", "tools"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice.function.name",
            "nope",
        ),
        ({"tools": [WEATHER, WEATHER]}, "tools", "unique"),
        (
            {"tools": [{"type": "function", "function": {"name": "bad name"}}]},
            "tools[0].function.name",
            "letters",
        ),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": "f",
                            "parameters": {"type": "object", "properties": {"x": {"not": {}}}},
                        },
                    }
                ]
            },
            "tools[0].function.parameters",
            "/properties/x/not",
        ),
        ({"top_logprobs": 2}, "top_logprobs", "logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", ""),
        ({"logprobs": True, "tools": [WEATHER]}, "logprobs", "tools"),
        ({"logit_bias": {"abc": 1}}, "logit_bias", "token id"),
        ({"logit_bias": {"1": 101}}, "logit_bias", ""),
        ({"top_k": -1}, "top_k", ""),
        ({"min_p": 2}, "min_p", ""),
        (
            {"messages": [{"role": "tool", "tool_call_id": "call_9", "content": "x"}]},
            "messages[0].tool_call_id",
            "tool call",
        ),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id", ""),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": "x",
                        "tool_calls": [
                            {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                        ],
                    }
                ]
            },
            "messages[0].tool_calls",
            "assistant",
        ),
    ],
)
def test_bad_tools_formats_and_extensions_name_the_parameter(kw, param, words):
    e = err(ChatRequest, chat(**kw)) if not _fails_late(kw) else _late(kw)
    assert e.param is not None and e.param.startswith(param), (e.param, e.message)
    assert words in e.message


def _fails_late(kw) -> bool:
    try:
        parse(ChatRequest, chat(**kw))
    except APIError:
        return False
    return True


def _late(kw) -> APIError:
    with pytest.raises(APIError) as info:
        parse(ChatRequest, chat(**kw)).to_spec("c", LIMITS)
    assert info.value.status == 400
    return info.value


def test_legacy_logprobs_count_alternatives():
    spec = parse(
        CompletionRequest, json.dumps({"model": "m", "prompt": "p", "logprobs": 2}).encode()
    ).to_spec("c", LIMITS)
    assert (spec.logprobs, spec.top_logprobs) == (True, 2)
    spec = parse(
        CompletionRequest, json.dumps({"model": "m", "prompt": "p", "logprobs": 0}).encode()
    ).to_spec("c", LIMITS)
    assert (spec.logprobs, spec.top_logprobs) == (True, 0)
    e = err(CompletionRequest, json.dumps({"model": "m", "prompt": "p", "echo": True}).encode())
    assert e.code == "unsupported_parameter" and e.param == "echo"


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
        (chat(messages=[{"role": "wizard", "content": "x"}]), "messages[0].role"),
        (
            chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
            "messages[0].content",
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


def test_ignore_eos_reaches_the_job_and_only_a_job_that_asks_carries_it():
    spec = parse(ChatRequest, chat(ignore_eos=True, max_tokens=7)).to_spec("c", LIMITS)
    assert spec.ignore_eos and spec.to_dict()["ignore_eos"] is True
    assert JobSpec.from_dict(spec.to_dict()) == spec
    plain = parse(CompletionRequest, json.dumps({"model": "m", "prompt": "p"}).encode()).to_spec("c", LIMITS)
    assert "ignore_eos" not in plain.to_dict()  # a worker of an earlier release takes it
    text = parse(CompletionRequest, json.dumps({"model": "m", "prompt": "p", "ignore_eos": True}).encode())
    assert text.to_spec("c", LIMITS).ignore_eos


def test_ignore_eos_cannot_go_with_a_grammar():
    body = chat(ignore_eos=True, response_format={"type": "json_object"})
    with pytest.raises(APIError) as info:
        parse(ChatRequest, body).to_spec("c", LIMITS)
    assert info.value.param == "ignore_eos"


def test_a_tool_message_must_answer_an_earlier_call():
    messages = [{"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "c9", "content": "y"}]
    with pytest.raises(APIError) as caught:
        parse(ChatRequest, chat(messages=messages)).to_spec("chatcmpl-1", LIMITS)
    assert caught.value.status == 400 and caught.value.param == "messages[1].tool_call_id"


def test_a_reasoning_effort_and_template_arguments_reach_the_chat_template():
    spec = parse(ChatRequest, chat(reasoning_effort="none")).to_spec("c", LIMITS)
    assert spec.template_kwargs == {"reasoning_effort": "none", "enable_thinking": False}
    kwargs = {"enable_thinking": True, "custom": "x"}
    spec = parse(ChatRequest, chat(reasoning_effort="none", chat_template_kwargs=kwargs)).to_spec("c", LIMITS)
    assert spec.template_kwargs == {"enable_thinking": True, "custom": "x", "reasoning_effort": "none"}
    assert parse(ChatRequest, chat()).to_spec("c", LIMITS).template_kwargs == {}
    assert JobSpec.from_dict(spec.to_dict()) == spec


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"reasoning_effort": "extreme"}, "reasoning_effort"),
        ({"chat_template_kwargs": ["enable_thinking"]}, "chat_template_kwargs"),
        ({"chat_template_kwargs": {"messages": "x"}}, "chat_template_kwargs"),
        ({"chat_template_kwargs": {"namespace": "x"}}, "chat_template_kwargs"),  # Jinja's own globals
        ({"chat_template_kwargs": {"range": 3}}, "chat_template_kwargs"),
        ({"chat_template_kwargs": {"self": "x"}}, "chat_template_kwargs"),  # the formatter's argument
        ({"chat_template_kwargs": {"nested": {"a": 1}}}, "chat_template_kwargs.nested"),
        ({"chat_template_kwargs": {"long": "x" * 300}}, "chat_template_kwargs"),
    ],
)
def test_bad_reasoning_controls_are_a_400_naming_the_field(extra, param):
    with pytest.raises(APIError) as info:  # by the body's parsing, or when it makes its job
        parse(ChatRequest, chat(**extra)).to_spec("c", LIMITS)
    e = info.value
    assert e.status == 400 and e.param is not None and e.param.startswith(param), (e.param, e.message)


def test_an_assistant_message_s_own_thinking_is_accepted_and_left_out():
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Hello.", "reasoning_content": "They greet me."},
        {"role": "user", "content": "again"},
    ]
    spec = parse(ChatRequest, chat(messages=messages)).to_spec("c", LIMITS)
    assert [m.content for m in spec.messages] == ["hi", "Hello.", "again"]


def test_legacy_completions_take_no_reasoning_controls():
    body = json.dumps({"model": "m", "prompt": "x", "reasoning_effort": "low"}).encode()
    assert err(CompletionRequest, body).param == "reasoning_effort"


def test_a_thinking_budget_reaches_the_job_and_is_a_positive_integer():
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    job = parse(ChatRequest, json.dumps({**body, "thinking_budget": 64}).encode()).to_spec("c", Limits())
    assert job.thinking_budget == 64
    assert parse(ChatRequest, json.dumps(body).encode()).to_spec("c", Limits()).thinking_budget == 0
    for bad in (0, -1, "64", 1.5):
        with pytest.raises(APIError) as caught:
            parse(ChatRequest, json.dumps({**body, "thinking_budget": bad}).encode())
        assert caught.value.param == "thinking_budget"
    with pytest.raises(APIError):  # legacy completions take no thinking controls
        parse(CompletionRequest, json.dumps({"model": "m", "prompt": "x", "thinking_budget": 8}).encode())


def _image_url(data: bytes) -> dict:
    import base64

    return {
        "type": "image_url",
        "image_url": {"url": "data:image/png;base64," + base64.b64encode(data).decode()},
    }


def test_an_image_part_becomes_the_marker_at_its_place_and_its_hash_in_the_spec():
    import hashlib

    from contract.media.images import MARKER, png

    data = png(4, 4)
    content = [{"type": "text", "text": "What is "}, _image_url(data), {"type": "text", "text": "?"}]
    body = parse(ChatRequest, chat(messages=[{"role": "user", "content": content}]))
    spec = body.to_spec("c", LIMITS)
    assert spec.messages[0].content == f"What is {MARKER}?"
    assert spec.images == (hashlib.sha256(data).hexdigest(),)
    assert body._image_params == ["messages[0].content[1]"]
    assert spec.low_detail == ()
    JobSpec.from_dict(spec.to_dict())  # the worker takes it


def test_an_image_part_at_low_detail_is_named_in_the_spec():
    from contract.media.images import png

    parts = [_image_url(png(4, 4)), _image_url(png(4, 4, seed=1)), _image_url(png(4, 4, seed=2))]
    for part, detail in zip(parts, ("high", "low", "auto"), strict=True):
        part["image_url"]["detail"] = detail
    body = parse(ChatRequest, chat(messages=[{"role": "user", "content": parts}]))
    spec = body.to_spec("c", LIMITS)
    assert spec.low_detail == (1,) and JobSpec.from_dict(spec.to_dict()) == spec


def test_beside_an_image_the_marker_text_and_bad_bytes_are_refused_naming_the_part():
    from contract.media.images import MARKER, png

    forged = [{"type": "text", "text": MARKER}, _image_url(png(2, 2))]
    body = parse(ChatRequest, chat(messages=[{"role": "user", "content": forged}]))
    with pytest.raises(APIError) as info:
        body.to_spec("c", LIMITS)
    assert info.value.param == "messages[0].content[0]"
    bad = parse(ChatRequest, chat(messages=[{"role": "user", "content": [_image_url(b"GIF8 no")]}]))
    with pytest.raises(APIError) as info:
        bad.to_spec("c", LIMITS)
    assert info.value.param == "messages[0].content[0].image_url.url"
    assert (
        parse(ChatRequest, chat(messages=[{"role": "user", "content": MARKER}])).to_spec("c", LIMITS).images
        == ()
    )


def test_only_a_user_message_carries_images():
    from contract.media.images import png

    e = err(ChatRequest, chat(messages=[{"role": "system", "content": [_image_url(png(2, 2))]}]))
    assert e.param.startswith("messages[0]")
