"""worker.tools.late_system: a system message after the first turn, for a template that renders
none there, is marked text of the user turn beside it, in the order it was sent."""

from __future__ import annotations

from contract.jobspec import Message, ToolCall
from worker.tools.late_system import folded, is_late

S, U, A = (
    (lambda t: Message("system", t)),
    (lambda t: Message("user", t)),
    (lambda t: Message("assistant", t)),
)
CALL = Message("assistant", "", tool_calls=(ToolCall("c1", "f", "{}"),))


def test_only_a_system_message_after_another_role_is_late():
    assert not is_late((S("a"), S("b"), U("x")))
    assert is_late((U("x"), S("a")))
    assert not is_late((S("a"),))


def test_late_system_messages_join_the_user_turn_beside_them():
    assert folded((S("lead"), U("x"), S("a"), S("b"))) == (
        S("lead"),
        U("x\n\n<system>\na\n</system>\n\n<system>\nb\n</system>"),
    )
    assert folded((U("x"), A("y"), S("a"), U("z"))) == (U("x"), A("y"), U("<system>\na\n</system>\n\nz"))
    tool = Message("tool", "r", tool_call_id="c1")
    assert folded((U("x"), CALL, tool, S("a"))) == (U("x"), CALL, tool, U("<system>\na\n</system>"))
