"""What the client sees of a reply: content, and the tool calls the model wrote.

A model calls a tool by writing text in a syntax its prompt taught it (worker/tools/protocols.py):
a JSON envelope (`{"tool_call": {"name": ..., "arguments": {...}}}`, `{"tool_calls": [...]}`,
or `{"response": "..."}` for plain content), or Hermes tags (`<tool_call>{...}</tool_call>`
between content). A `Reply` reads the generated text piece by piece and says, for each
piece, what content and which tool-call fragments it holds, the way OpenAI streams them:
a call's id and name once its name is complete, then its arguments' JSON text in fragments
that concatenate to it.

A reply is deterministic in its text: a continuation on another worker feeds it the text
the earlier attempts generated (discarding what it returns), and goes on where they left
off, mid-call included. Call ids are derived from the completion id and the call's index,
so a continuation names the calls the same.
"""

from __future__ import annotations

import hashlib
import json
import string
from dataclasses import dataclass, field
from typing import Protocol

from contract.entries import CallPart, join_calls

_B62 = string.ascii_letters + string.digits


@dataclass
class Parts:
    content: str = ""
    calls: list[CallPart] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.content or self.calls)

    def add(self, other: Parts) -> Parts:
        self.content += other.content
        join_calls(self.calls, other.calls)
        return self


def call_id(completion_id: str, index: int) -> str:
    """`call_` and 24 letters or digits, the same on every attempt of the job."""
    n = int.from_bytes(hashlib.sha256(f"{completion_id}:{index}".encode()).digest(), "big")
    out = []
    for _ in range(24):
        n, r = divmod(n, 62)
        out.append(_B62[r])
    return "call_" + "".join(out)


class Reply(Protocol):
    calls: int  # complete tool calls so far

    def feed(self, text: str) -> Parts: ...
    def end(self) -> Parts: ...


class PlainReply:
    """No tools: the text is the content."""

    calls = 0

    def feed(self, text: str) -> Parts:
        return Parts(content=text)

    def end(self) -> Parts:
        return Parts()


class ScanError(ValueError):
    """The text is not the JSON the reply expected."""


_SCALAR = frozenset("-+.0123456789eEtruefalsn")
_SPACE = frozenset(" \t\r\n")


