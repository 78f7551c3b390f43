"""System messages after the conversation's start, for a chat template that renders none
there. Such messages are Claude Code's environment notes, or a chat `system` message between
turns. Many templates render only a first system message, and raise or drop any other. Each
such message becomes marked text of a user turn beside it: `<system>\n...\n</system>`. So the
model still reads it where it was sent."""

from __future__ import annotations

from contract.jobspec import Message


def is_late(messages: tuple[Message, ...]) -> bool:
    """Whether a system message follows a message of another role."""
    roles = [m.role for m in messages]
    return "system" in roles[next((i for i, r in enumerate(roles) if r != "system"), len(roles)) :]


def folded(messages: tuple[Message, ...]) -> tuple[Message, ...]:
    """The messages, with each late system message joined to a user message. It goes at the
    end of the user message just before it. Or else it goes at the start of the next user
    message. Or else it becomes a user message of its own. The leading system messages stay."""
    out: list[Message] = []
    # late system texts for the next user message
    waiting: list[str] = []
    started = False
    for m in messages:
        if m.role == "system" and started:
            text = f"<system>\n{m.content}\n</system>"
            if out and out[-1].role == "user" and not waiting:
                out[-1] = Message("user", f"{out[-1].content}\n\n{text}" if out[-1].content else text)
            else:
                waiting.append(text)
            continue
        started = started or m.role != "system"
        if m.role == "user" and waiting:
            m = Message("user", "\n\n".join([*waiting, m.content] if m.content else waiting))
            waiting = []
        out.append(m)
    if waiting:
        out.append(Message("user", "\n\n".join(waiting)))
    return tuple(out)
