"""llama.cpp's grammar format (GBNF), as tokenspool writes it.

It holds literals and the JSON primitives every grammar shares. Named rules are collected into
one grammar (`Grammar`). An integer range is spelled digit by digit. contract/schema.py compiles
JSON schemas with these."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field

MAX_GRAMMAR_CHARS = 256 * 1024


class SchemaError(ValueError):
    """A schema the grammar cannot enforce: `where` is a JSON pointer into it."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where or '(root)'}: {message}")
        self.where = where


_SPACE = 'ws ::= " "?'
_CHAR = 'char ::= [^"\\\\\\x7F\\x00-\\x1F] | [\\\\] (["\\\\/bfnrt] | "u" [0-9a-fA-F]{4})'
_PRIMITIVES = {
    "string": '"\\"" char* "\\"" ws',
    "number": '"-"? ([0-9] | [1-9] [0-9]{0,15}) ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,4})? ws',
    "integer": '"-"? ([0-9] | [1-9] [0-9]{0,15}) ws',
    "boolean": '("true" | "false") ws',
    "null": '"null" ws',
}
_DATE = '[0-9]{4} "-" ("0" [1-9] | "1" [0-2]) "-" ("0" [1-9] | [1-2] [0-9] | "3" [0-1])'
_TIME = (
    '([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ("." [0-9]{1,6})? '
    '("Z" | [+-] ([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9])'
)
_HEX = "[0-9a-fA-F]"
FORMAT_RULES = {
    "date": _DATE,
    "time": _TIME,
    "date-time": f'{_DATE} "T" {_TIME}',
    "uuid": f'{_HEX}{{8}} "-" {_HEX}{{4}} "-" {_HEX}{{4}} "-" {_HEX}{{4}} "-" {_HEX}{{12}}',
}
# the rule of any JSON value
ANY = "value"
_ANY_RULES = {
    "value": "object | array | string | number | boolean | null",
    "object": '"{" ws (string ":" ws value ("," ws string ":" ws value)*)? "}" ws',
    "array": '"[" ws (value ("," ws value)*)? "]" ws',
}


def literal(text: str) -> str:
    """A GBNF string literal matching exactly `text`."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def json_literal(value: object) -> str:
    """The GBNF literal of one JSON value, written as compactly as json.dumps writes it."""
    return literal(json.dumps(value, ensure_ascii=False, separators=(",", ":")))


@dataclass
class Grammar:
    """Rules being built: `root` and the rules it needs, each defined once."""

    rules: dict[str, str] = field(default_factory=dict)
    _names: set[str] = field(default_factory=set)
    # characters of the rules defined so far
    _size: int = 0
    # a name's next free number
    _next: dict[str, int] = field(default_factory=dict)

    def name(self, hint: str) -> str:
        base = re.sub(r"[^a-zA-Z0-9]+", "-", hint).strip("-").lower() or "r"
        # where to look from: many rules of one place stay linear
        n = self._next.get(base, 1)
        name = base if n == 1 else f"{base}-{n}"
        while name in self._names or name in _RESERVED:
            n += 1
            name = f"{base}-{n}"
        self._next[base] = n + 1
        self._names.add(name)
        return name

    def define(self, name: str, body: str) -> str:
        """Add a rule.

        The grammar's size is checked as it grows. So no schema makes the compiler build (or
        hold) more than MAX_GRAMMAR_CHARS before it is refused."""
        self._size += len(name) + len(body) + 6
        if self._size > MAX_GRAMMAR_CHARS:
            raise SchemaError("", f"the schema makes a grammar over {MAX_GRAMMAR_CHARS} characters")
        self.rules[name] = body
        return name

    def text(self, root: str) -> str:
        """The whole grammar: `root`, the rules defined, and the shared ones.

        Unused rules are harmless to llama.cpp."""
        shared = {
            "ws": _SPACE.split(" ::= ")[1],
            "char": _CHAR.split(" ::= ")[1],
            **_PRIMITIVES,
            **_ANY_RULES,
        }
        rules = {"root": root, **self.rules, **shared}
        text = "".join(f"{name} ::= {body}\n" for name, body in rules.items())
        if len(text) > MAX_GRAMMAR_CHARS:
            raise SchemaError("", f"the schema makes a grammar over {MAX_GRAMMAR_CHARS} characters")
        return text


_RESERVED = frozenset({"root", "ws", "char", *_PRIMITIVES, *_ANY_RULES})
# the integer rule's longest integer
MAX_DIGITS = 16


def digits(lo: int, hi: int | None) -> list[str]:
    """Alternatives spelling the integers lo..hi (hi None: up to the longest), 0 <= lo."""
    hi = 10**MAX_DIGITS - 1 if hi is None else hi
    alts = []
    for width in range(len(str(lo)), len(str(hi)) + 1):
        a, b = max(lo, 10 ** (width - 1) if width > 1 else 0), min(hi, 10**width - 1)
        if a <= b:
            alts += _same_width(str(a), str(b))
    return alts


def _same_width(a: str, b: str) -> list[str]:
    """The numbers from a to b, both of the same number of digits."""
    if not a:
        return [""]
    if a == b:
        return [f'"{a}"']
    rest = len(a) - 1
    tail = f" [0-9]{{{rest}}}" if rest else ""
    if a[1:] == "0" * rest and b[1:] == "9" * rest:
        return [f"[{a[0]}-{b[0]}]{tail}"]
    if a[0] == b[0]:
        return [f'"{a[0]}" ({" | ".join(_same_width(a[1:], b[1:]))})']
    out = [f'"{a[0]}" ({" | ".join(_same_width(a[1:], "9" * rest))})']
    if int(b[0]) - int(a[0]) > 1:
        out.append(f"[{int(a[0]) + 1}-{int(b[0]) - 1}]{tail}")
    out.append(f'"{b[0]}" ({" | ".join(_same_width("0" * rest, b[1:]))})')
    return out


def repeat(item: str, lo: int, hi: int | None) -> str:
    """`item` lo..hi times, comma-separated."""
    if hi == 0:
        return ""
    rest_lo, rest_hi = max(lo - 1, 0), None if hi is None else hi - 1
    rest = f'("," ws {item}){{{rest_lo},{"" if rest_hi is None else rest_hi}}}'
    one_or_more = f"{item} {rest}"
    return one_or_more if lo >= 1 else f"({one_or_more})?"


def json_object_grammar() -> str:
    """`response_format: json_object`: any JSON object."""
    return Grammar().text("object")


def composed(build: Callable[[Grammar], str]) -> str:
    """A grammar built by `build`: the tool-call envelopes use it.

    `build` defines rules with `Compiler`s and returns the root expression."""
    g = Grammar()
    return g.text(build(g))