class JsonScanner:
    """An incremental JSON reader that reports, by path, where values start and end, the
    decoded text of strings, and (for the values asked for) their raw text. Paths are tuples
    of keys and indices; the root value is at ()."""

    def __init__(self, handler: ScanHandler) -> None:
        self._h = handler
        # containers open: ["obj"|"arr", state, key or index]; state of an object:
        # "key" (a key or "}"), "colon", "value", "next" ("," or "}"); of an array: "value", "next"
        self._stack: list[list] = []
        self._string: list[str] | None = None  # decoded text of the string being read
        self._is_key = False
        self._escape: str | None = None  # "" after a backslash, hex digits after \u
        self._scalar: list[str] | None = None
        self._capture: tuple | None = None  # the path whose raw text is being collected
        self._raw: list[str] = []
        self._surrogate: int | None = None
        self._current = ""
        self.done = False  # the root value has ended

    def capture(self, path: tuple) -> None:
        """Collect the raw text of the value starting at `path` (call from `started`: the
        character that starts it is the first)."""
        self._capture = path
        self._raw = [self._current]

    def take_raw(self) -> str:
        out = "".join(self._raw)
        self._raw = []
        return out

    def path(self) -> tuple:
        return tuple(frame[2] for frame in self._stack)

    def feed(self, text: str) -> None:
        for ch in text:
            self._char(ch)

    def finish(self) -> None:
        """The text ended: a number at the root ends here."""
        if self._scalar is not None:
            self._end_scalar()

    def _char(self, ch: str) -> None:
        self._current = ch
        if self.done:
            if ch not in _SPACE:
                raise ScanError(f"text after the JSON value: {ch!r}")
            return
        if self._capture is not None:
            self._raw.append(ch)
        if self._string is not None:
            self._in_string(ch)
            return
        if self._scalar is not None:
            if ch in _SCALAR:
                self._scalar.append(ch)
                return
            if self._capture is not None:
                self._raw.pop()  # the delimiter belongs to what comes after the number
            self._end_scalar()
            if self._capture is not None:
                self._raw.append(ch)
        if ch in _SPACE:
            return
        frame = self._stack[-1] if self._stack else None
        if frame is not None and frame[0] == "obj" and frame[1] in ("key", "next", "colon"):
            self._object_punctuation(frame, ch)
            return
        if frame is not None and frame[0] == "arr" and frame[1] == "next":
            if ch == ",":
                frame[2] += 1
                frame[1] = "value"
                return
            if ch == "]":
                self._close()
                return
            raise ScanError(f"expected ',' or ']', got {ch!r}")
        if frame is not None and frame[0] == "arr" and ch == "]" and frame[1] == "value" and frame[2] == 0:
            self._close()  # an empty array
            return
        self._value(ch)

    def _object_punctuation(self, frame: list, ch: str) -> None:
        state = frame[1]
        if state == "key" and ch == '"':
            self._string, self._is_key = [], True
        elif state == "key" and ch == "}" and frame[2] is None:
            self._close()  # an empty object
        elif state == "colon" and ch == ":":
            frame[1] = "value"
        elif state == "next" and ch == ",":
            frame[1], frame[2] = "key", ""
        elif state == "next" and ch == "}":
            self._close()
        else:
            raise ScanError(f"unexpected {ch!r} in an object")

    def _value(self, ch: str) -> None:
        path = self.path()
        if ch == "{":
            self._h.started(path, "obj")
            self._stack.append(["obj", "key", None])
        elif ch == "[":
            self._h.started(path, "arr")
            self._stack.append(["arr", "value", 0])
        elif ch == '"':
            self._h.started(path, "str")
            self._string, self._is_key = [], False
        elif ch in _SCALAR:
            self._h.started(path, "scalar")
            self._scalar = [ch]
        else:
            raise ScanError(f"unexpected {ch!r} where a value belongs")

    def _close(self) -> None:
        self._stack.pop()
        self._ended()

    def _ended(self) -> None:
        """The value at the current position ended: tell the handler, move the parent on."""
        path = self.path()
        if self._capture == path:
            self._capture = None
        self._h.ended(path)
        if not self._stack:
            self.done = True
        else:
            self._stack[-1][1] = "next"

    def _end_scalar(self) -> None:
        text = "".join(self._scalar or ())
        self._scalar = None
        try:
            json.loads(text)
        except ValueError:
            raise ScanError(f"not a JSON value: {text!r}") from None
        self._ended()

    def _in_string(self, ch: str) -> None:
        assert self._string is not None
        if self._escape is not None:
            self._escaped(ch)
            return
        if ch == "\\":
            self._escape = ""
        elif ch == '"':
            text = "".join(self._string)
            self._string = None
            if self._is_key:
                frame = self._stack[-1]
                frame[1], frame[2] = "colon", text
            else:
                self._ended()
        elif ord(ch) < 0x20:
            raise ScanError("a raw control character in a string")
        else:
            self._text(ch)

    def _escaped(self, ch: str) -> None:
        if self._escape == "":
            if ch == "u":
                self._escape = "u"
                return
            simple = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
            if ch not in simple:
                raise ScanError(f"a bad escape \\{ch}")
            self._escape = None
            self._text(simple[ch])
            return
        if ch not in string.hexdigits:
            raise ScanError("a bad \\u escape")
        self._escape += ch
        if len(self._escape) < 5:
            return
        code = int(self._escape[1:], 16)
        self._escape = None
        if 0xD800 <= code < 0xDC00:
            self._surrogate = code
            return
        if 0xDC00 <= code < 0xE000 and self._surrogate is not None:
            code = 0x10000 + ((self._surrogate - 0xD800) << 10) + (code - 0xDC00)
        self._surrogate = None
        self._text(chr(code))

    def _text(self, ch: str) -> None:
        assert self._string is not None
        self._string.append(ch)
        if not self._is_key:
            self._h.text(self.path(), ch)


class ScanHandler(Protocol):
    def started(self, path: tuple, kind: str) -> None: ...
    def text(self, path: tuple, ch: str) -> None: ...
    def ended(self, path: tuple) -> None: ...


class _Calls:
    """Collects call parts: a call's name (at `name_at`) opens it, its arguments (raw, at
    `args_at`) stream after."""

    def __init__(self, completion_id: str) -> None:
        self.completion_id = completion_id
        self.out = Parts()
        self.count = 0  # calls whose name is known
        self.complete = 0
        self._name: list[str] = []

    def name_text(self, ch: str) -> None:
        self._name.append(ch)

    def name_done(self) -> None:
        index = self.count
        self.count += 1
        name = "".join(self._name)
        self._name = []
        self.out.add(Parts(calls=[CallPart(index, "", call_id(self.completion_id, index), name)]))

    def arguments(self, raw: str) -> None:
        if raw and self.count:
            self.out.add(Parts(calls=[CallPart(self.count - 1, raw)]))


