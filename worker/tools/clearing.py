"""Anthropic's `clear_tool_uses_20250919` edit applied to a chat job's messages. The edit's
terms are in contract/edits/tool_uses.py. The worker clears old tool results here, since only
it counts the prompt's tokens. It clears the oldest tool uses first. Each cleared tool use's
result becomes `PLACEHOLDER`, so the model knows a result was there. Where the edit clears
inputs, the call's arguments become `{}`. The same job always clears the same tool uses, so a
resumed job reports the same edit."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from contract.edits.tool_uses import ClearToolUses
from contract.jobspec import JobSpec, Message
from contract.media.images import MARKER

PLACEHOLDER = "[This tool result was cleared to save context.]"
NO_INPUT = "{}"


def clear_tool_uses(spec: JobSpec, prompt_tokens: int, count: Callable[[str], int]) -> tuple[JobSpec, int]:
    """The job as its edit leaves it (without the edit), and how many tool uses it cleared.
    It clears 0 if the prompt is not past the trigger. It clears 0 if nothing is older than the
    kept ones. It clears 0 too if clearing would save fewer tokens than `clear_at_least`.
    `prompt_tokens` is the whole prompt's. `count` gives a text's tokens as the prompt renders
    it."""
    if spec.clear_tool_uses is None:
        return spec, 0
    edit = ClearToolUses.from_dict(spec.clear_tool_uses)
    bare = dataclasses.replace(spec, clear_tool_uses=None)
    messages = list(spec.messages)
    uses = [(i, j) for i, m in enumerate(messages) for j in range(len(m.tool_calls))]
    if (len(uses) if edit.trigger == "tool_uses" else prompt_tokens) <= edit.at:
        return bare, 0
    results = {m.tool_call_id: i for i, m in enumerate(messages) if m.role == "tool"}
    cleared = saved = 0
    for i, j in uses[: max(0, len(uses) - edit.keep)]:
        if edit.clear_at_least and saved >= edit.clear_at_least:
            break
        call = messages[i].tool_calls[j]
        if call.name in edit.exclude_tools:
            continue
        changed = False
        at = results.get(call.id)
        if at is not None and messages[at].content != PLACEHOLDER:
            saved += count(messages[at].content) - count(PLACEHOLDER)
            messages[at], changed = dataclasses.replace(messages[at], content=PLACEHOLDER), True
        if edit.clears_input(call.name) and call.arguments != NO_INPUT:
            saved += count(call.arguments) - count(NO_INPUT)
            messages[i], changed = _without_input(messages[i], j), True
        cleared += changed
    if not cleared or saved < edit.clear_at_least:
        return bare, 0
    return dataclasses.replace(bare, messages=tuple(messages), images=_kept_images(spec, messages)), cleared


def _kept_images(spec: JobSpec, messages: list[Message]) -> tuple[str, ...]:
    """The images of the messages left. A cleared result's images (a screenshot a tool sent
    back) go with its text. The rest keep their markers' order (contract/media/images.py)."""
    kept, names = [], iter(spec.images)
    for before, after in zip(spec.messages, messages, strict=True):
        for _ in range(before.content.count(MARKER)):
            name = next(names)
            if after.content == before.content:
                kept.append(name)
    return tuple(kept)


def _without_input(message: Message, j: int) -> Message:
    calls = list(message.tool_calls)
    calls[j] = dataclasses.replace(calls[j], arguments=NO_INPUT)
    return dataclasses.replace(message, tool_calls=tuple(calls))
