"""A streaming JSON scanner: JSON text fed a piece at a time. It reports its values as they start,
grow and end, by their path in the document. A tool reply needs this to send a call's name and
arguments while the model is still writing them."""

from __future__ import annotations

import json
import string
from typing import Protocol


class ScanError(ValueError):
    """The text is not the JSON the reply expected."""


_SCALAR = frozenset("-+.0123456789eEtruefalsn")
SPACE = frozenset(" \t\r\n")


class JsonScanner:
    """An incremental JSON reader. It reports, by path, where values start and end, and the decoded
    text of strings. For the values asked for, it reports their raw text too. Paths are tuples of
    keys and indices. The root value is at ()."""

    def __init__(self, handler: ScanHandler) -> None:
        self._h = handler
        # containers open: ["obj"|"arr", state, key or index]; state of an object:
        # "key" (a key or "}"), "colon", "value", "next" ("," or "}"); of an array: "value", "next"
        self._stack: list[list] = []
        # decoded text of the string being read
        self._string: list[str] | None = None
        self._is_key = False
        # "" after a backslash, hex digits after \u
        self._escape: str | None = None
        self._scalar: list[str] | None = None
        # the path whose raw text is being collected
        self._capture: tuple | None = None
        self._raw: list[str] = []
        self._surrogate: int | None = None
        self._current = ""
        # the root value has ended
        self.done = False

    def capture(self, path: tuple) -> None:
        """Collect the raw text of the value starting at `path`. Call it from `started`, where the
        character that starts it is the first."""
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
            if ch not in SPACE:
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
                # the delimiter belongs to what comes after the number
                self._raw.pop()
            self._end_scalar()
            if self._capture is not None:
                self._raw.append(ch)
        if ch in SPACE:
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
            # an empty array
            self._close()
            return
        self._value(ch)

    def _object_punctuation(self, frame: list, ch: str) -> None:
        state = frame[1]
        if state == "key" and ch == '"':
            self._string, self._is_key = [], True
        elif state == "key" and ch == "}" and frame[2] is None:
            # an empty object
            self._close()
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
