"""api/endpoints/responses/tools.py: a custom tool (Codex's `apply_patch`) as the model is offered
it, a function of one string, with its input's format as the job carries it and the Response
repeats it."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from api.endpoints.responses.tools import CustomTool, ToolChoiceCustom

LARK = 'start: "*** Begin Patch" /(.|\\n)*/ "*** End Patch"'


def tool(**fields) -> CustomTool:
    return CustomTool.model_validate({"type": "custom", "name": "apply_patch", **fields})


def test_a_custom_tool_is_offered_as_a_function_of_one_string_input():
    assert tool().parameters == {
        "type": "object",
        "properties": {"input": {"type": "string"}},
        "required": ["input"],
        "additionalProperties": False,
    }


@pytest.mark.parametrize(
    ("fmt", "carried"),
    [
        (None, {"type": "text"}),
        ({"type": "text"}, {"type": "text"}),
        ({"type": "grammar", "syntax": "lark", "definition": LARK}, {"type": "grammar", "syntax": "lark", "definition": LARK}),  # noqa: E501
        ({"type": "grammar", "syntax": "regex", "definition": "[0-9]+"}, {"type": "grammar", "syntax": "regex", "definition": "[0-9]+"}),  # noqa: E501
    ],
)  # fmt: skip
def test_the_input_s_format_is_free_text_unless_a_grammar_is_given(fmt, carried):
    assert tool(**({"format": fmt} if fmt else {})).freeform() == carried


def test_the_response_repeats_the_tool_with_its_format_filled():
    assert tool(description="Edit files.").echoed() == {
        "type": "custom",
        "name": "apply_patch",
        "description": "Edit files.",
        "format": {"type": "text"},
    }
    grammar = {"type": "grammar", "syntax": "regex", "definition": "[a-z]+"}
    assert tool(format=grammar).echoed() == {
        "type": "custom",
        "name": "apply_patch",
        "description": None,
        "format": grammar,
    }


@pytest.mark.parametrize(
    ("fields", "kind"),
    [
        ({"format": {"type": "grammar", "syntax": "ebnf", "definition": "x"}}, "literal_error"),
        ({"format": {"type": "grammar", "syntax": "lark"}}, "missing"),
        ({"format": {"type": "text", "definition": "x"}}, "extra_forbidden"),
        ({"format": {"type": "json"}}, "union_tag_invalid"),
        ({"format": "text"}, "model_attributes_type"),
        ({"parameters": {"type": "object"}}, "extra_forbidden"),  # its parameters are always one string
    ],
)
def test_a_custom_tool_out_of_shape_is_refused(fields, kind):
    with pytest.raises(ValidationError) as caught:
        tool(**fields)
    assert kind in {e["type"] for e in caught.value.errors()}


def test_a_custom_tool_has_a_name_and_a_custom_tool_choice_names_one():
    with pytest.raises(ValidationError):
        CustomTool.model_validate({"type": "custom"})
    assert ToolChoiceCustom.model_validate({"type": "custom", "name": "apply_patch"}).name == "apply_patch"
    with pytest.raises(ValidationError):
        ToolChoiceCustom.model_validate({"type": "function", "name": "apply_patch"})
