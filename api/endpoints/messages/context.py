"""`context_management` of a Messages request: its edits, as Anthropic's API takes them.
`clear_thinking_20251015` changes nothing here: earlier thinking is never in the prompt.
`clear_tool_uses_20250919` travels in the job as its terms. The worker applies it, since the
worker alone counts the prompt's tokens (worker/tools/clearing.py)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from api.endpoints.body import MAX_TOOLS
from api.http.errors import invalid
from api.http.parsing import Strict
from contract.edits.tool_uses import KEEP, TRIGGER_TOKENS
from contract.edits.tool_uses import ClearToolUses as EditTerms


class ThinkingTurns(Strict):
    type: Literal["thinking_turns"]
    value: Annotated[int, Field(ge=1)]


class AllThinkingTurns(Strict):
    type: Literal["all"]


class ClearThinking(Strict):
    """Changes nothing here: earlier thinking is never in the prompt (templates drop it)."""

    type: Literal["clear_thinking_20251015"]
    keep: Literal["all"] | Annotated[ThinkingTurns | AllThinkingTurns, Field(discriminator="type")] | None = (
        None
    )


class InputTokens(Strict):
    type: Literal["input_tokens"]
    value: Annotated[int, Field(ge=0)]


class ToolUses(Strict):
    type: Literal["tool_uses"]
    value: Annotated[int, Field(ge=0)]


ToolNames = Annotated[list[Annotated[str, Field(max_length=64)]], Field(max_length=MAX_TOOLS)]


class ClearToolUses(Strict):
    """Applied by the worker, which counts the prompt's tokens (worker/tools/clearing.py)."""

    type: Literal["clear_tool_uses_20250919"]
    trigger: Annotated[InputTokens | ToolUses, Field(discriminator="type")] | None = None
    keep: ToolUses | None = None
    clear_at_least: InputTokens | None = None
    exclude_tools: ToolNames | None = None
    clear_tool_inputs: bool | ToolNames | None = None

    def terms(self) -> dict:
        """The edit as the job carries it (contract/edits/tool_uses.py), Anthropic's defaults filled."""
        trigger = self.trigger or InputTokens(type="input_tokens", value=TRIGGER_TOKENS)
        return EditTerms(
            trigger=trigger.type,
            at=trigger.value,
            keep=self.keep.value if self.keep else KEEP,
            clear_at_least=self.clear_at_least.value if self.clear_at_least else 0,
            exclude_tools=tuple(self.exclude_tools or ()),
            clear_inputs=self._inputs(),
        ).to_dict()

    def _inputs(self) -> bool | tuple[str, ...]:
        inputs = self.clear_tool_inputs
        return tuple(inputs) if isinstance(inputs, list) else bool(inputs)


class ContextManagement(Strict):
    edits: Annotated[
        list[Annotated[ClearThinking | ClearToolUses, Field(discriminator="type")]], Field(max_length=8)
    ]

    def clear_tool_uses(self) -> dict | None:
        """The one clear_tool_uses edit's terms (None: none). Two of them are a 400."""
        found = [(i, e) for i, e in enumerate(self.edits) if isinstance(e, ClearToolUses)]
        if len(found) > 1:
            raise invalid(
                f"Invalid 'context_management.edits[{found[1][0]}]': clear_tool_uses_20250919 may "
                "appear once.",
                f"context_management.edits[{found[1][0]}]",
            )
        return found[0][1].terms() if found else None
