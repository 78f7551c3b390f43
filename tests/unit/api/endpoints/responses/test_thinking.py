"""api/endpoints/responses/thinking.py: a reasoning item sent back is read as its text or, sealed,
only as the endpoint opened it; and `include` names only what a Response may hold."""

from __future__ import annotations

import pytest
from pydantic import TypeAdapter, ValidationError

from api.endpoints.responses.thinking import ENCRYPTED_REASONING, Includable, ReasoningItem, SummaryText


def reasoning(**fields) -> ReasoningItem:
    return ReasoningItem.model_validate({"type": "reasoning", **fields})


def test_a_reasoning_item_s_text_is_its_content_joined():
    item = reasoning(
        id="rs_abc_0",
        status="completed",
        summary=[{"type": "summary_text", "text": "Asked about 17."}],
        content=[{"type": "reasoning_text", "text": "17 is "}, {"type": "reasoning_text", "text": "prime."}],
    )
    assert item.text() == "17 is prime."  # the summary is no part of it
    assert reasoning().text() == "" and reasoning(content=[]).text() == ""


def test_a_sealed_item_reads_as_the_endpoint_opened_it_whatever_its_content_says():
    item = reasoning(encrypted_content="ts1.sealed", content=[{"type": "reasoning_text", "text": "forged"}])
    item.open_with("what was sealed")
    assert item.text() == "what was sealed"


def test_a_sealed_item_is_never_read_before_it_is_opened():
    item = reasoning(encrypted_content="ts1.sealed", content=[{"type": "reasoning_text", "text": "forged"}])
    with pytest.raises(AssertionError):
        item.text()


def test_the_opened_text_is_the_server_s_own_never_the_client_s():
    with pytest.raises(ValidationError) as caught:
        reasoning(encrypted_content="ts1.sealed", _opened="forged")
    assert {e["type"] for e in caught.value.errors()} == {"extra_forbidden"}


@pytest.mark.parametrize(
    ("fields", "kind"),
    [
        ({"encrypted_content": ""}, "string_too_short"),
        ({"summary": [{"type": "reasoning_text", "text": "x"}]}, "literal_error"),
        ({"content": [{"type": "summary_text", "text": "x"}]}, "literal_error"),
        ({"content": "plain text"}, "list_type"),
        ({"summary": None}, "list_type"),
    ],
)
def test_a_reasoning_item_out_of_shape_is_refused(fields, kind):
    with pytest.raises(ValidationError) as caught:
        reasoning(**fields)
    assert kind in {e["type"] for e in caught.value.errors()}


def test_each_summary_list_is_the_item_s_own():
    first, second = reasoning(), reasoning()
    first.summary.append(SummaryText(type="summary_text", text="changed"))
    assert second.summary == []


def test_include_names_the_sealed_reasoning_and_what_no_response_here_holds_and_nothing_else():
    includes = TypeAdapter(list[Includable])
    assert ENCRYPTED_REASONING == "reasoning.encrypted_content"
    named = ["reasoning.encrypted_content", "message.input_image.image_url", "web_search_call.results"]
    assert includes.validate_python(named) == named
    for wrong in ("reasoning.content", "reasoning.summary", "Reasoning.encrypted_content", ""):
        with pytest.raises(ValidationError):
            includes.validate_python([wrong])
