"""Anthropic's `clear_tool_uses_20250919` edit, as a job carries it (`JobSpec.clear_tool_uses`).

The edit acts past its trigger: the prompt's input tokens, or the conversation's tool uses, above
`at`. Then the worker replaces the oldest tool results with a placeholder. It spares the `keep` most
recent tool uses and those of `exclude_tools`. With `clear_at_least`, it stops once that many input
tokens are cleared. It clears nothing if it cannot clear that many. `clear_inputs` (true, or the
names of some tools) clears the calls' arguments too.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

TRIGGERS = ("input_tokens", "tool_uses")
# Anthropic's defaults
TRIGGER_TOKENS = 100_000
KEEP = 3


class InvalidEdit(ValueError):
    """The edit's terms are not valid."""


@dataclass(frozen=True)
class ClearToolUses:
    # what `at` counts: TRIGGERS
    trigger: str = "input_tokens"
    # the edit applies when the count is above it
    at: int = TRIGGER_TOKENS
    # the most recent tool uses left whole
    keep: int = KEEP
    # input tokens; 0: no minimum, every older tool use is cleared
    clear_at_least: int = 0
    # tools whose uses are never cleared
    exclude_tools: tuple[str, ...] = ()
    # all calls' arguments too, or these tools'
    clear_inputs: bool | tuple[str, ...] = False

    def clears_input(self, tool: str) -> bool:
        return self.clear_inputs is True or (
            isinstance(self.clear_inputs, tuple) and tool in self.clear_inputs
        )

    def to_dict(self) -> dict:
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        return {k: list(v) if isinstance(v, tuple) else v for k, v in data.items()}

    @classmethod
    def from_dict(cls, data: object) -> ClearToolUses:
        """The edit a job's dict describes. Raises InvalidEdit for anything else."""
        if not isinstance(data, dict) or set(data) - {f.name for f in fields(cls)}:
            raise InvalidEdit("must be an object of the edit's fields")
        edit = cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})
        if edit.trigger not in TRIGGERS:
            raise InvalidEdit(f"trigger must be one of {TRIGGERS}")
        if not all(_count(n) for n in (edit.at, edit.keep, edit.clear_at_least)):
            raise InvalidEdit("at, keep and clear_at_least must be non-negative integers")
        if not isinstance(edit.exclude_tools, tuple) or not isinstance(edit.clear_inputs, bool | tuple):
            raise InvalidEdit("exclude_tools is a list of names, clear_inputs a boolean or one")
        names = edit.exclude_tools + (edit.clear_inputs if isinstance(edit.clear_inputs, tuple) else ())
        if not all(isinstance(n, str) for n in names):
            raise InvalidEdit("tool names must be strings")
        return edit


# a non-negative integer (a bool is not one)
def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def problem(data: object) -> str | None:
    """What is wrong with a job's edit (None: nothing, or no edit)."""
    if data is None:
        return None
    try:
        ClearToolUses.from_dict(data)
    except (InvalidEdit, TypeError) as exc:
        return str(exc)
    return None
