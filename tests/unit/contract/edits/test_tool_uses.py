"""contract.edits.tool_uses: a job's clear_tool_uses terms round trip, and a worker refuses
terms the API would not have sent (a job planted in Redis)."""

from __future__ import annotations

import pytest

from contract.edits.tool_uses import ClearToolUses, problem
from contract.jobspec import InvalidSpec, JobSpec, Message


def test_the_terms_round_trip():
    for edit in (ClearToolUses(), ClearToolUses("tool_uses", 4, 1, 50, ("memory",), ("write",))):
        assert ClearToolUses.from_dict(edit.to_dict()) == edit and problem(edit.to_dict()) is None


@pytest.mark.parametrize(
    "terms",
    [
        {"trigger": "messages"},
        {"keep": -1},
        {"at": True},
        {"exclude_tools": "memory"},
        {"clear_inputs": [1]},
        {"placeholder": "x"},
        [],
    ],
)
def test_a_job_with_bad_terms_is_refused(terms):
    data = JobSpec(id="j", kind="chat", model="m", messages=(Message("user", "x"),)).to_dict()
    with pytest.raises(InvalidSpec, match="clear_tool_uses"):
        JobSpec.from_dict({**data, "clear_tool_uses": terms})
