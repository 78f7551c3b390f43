"""worker/errors.py: why a job cannot run, as the client reads it: each refusal's OpenAI code,
status, message and `param`, and which refusals an attempt reports as a 400."""

from __future__ import annotations

import pytest

from contract import errors
from worker.errors import GrammarDeadEnd, InputTooLong, PromptRejected, PromptTooLong


def test_a_rejected_prompt_is_an_invalid_request_naming_its_param():
    exc = PromptRejected("This model has no chat template; use /v1/completions.", "messages")
    assert str(exc) == "This model has no chat template; use /v1/completions."
    assert exc.param == "messages"
    assert exc.error.code == "invalid_request"
    assert exc.error.status == 400 and exc.error.type == "invalid_request_error"


def test_a_prompt_too_long_says_both_lengths_as_openai_does():
    exc = PromptTooLong(5000, 4096, "messages")
    assert str(exc) == (
        "This model's maximum context length is 4096 tokens. However, your prompt is "
        "5000 tokens long, which leaves no room for a completion."
    )
    assert (exc.prompt_tokens, exc.n_ctx, exc.param) == (5000, 4096, "messages")
    assert exc.error.code == "context_length_exceeded" and exc.error.status == 400


def test_an_embedding_input_too_long_names_the_input_in_its_message_and_param():
    exc = InputTooLong(600, 512, "input[3]")
    assert str(exc) == (
        "Invalid 'input[3]': the input is 600 tokens long; this model embeds at most 512 tokens per input."
    )
    assert exc.param == "input[3]"
    assert exc.error.code == "context_length_exceeded"


@pytest.mark.parametrize(
    "exc",
    [PromptTooLong(10, 8, "prompt"), InputTooLong(10, 8, "input"), PromptRejected("no", "model")],
    ids=["prompt", "input", "rejected"],
)
def test_every_refusal_is_caught_as_a_rejected_prompt_and_becomes_its_stream_entry(exc):
    """What worker/attempts does with one: `pub.failed(attempt, exc.error, str(exc), exc.param)`."""
    try:
        raise exc
    except PromptRejected as caught:
        entry = caught.error.entry(str(caught), caught.param, epoch=3)
    assert entry.message == str(exc) and entry.param == exc.param and entry.epoch == 3
    assert entry.type == "invalid_request_error"
    assert entry.code == ("invalid_request" if type(exc) is PromptRejected else "context_length_exceeded")
    assert errors.failure_body(entry)["error"]["param"] == exc.param


def test_a_refusal_is_a_value_error_and_a_grammar_dead_end_is_not_a_refusal():
    """A dead grammar is the job's own failure at run time, never reported as a bad request."""
    assert isinstance(PromptTooLong(2, 1, "prompt"), ValueError)
    dead = GrammarDeadEnd("no token continues the grammar")
    assert isinstance(dead, RuntimeError) and not isinstance(dead, PromptRejected | ValueError)
    with pytest.raises(RuntimeError, match="no token"):
        raise dead
