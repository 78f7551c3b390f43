"""api.endpoints.body: what every endpoint's body shares."""

from api.endpoints.body import first_unanswered
from contract.jobspec import Message, ToolCall


def test_a_tool_result_must_answer_a_call_made_before_it():
    call = Message("assistant", "", tool_calls=(ToolCall("call_1", "f", "{}"),))
    answer = Message("tool", "42", tool_call_id="call_1")
    assert first_unanswered([Message("user", "hi"), call, answer]) is None
    assert first_unanswered([Message("user", "hi"), answer, call]) == 1  # answered before the call
    assert first_unanswered([call, Message("tool", "?", tool_call_id="call_2")]) == 1
