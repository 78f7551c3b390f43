"""api/endpoints/completions/body.py: the legacy completions' body as a text job: its prompt,
every sampling field it shares with chat, the legacy `logprobs` count, and the limits it keeps
(README's rules for /v1/completions)."""

from __future__ import annotations

import json

import pytest

from api.endpoints.completions.body import CompletionRequest
from api.http.errors import APIError
from api.http.parsing import parse
from api.settings import Limits

LIMITS = Limits()


def body(**kw) -> bytes:
    return json.dumps({"model": "m", "prompt": "Once upon", **kw}).encode()


def request(**kw) -> CompletionRequest:
    return parse(CompletionRequest, body(**kw))


def refused(**kw) -> APIError:
    """The 400 the body gets, wherever it is found: parsing, the job, or the limits."""
    with pytest.raises(APIError) as info:
        req = request(**kw)
        req.to_spec("cmpl-1", LIMITS)
        req.enforce(LIMITS)
    assert info.value.status == 400
    return info.value


def test_every_sampling_field_reaches_the_text_job():
    spec = request(
        max_tokens=5,
        temperature=0.2,
        top_p=0.9,
        stop=["\n", "END"],
        seed=3,
        presence_penalty=1.5,
        frequency_penalty=-0.5,
        top_k=40,
        min_p=0.05,
        repeat_penalty=1.1,
        logit_bias={"50": -100, "7": 5},
        ignore_eos=True,
        service_tier="flex",
    ).to_spec("cmpl-7", LIMITS)
    assert (spec.id, spec.kind, spec.model, spec.prompt, spec.messages) == (
        "cmpl-7",
        "text",
        "m",
        "Once upon",
        (),
    )
    assert (spec.max_tokens, spec.temperature, spec.top_p, spec.seed) == (5, 0.2, 0.9, 3)
    assert spec.stop == ("\n", "END")
    assert (spec.presence_penalty, spec.frequency_penalty) == (1.5, -0.5)
    assert (spec.top_k, spec.min_p, spec.repeat_penalty) == (40, 0.05, 1.1)
    assert spec.logit_bias == ((7, 5.0), (50, -100.0))  # by token id, ascending
    assert spec.ignore_eos and spec.priority == "flex"


def test_a_bare_prompt_gets_openais_defaults_and_no_logprobs():
    spec = request().to_spec("cmpl-1", LIMITS)
    assert spec.max_tokens == 16
    assert (spec.temperature, spec.top_p, spec.stop, spec.seed) == (1.0, 1.0, (), None)
    assert (spec.logprobs, spec.top_logprobs) == (False, 0)
    assert (spec.top_k, spec.min_p, spec.repeat_penalty, spec.logit_bias) == (0, 0.0, 1.0, ())
    assert spec.priority == "default" and not spec.ignore_eos
    assert request(stop="###").to_spec("c", LIMITS).stop == ("###",)  # one stop string alone


def test_legacy_logprobs_asks_up_to_five_alternatives():
    assert (request(logprobs=5).to_spec("c", LIMITS).top_logprobs) == 5
    for value, says in (
        (6, "less than or equal to 5"),
        (-1, "greater than or equal to 0"),
        (True, "integer"),
    ):
        e = refused(logprobs=value)
        assert e.param == "logprobs" and says in e.message


def test_the_prompt_as_a_one_element_list_is_its_text_and_counts_its_characters():
    req = request(prompt=["héllo"])
    assert req.text() == "héllo" and req.prompt_chars() == (5, "prompt")  # characters, not bytes
    assert req.to_spec("c", LIMITS).prompt == "héllo"


def test_a_prompt_over_the_limit_is_refused_naming_the_prompt():
    at_limit = request(prompt="é" * LIMITS.max_prompt_chars)
    at_limit.enforce(LIMITS)  # exactly the limit passes
    e = refused(prompt=["é" * (LIMITS.max_prompt_chars + 1)])
    assert e.param == "prompt" and e.code == "string_above_max_length"
    assert f"{LIMITS.max_prompt_chars + 1} characters long" in e.message


def test_stop_strings_keep_the_servers_limits():
    e = refused(stop=["a", "b", "c", "d", "e"][: LIMITS.max_stop + 1])
    assert e.param == "stop"
    e = refused(stop="x" * (LIMITS.max_stop_chars + 1))
    assert e.param == "stop" and e.code == "string_above_max_length"
    request(stop=["a"] * LIMITS.max_stop).enforce(LIMITS)  # as many as allowed pass


@pytest.mark.parametrize("field", ["messages", "tools", "response_format", "suffix", "best_of", "echo"])
def test_what_only_chat_has_or_the_server_does_not_implement_is_refused_by_name(field):
    e = refused(**{field: [] if field in ("messages", "tools") else 1})
    assert e.code == "unsupported_parameter" and e.param == field


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"logit_bias": {"abc": 1}}, "logit_bias"),
        ({"logit_bias": {"1234567890": 1}}, "logit_bias"),  # no token id has ten digits
        ({"n": 2}, "n"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),  # without stream
        ({"max_tokens": 0}, "max_tokens"),
        ({"model": ""}, "model"),
    ],
)
def test_bad_shared_fields_are_refused_naming_them(extra, param):
    assert refused(**extra).param == param


def test_usage_in_the_stream_is_asked_with_stream_options():
    assert request(stream=True, stream_options={"include_usage": True}).include_usage
    assert not request(stream=True).include_usage
