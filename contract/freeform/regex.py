"""Regular expressions as freeform terms: the `regex` syntax of a custom tool's format, and
Lark's `/.../` terminals.

This reads the subset that every common dialect reads the same way. Among them are Python's `re`
and Rust's `regex`, which OpenAI's grammars follow. It reads characters and escapes (`\\n`, `\\t`,
`\\xHH`, `\\uHHHH`, `\\.`). `.` is any character but a newline. Classes are `[a-z]` and `[^\\n]`,
with `\\d`, `\\w`, `\\s` and their negations. These are meant as ASCII, as under `re.ASCII`.
Groups are `(...)`, `(?:...)` and named groups. It reads `|`, and `*`, `+`, `?`, `{n}`, `{n,}`,
`{n,m}`, lazy or not. The text must match as a whole, so laziness changes nothing. A whole
pattern may start with `^` and end with `$`. Anything else is refused, saying what it is:
lookarounds, backreferences, word boundaries, inline flags, possessive quantifiers, Unicode
properties.
"""

from __future__ import annotations

import re

from contract.freeform.terms import (
    DIGIT,
    MAX_CODE,
    SPACE,
    SURROGATES,
    WORD,
    Alt,
    Chars,
    FormatError,
    Repeat,
    Seq,
    Term,
    Text,
    chars,
    complement,
    one_of,
)

# a repetition's count (llama.cpp's grammar parser refuses 2,000)
MAX_BOUND = 1000
# groups within groups
MAX_DEPTH = 32

_COUNT = re.compile(r"[0-9]{1,6}(,[0-9]{0,6})?")
_HEX = re.compile(r"[0-9a-fA-F]{1,8}")
_CLASSES = {"d": DIGIT, "w": WORD, "s": SPACE}
_CONTROLS = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "a": "\a", "0": "\0"}
_ASSERTIONS = {
    "b": "word boundaries",
    "B": "word boundaries",
    "A": "anchors",
    "Z": "anchors",
    "z": "anchors",
    "G": "anchors",
}


def parse_regex(source: str, whole: bool = True) -> Term:
    """The terms of `source`. With `whole`, it is the whole input's pattern, which may be anchored
    (`^...$`). Else it is a terminal inside a grammar, which may not."""
    return _Reader(source, whole).read()


