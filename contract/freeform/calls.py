"""A custom tool's call as the function call every tool protocol carries. It has one argument,
`input`: the text. Its grammar holds over the JSON string (escaped.py). The worker renders the tool
with INPUT_SCHEMA and earlier calls with `arguments_json`. The API reads the text back out of the
arguments as they stream (`InputReader`)."""

from __future__ import annotations

import json

from contract.freeform.escaped import check_format
from contract.freeform.terms import FormatError

INPUT_SCHEMA = {
    "type": "object",
    "properties": {"input": {"type": "string"}},
    "required": ["input"],
    "additionalProperties": False,
}


def arguments_json(text: str) -> str:
    """A custom call's input as its function call's arguments."""
    return json.dumps({"input": text}, ensure_ascii=False)


def custom_tool_problem(parameters: dict, freeform: object) -> str | None:
    """What is wrong with a custom tool as a job carries it (None: nothing)."""
    if parameters != INPUT_SCHEMA:
        return "a custom tool's parameters are its input's"
    try:
        check_format(freeform)
    except FormatError as exc:
        return str(exc)
    return None


class InputReader:
    """The input's text out of a call's arguments (`{"input": "..."}`) as they arrive. The
    arguments may be cut anywhere, inside an escape too. `feed` gives the text decoded so far and
    not given before. `done` gives the whole input, from the whole arguments."""

    def __init__(self) -> None:
        # "key" (to the ':'), "value" (to its '"'), "text", "end"
        self._state = "key"
        # an escape cut off, or a high surrogate waiting for its low one
        self._held = ""
        self._arguments: list[str] = []
        self._text: list[str] = []

    def feed(self, fragment: str) -> str:
        self._arguments.append(fragment)
        out = []
        for ch in fragment:
            if self._state == "key":
                self._state = "value" if ch == ":" else "key"
            elif self._state == "value":
                self._state = "text" if ch == '"' else "value"
            elif self._state == "text":
                out.append(self._char(ch))
        self._text += out
        return "".join(out)

    def _char(self, ch: str) -> str:
        if not self._held:
            if ch == '"':
                self._state = "end"
                return ""
            if ch != "\\":
                return ch
        self._held += ch
        held = self._held
        if len(held) < 2 or (held[1] == "u" and len(held) < 6):
            return ""
        if held[1] == "u" and _high_surrogate(held[2:6]) and len(held) < 12:
            if held[6:8] in ("", "\\", "\\u"):
                # its low surrogate may follow (`\ud83d\ude00`)
                return ""
            # the string ends after a lone one
            if held[6:] == '"':
                self._held, self._state = "", "end"
                return clean(json.loads(f'"{held[:6]}"'))
        self._held = ""
        try:
            return clean(json.loads(f'"{held}"'))
        except ValueError:
            return held

    def done(self) -> str:
        """The input, from the arguments whole. If they are not an input's: the text streamed."""
        try:
            value = json.loads("".join(self._arguments))
        except ValueError:
            value = None
        if isinstance(value, dict) and isinstance(value.get("input"), str):
            return clean(value["input"])
        return "".join(self._text if self._state != "key" else self._arguments)


def _high_surrogate(digits: str) -> bool:
    try:
        return 0xD800 <= int(digits, 16) <= 0xDBFF
    except ValueError:
        return False


def clean(text: str) -> str:
    """`text` with any lone surrogate (a `\\ud83d` without its pair) as U+FFFD. A lone surrogate
    has no UTF-8, and the events are UTF-8."""
    return "".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in text)