class GenericReply:
    """The JSON envelope (llama.cpp's "Generic" format, for templates without tool syntax):
    `{"tool_call": CALL}`, `{"tool_calls": [CALL, ...]}` or `{"response": ...}`, where CALL is
    `{"name": ..., "arguments": {...}}`. The grammar guarantees the shape; a response that is
    a string streams as content, any other value as its JSON text."""

    def __init__(self, completion_id: str) -> None:
        self._calls = _Calls(completion_id)
        self._scanner = JsonScanner(self)
        self._raw_response = False

    @property
    def calls(self) -> int:
        return self._calls.complete

    def feed(self, text: str) -> Parts:
        self._scanner.feed(text)
        return self._take()

    def end(self) -> Parts:
        self._scanner.finish()
        return self._take()

    def _take(self) -> Parts:
        out = self._calls.out
        if self._raw_response or self._call_arguments_open():
            raw = self._scanner.take_raw()
            if self._raw_response:
                out.content += raw
            else:
                self._calls.arguments(raw)
                out = self._calls.out
        self._calls.out = Parts()
        return out

    def _call_arguments_open(self) -> bool:
        return self._calls.count > self._calls.complete

    @staticmethod
    def _call_path(path: tuple) -> tuple | None:
        """The part of `path` inside a call object, if it is inside one."""
        if path[:1] == ("tool_call",):
            return path[1:]
        if path[:1] == ("tool_calls",) and len(path) >= 2:
            return path[2:]
        return None

    def started(self, path: tuple, kind: str) -> None:
        if path == ("response",) and kind != "str":
            self._raw_response = True
            self._scanner.capture(path)
        inner = self._call_path(path)
        if inner == ("arguments",):
            self._scanner.capture(path)

    def text(self, path: tuple, ch: str) -> None:
        if path == ("response",):
            self._calls.out.content += ch
        elif self._call_path(path) == ("name",):
            self._calls.name_text(ch)

    def ended(self, path: tuple) -> None:
        inner = self._call_path(path)
        if inner == ("name",):
            self._calls.name_done()
        elif inner == ("arguments",):
            self._calls.arguments(self._scanner.take_raw())
            self._calls.complete += 1
        elif path == ("response",) and self._raw_response:
            self._calls.out.content += self._scanner.take_raw()
            self._raw_response = False


OPEN, CLOSE = "<tool_call>", "</tool_call>"


class HermesReply:
    """Content, with calls between `<tool_call>` and `</tool_call>` (Hermes, Qwen and the
    templates that teach it): each a JSON object `{"name": ..., "arguments": {...}}`. Text
    that might be the start of the opening tag is held back until it is not. Without a
    grammar (tool_choice auto) a call that is not that JSON is given back as content."""

    def __init__(self, completion_id: str) -> None:
        self._calls = _Calls(completion_id)
        self._state = "content"  # "content", "call" (its JSON), "closing" (after it)
        self._held = ""  # content that may be the start of OPEN; in "closing", what came
        self._scanner = JsonScanner(self)
        self._body = ""  # a call's text so far (given back as content if it is not a call)

    @property
    def calls(self) -> int:
        return self._calls.complete

    def feed(self, text: str) -> Parts:
        out = Parts()
        for ch in text:
            out.add(self._char(ch))
        if self._state == "call" and self._calls.count > self._calls.complete:
            self._calls.arguments(self._scanner.take_raw())
        return out.add(self._take())

    def end(self) -> Parts:
        out = Parts(content=self._held if self._state == "content" else "")
        self._held = ""
        return out.add(self._take())  # a call cut off (max_tokens): its fragments stand

    def _take(self) -> Parts:
        out, self._calls.out = self._calls.out, Parts()
        return out

    def _char(self, ch: str) -> Parts:
        if self._state == "content":
            self._held += ch
            if self._held.endswith(OPEN):
                content, self._held = self._held[: -len(OPEN)], ""
                self._state, self._scanner, self._body = "call", JsonScanner(self), ""
                return Parts(content=content)
            keep = max((n for n in range(1, len(OPEN)) if self._held.endswith(OPEN[:n])), default=0)
            cut = len(self._held) - keep
            content, self._held = self._held[:cut], self._held[cut:]
            return Parts(content=content)
        if self._state == "call":
            if self._scanner.done:
                self._state, self._held = "closing", ""
                return self._char(ch)
            self._body += ch
            try:
                self._scanner.feed(ch)
            except ScanError:
                return self._not_a_call()
            return Parts()
        # closing: spaces, then CLOSE; anything else is content again
        if ch in _SPACE and not self._held:
            return Parts()
        self._held += ch
        if CLOSE.startswith(self._held):
            if self._held == CLOSE:
                self._state, self._held = "content", ""
            return Parts()
        text, self._held, self._state = self._held, "", "content"
        return self._char_all(text)

    def _char_all(self, text: str) -> Parts:
        out = Parts()
        for ch in text:
            out.add(self._char(ch))
        return out

    def _not_a_call(self) -> Parts:
        text = OPEN + self._body
        self._state, self._body = "content", ""
        if self._calls.count > self._calls.complete:  # its name went out already: it stands
            self._calls.complete += 1
            return Parts()
        return Parts(content=text)

    def started(self, path: tuple, kind: str) -> None:
        if path == ("arguments",):
            self._scanner.capture(path)

    def text(self, path: tuple, ch: str) -> None:
        if path == ("name",):
            self._calls.name_text(ch)

    def ended(self, path: tuple) -> None:
        if path == ("name",):
            self._calls.name_done()
        elif path == ("arguments",):
            self._calls.arguments(self._scanner.take_raw())
            self._calls.complete += 1
