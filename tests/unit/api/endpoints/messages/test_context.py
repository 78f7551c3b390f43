"""api/endpoints/messages/context.py: `context_management` edits as Anthropic takes them, and the
one clear_tool_uses edit as the terms a job carries, Anthropic's defaults filled."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from api.endpoints.messages.context import ContextManagement
from api.http.errors import APIError
from contract.edits.tool_uses import ClearToolUses as EditTerms

CLEAR = {"type": "clear_tool_uses_20250919"}
THINKING = {"type": "clear_thinking_20251015"}


def terms(*edits: dict) -> dict | None:
    return ContextManagement.model_validate({"edits": list(edits)}).clear_tool_uses()


def refused(*edits: dict) -> set[tuple[str, tuple]]:
    """Each error pydantic found (a union's members each say theirs), as (type, location)."""
    with pytest.raises(ValidationError) as caught:
        ContextManagement.model_validate({"edits": list(edits)})
    return {(e["type"], e["loc"]) for e in caught.value.errors()}


def test_without_a_clear_tool_uses_edit_there_are_no_terms():
    assert terms() is None
    assert terms(THINKING, {**THINKING, "keep": "all"}) is None


@pytest.mark.parametrize(
    "keep",
    ["all", {"type": "all"}, {"type": "thinking_turns", "value": 1}, {"type": "thinking_turns", "value": 9}],
)
def test_clear_thinking_takes_each_keep_anthropic_has(keep):
    assert terms({**THINKING, "keep": keep}) is None


def test_a_bare_edit_gets_anthropics_defaults():
    assert terms(CLEAR) == {
        "trigger": "input_tokens",
        "at": 100_000,
        "keep": 3,
        "clear_at_least": 0,
        "exclude_tools": [],
        "clear_inputs": False,
    }


def test_every_term_of_the_edit_travels_as_the_job_carries_it():
    edit = {
        **CLEAR,
        "trigger": {"type": "tool_uses", "value": 6},
        "keep": {"type": "tool_uses", "value": 0},
        "clear_at_least": {"type": "input_tokens", "value": 2_000},
        "exclude_tools": ["memory", "todo"],
        "clear_tool_inputs": ["bash"],
    }
    got = terms(THINKING, edit)
    assert got == {
        "trigger": "tool_uses",
        "at": 6,
        "keep": 0,
        "clear_at_least": 2_000,
        "exclude_tools": ["memory", "todo"],
        "clear_inputs": ["bash"],
    }
    assert EditTerms.from_dict(got) == EditTerms("tool_uses", 6, 0, 2_000, ("memory", "todo"), ("bash",))


@pytest.mark.parametrize(("inputs", "carried"), [(True, True), (False, False), (None, False), ([], [])])
def test_clearing_the_calls_inputs_is_all_none_or_named_tools(inputs, carried):
    edit = {**CLEAR, "trigger": {"type": "input_tokens", "value": 10}}
    if inputs is not None:
        edit["clear_tool_inputs"] = inputs
    got = terms(edit)
    assert got is not None and got["clear_inputs"] == carried and got["at"] == 10
    assert type(got["clear_inputs"]) is type(carried)  # True stays a boolean, not a list of names


def test_a_second_clear_tool_uses_edit_is_a_400_naming_it():
    with pytest.raises(APIError) as caught:
        terms(THINKING, CLEAR, THINKING, {**CLEAR, "keep": {"type": "tool_uses", "value": 1}})
    assert (caught.value.status, caught.value.param) == (400, "context_management.edits[3]")
    assert "may appear once" in caught.value.message


@pytest.mark.parametrize(
    ("edits", "error"),
    [
        ([CLEAR] * 9, ("too_long", ("edits",))),
        ([{"type": "clear_everything"}], ("union_tag_invalid", ("edits", 0))),
        ([{**THINKING, "keep": {"type": "thinking_turns", "value": 0}}], "greater_than_equal"),
        ([{**CLEAR, "trigger": {"type": "input_tokens", "value": -1}}], "greater_than_equal"),
        ([{**CLEAR, "keep": {"type": "input_tokens", "value": 1}}], "literal_error"),
        ([{**CLEAR, "clear_at_least": {"type": "tool_uses", "value": 1}}], "literal_error"),
        ([{**CLEAR, "exclude_tools": ["x" * 65]}], "string_too_long"),
        ([{**CLEAR, "exclude_tools": [f"t{i}" for i in range(129)]}], "too_long"),
        ([{**CLEAR, "trigger": {"type": "input_tokens", "value": "10"}}], "int_type"),
    ],
)
def test_an_edit_outside_anthropics_terms_is_refused(edits, error):
    got = refused(*edits)
    assert error in got if isinstance(error, tuple) else error in {kind for kind, _ in got}
