"""The official openai Python SDK against the running stack."""

from __future__ import annotations

import openai
import pytest

from tests.integration.conftest import MODEL

pytestmark = pytest.mark.integration


@pytest.fixture
def sdk(stack):
    with openai.OpenAI(base_url=stack.base + "/v1", api_key="unused", max_retries=0, timeout=120) as c:
        yield c


def test_chat_stream(sdk):
    chunks = list(
        sdk.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Say hi."}],
            stream=True,
            max_tokens=16,
            temperature=0,
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.choices[0].delta.role is None for c in chunks[1:])
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])
    assert len({c.id for c in chunks}) == 1


def test_chat_stream_with_usage(sdk):
    chunks = list(
        sdk.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Say hi."}],
            stream=True,
            max_tokens=16,
            temperature=0,
            stream_options={"include_usage": True},
        )
    )
    *body, last = chunks
    assert last.choices == [] and last.usage.completion_tokens > 0
    assert last.usage.total_tokens == last.usage.prompt_tokens + last.usage.completion_tokens
    assert all(c.usage is None for c in body)


def test_chat_stream_helper_accumulates_one_message(sdk):
    """The SDK's .stream() helper concatenates string fields: a repeated role would show."""
    with sdk.chat.completions.stream(  # the helper raises on "length": leave room to finish
        model=MODEL,
        messages=[{"role": "user", "content": "Say hi."}],
        max_tokens=200,
        temperature=0,
    ) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    assert final.choices[0].message.role == "assistant"
    assert final.choices[0].message.content
    assert final.choices[0].finish_reason == "stop"


def test_chat_non_streaming(sdk):
    r = sdk.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Say hi."}],
        max_completion_tokens=8,
        temperature=0,
    )
    assert r.object == "chat.completion" and r.choices[0].message.content
    assert r.usage.completion_tokens <= 8


def test_legacy_completions(sdk):
    r = sdk.completions.create(model=MODEL, prompt="The sky is", max_tokens=6, temperature=0)
    assert r.object == "text_completion" and r.choices[0].text and r.usage.completion_tokens == 6
    chunks = list(
        sdk.completions.create(
            model=MODEL,
            prompt="The sky is",
            max_tokens=6,
            temperature=0,  # sampled, the model may end before 6 tokens (about 1 run in 30)
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].usage.completion_tokens == 6
    assert "".join(c.choices[0].text for c in chunks if c.choices)


def test_sdk_errors_are_typed(sdk):
    with pytest.raises(openai.NotFoundError) as info:
        sdk.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
    assert info.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError):
        sdk.chat.completions.create(model=MODEL, messages=[], max_tokens=5)


def test_models_list(sdk):
    assert MODEL in [m.id for m in sdk.models.list()]