class _Reader:
    def __init__(self, source: str, whole: bool) -> None:
        self.s, self.i, self.whole = source, 0, whole
        if whole and source.startswith("^"):
            self.i = 1
        anchored = whole and source.endswith("$") and not source.endswith("\\$")
        self.end = len(source) - 1 if anchored else len(source)

    def read(self) -> Term:
        term = self._alternatives(0)
        if self.i < self.end:
            raise self._error("an unmatched ')'")
        return term

    def _error(self, what: str) -> FormatError:
        return FormatError(f"the regular expression {_shown(self.s)} has {what} at position {self.i}")

    def _peek(self) -> str:
        return self.s[self.i] if self.i < self.end else ""

    def _alternatives(self, depth: int) -> Term:
        if depth > MAX_DEPTH:
            raise self._error(f"groups nested deeper than {MAX_DEPTH}")
        options = [self._sequence(depth)]
        while self._peek() == "|":
            self.i += 1
            options.append(self._sequence(depth))
        return options[0] if len(options) == 1 else Alt(tuple(options))

    def _sequence(self, depth: int) -> Term:
        items: list[Term] = []
        while self._peek() not in ("", "|", ")"):
            atom = self._quantified(self._atom(depth))
            if isinstance(atom, Text) and items and isinstance(items[-1], Text):
                items[-1] = Text(items[-1].text + atom.text)
            else:
                items.append(atom)
        return items[0] if len(items) == 1 else Seq(tuple(items))

    def _atom(self, depth: int) -> Term:
        c = self._peek()
        if c in "*+?{":
            raise self._error(f"nothing to repeat before '{c}'")
        if c in "^$":
            raise self._error("an anchor inside the pattern (only around a whole pattern)")
        self.i += 1
        if c == "(":
            return self._group(depth)
        if c == "[":
            return self._class()
        if c == ".":
            return complement(one_of("\n"))
        if c == "\\":
            return self._escape(in_class=False)
        return Text(c)

    def _group(self, depth: int) -> Term:
        if self.s.startswith("?", self.i):
            rest = self.s[self.i + 1 : self.i + 3]
            if rest.startswith(":"):
                self.i += 2
            elif rest.startswith(("P<", "<")) and not rest.startswith(("<=", "<!")):
                close = self.s.find(">", self.i)
                if close < 0:
                    raise self._error("a group name without its '>'")
                self.i = close + 1
            else:
                what = "lookarounds" if rest[:1] in "=!<" else "inline flags or extensions"
                raise self._error(f"'(?{rest[:1]}': {what} are not supported")
        inner = self._alternatives(depth + 1)
        if self._peek() != ")":
            raise self._error("a '(' without its ')'")
        self.i += 1
        return inner

    def _quantified(self, atom: Term) -> Term:
        c = self._peek()
        if c == "*":
            lo, hi = 0, None
        elif c == "+":
            lo, hi = 1, None
        elif c == "?":
            lo, hi = 0, 1
        elif c == "{":
            lo, hi = self._counts()
        else:
            return atom
        self.i += 1
        # lazy: the same texts match as a whole
        if self._peek() == "?":
            self.i += 1
        elif self._peek() == "+":
            raise self._error("a possessive quantifier")
        if self._peek() in ("*", "+", "?", "{"):
            raise self._error("a repetition of a repetition (put it in a group)")
        return Repeat(atom, lo, hi)

    def _counts(self) -> tuple[int, int | None]:
        close = self.s.find("}", self.i)
        body = self.s[self.i + 1 : close] if close > 0 else ""
        parts = body.split(",")
        if close < 0 or not _COUNT.fullmatch(body):
            raise self._error("a '{' that is not a count like {2}, {2,} or {2,5} (escape it)")
        lo = int(parts[0])
        hi = lo if len(parts) == 1 else int(parts[1]) if parts[1] else None
        if lo > MAX_BOUND or (hi is not None and hi > MAX_BOUND):
            raise self._error(f"a count above {MAX_BOUND}")
        if hi is not None and hi < lo:
            raise self._error("a count whose maximum is below its minimum")
        self.i = close
        return lo, hi

    def _class(self) -> Term:
        negated = self._peek() == "^"
        self.i += negated
        ranges: list[tuple[int, int]] = []
        first = True
        while True:
            c = self._peek()
            if c == "":
                raise self._error("a '[' without its ']'")
            if c == "]" and not first:
                self.i += 1
                break
            first = False
            if c == "[":
                raise self._error("a '[' inside a class (escape it)")
            if self.s.startswith(("&&", "--", "~~", "||"), self.i):
                raise self._error("a set operation inside a class (escape the character)")
            low = self._class_item()
            if isinstance(low, list):
                ranges += low
                continue
            if self._peek() == "-" and self.s[self.i + 1 : self.i + 2] not in ("]", ""):
                self.i += 1
                high = self._class_item()
                if isinstance(high, list) or high < low:
                    raise self._error("a class range that is not from a character to a later one")
                ranges.append((low, high))
            else:
                ranges.append((low, low))
        return complement(ranges) if negated else chars(ranges)

    def _class_item(self) -> int | list[tuple[int, int]]:
        c = self._peek()
        self.i += 1
        if c != "\\":
            return ord(c)
        got = self._escape(in_class=True)
        if isinstance(got, Text):
            return ord(got.text)
        assert isinstance(got, Chars)
        return list(got.ranges)

    def _escape(self, in_class: bool) -> Text | Chars:
        c = self._peek()
        if c == "":
            raise self._error("a '\\' at the end")
        self.i += 1
        if c.lower() in _CLASSES:
            ranges = _CLASSES[c.lower()]
            return complement(ranges) if c.isupper() else chars(ranges)
        if c in _CONTROLS:
            if c == "0" and self._peek().isdigit():
                raise self._error("an octal escape (write \\xHH)")
            return Text(_CONTROLS[c])
        if c == "b" and in_class:
            return Text("\b")
        if c in _ASSERTIONS:
            raise self._error(f"'\\{c}': {_ASSERTIONS[c]} are not supported")
        if c in "xuU":
            return Text(self._code(c))
        if c.isdigit() or c in "kgpPNXRhHK":
            raise self._error(f"'\\{c}': backreferences and Unicode properties are not supported")
        if c.isascii() and not c.isalnum():
            return Text(c)
        raise self._error(f"an unknown escape '\\{c}'")

    def _code(self, kind: str) -> str:
        # Rust's \x{10FFFF}
        if kind == "x" and self._peek() == "{":
            close = self.s.find("}", self.i)
            digits = self.s[self.i + 1 : close] if close > 0 else ""
            self.i = close + 1 if close > 0 else self.i
        else:
            width = {"x": 2, "u": 4, "U": 8}[kind]
            digits = self.s[self.i : self.i + width]
            self.i += width
            if len(digits) != width:
                digits = ""
        if not _HEX.fullmatch(digits) or int(digits, 16) > MAX_CODE:
            raise self._error(f"a malformed '\\{kind}' escape")
        if SURROGATES[0] <= int(digits, 16) <= SURROGATES[1]:
            raise self._error("a surrogate code point (not a character)")
        return chr(int(digits, 16))


def _shown(source: str) -> str:
    return repr(source if len(source) <= 60 else source[:57] + "...")
