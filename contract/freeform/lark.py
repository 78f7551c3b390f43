"""Lark grammars as freeform terms: the `lark` syntax of a custom tool's format.

This reads the subset Codex's `apply_patch` grammar uses, and what goes with it. Rules and
terminals (`name: ...`, `NAME: ...`) may continue on lines that start with `|`. Strings are
`"..."`, with Python's escapes. Character ranges are `"a".."z"`. Regular expressions are `/.../`
(see regex.py). It reads `( )`, `[ ]`, `?`, `*`, `+`, `~ n` and `~ n..m`. It reads aliases
(`-> name`), rule modifiers (`?rule`, `!rule`) and priorities (`.2`) too. These shape Lark's tree,
not the text. `%import common.NAME` (or `common (A, B)`) imports the terminals of Lark's
`common.lark` that are regular. These are `LF`, `CR`, `NEWLINE`, `WS`, `WS_INLINE`, `DIGIT`,
`INT`, `WORD`, and so on. Comments are `//` or `#` to the end of the line. `start` is the input.

What this reads is the grammar's language. Its terminals are regular languages inside a
context-free grammar, with no lexer between them. Anything else is refused, saying what. That
covers `%ignore`, since it would allow text between any two terminals. It also covers `%declare`,
`%override`, `%extend`, other imports, templates, flags (`"..."i`, `/.../s`), and llguidance's
extensions.
"""

from __future__ import annotations

import re

from contract.freeform.regex import MAX_BOUND, MAX_DEPTH, parse_regex
from contract.freeform.terms import EMPTY, Alt, FormatError, Ref, Repeat, Seq, Term, Text, chars

_TOKENS = re.compile(
    r"""
    (?P<comment>(//|\#)[^\n]*)
  | (?P<nl>(\r?\n)+)
  | (?P<space>[ \t\f]+|\\\r?\n)
  | (?P<string>"[^"\\\n]*(?:\\.[^"\\\n]*)*"[a-z]*)
  | (?P<regexp>/(?!/)[^/\\\n]*(?:\\.[^/\\\n]*)*/[a-z]*)
  | (?P<directive>%[a-z]+)
  | (?P<name>_?[a-z][_a-z0-9]*)
  | (?P<term>_?[A-Z][_A-Z0-9]*)
  | (?P<number>[0-9]+)
  | (?P<op>->|\.\.|[:|()\[\]?*+~.,!{}])
    """,
    re.VERBOSE,
)
_STRING_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "\\": "\\", '"': '"'}

# Lark's common.lark, its regular terminals (ESCAPED_STRING and the like need lookbehind)
COMMON = r"""
DIGIT: "0".."9"
HEXDIGIT: "a".."f" | "A".."F" | DIGIT
INT: DIGIT+
SIGNED_INT: ["+"|"-"] INT
DECIMAL: INT "." INT? | "." INT
_EXP: ("e"|"E") SIGNED_INT
FLOAT: INT _EXP | DECIMAL _EXP?
SIGNED_FLOAT: ["+"|"-"] FLOAT
NUMBER: FLOAT | INT
SIGNED_NUMBER: ["+"|"-"] NUMBER
LCASE_LETTER: "a".."z"
UCASE_LETTER: "A".."Z"
LETTER: UCASE_LETTER | LCASE_LETTER
WORD: LETTER+
CNAME: ("_"|LETTER) ("_"|LETTER|DIGIT)*
WS_INLINE: (" "|/\t/)+
WS: /[ \t\f\r\n]/+
CR : /\r/
LF : /\n/
NEWLINE: (CR? LF)+
"""


def parse_lark(source: str) -> dict[str, Term]:
    """The grammar's rules and terminals by name (`start` among them), every reference defined.
    Raises FormatError."""
    reader = _Reader(source)
    defs = reader.read()
    if "start" not in defs:
        raise FormatError("the Lark grammar has no 'start' rule")
    for name, term in defs.items():
        for ref in refs(term):
            if ref not in defs:
                raise FormatError(f"the Lark grammar's '{name}' refers to '{ref}', which it does not define")
            if _terminal(name) and not _terminal(ref):
                raise FormatError(f"the Lark grammar's terminal '{name}' refers to the rule '{ref}'")
    return defs


def refs(term: Term) -> set[str]:
    """The names `term` refers to."""
    if isinstance(term, Ref):
        return {term.name}
    if isinstance(term, Seq):
        return set().union(*(refs(t) for t in term.items))
    if isinstance(term, Alt):
        return set().union(*(refs(t) for t in term.options))
    if isinstance(term, Repeat):
        return refs(term.item)
    return set()


def _renamed(term: Term, names: dict[str, str]) -> Term:
    if isinstance(term, Ref):
        return Ref(names.get(term.name, term.name))
    if isinstance(term, Seq):
        return Seq(tuple(_renamed(t, names) for t in term.items))
    if isinstance(term, Alt):
        return Alt(tuple(_renamed(t, names) for t in term.options))
    if isinstance(term, Repeat):
        return Repeat(_renamed(term.item, names), term.lo, term.hi)
    return term


class _Reader:
    def __init__(self, source: str) -> None:
        # (kind, text, line)
        self.tokens: list[tuple[str, str, int]] = []
        line, at = 1, 0
        while at < len(source):
            m = _TOKENS.match(source, at)
            if m is None:
                raise FormatError(f"the Lark grammar has an unexpected {source[at]!r} on line {line}")
            kind = m.lastgroup or ""
            if kind not in ("comment", "space"):
                self.tokens.append((kind, m.group(), line))
            line += m.group().count("\n")
            at = m.end()
        self.i = 0
        self.defs: dict[str, Term] = {}

    def _error(self, what: str) -> FormatError:
        line = self.tokens[min(self.i, len(self.tokens) - 1)][2] if self.tokens else 1
        return FormatError(f"the Lark grammar has {what} on line {line}")

    def _peek(self, ahead: int = 0) -> tuple[str, str]:
        at = self.i + ahead
        return self.tokens[at][:2] if at < len(self.tokens) else ("end", "")

    def _take(self, kind: str, text: str | None = None) -> str:
        got_kind, got = self._peek()
        if got_kind != kind or (text is not None and got != text):
            raise self._error(f"{got!r} where {text or kind!r} should be" if got else f"no {text or kind!r}")
        self.i += 1
        return got

    def read(self) -> dict[str, Term]:
        while self._peek()[0] != "end":
            kind = self._peek()[0]
            if kind == "nl":
                self.i += 1
            elif kind == "directive":
                self._directive()
            else:
                self._definition()
        return self.defs

    def _define(self, name: str, term: Term) -> None:
        if name in self.defs:
            raise self._error(f"'{name}' defined twice")
        self.defs[name] = term

    def _definition(self) -> None:
        if self._peek() in (("op", "?"), ("op", "!")):
            # tree shaping only
            self.i += 1
        kind, name = self._peek()
        if kind not in ("name", "term"):
            raise self._error(f"{name!r} where a rule's name should be")
        self.i += 1
        # a priority: which parse wins, not which text
        if self._peek() == ("op", "."):
            self.i += 1
            self._take("number")
        if self._peek() == ("op", "{"):
            raise self._error("a template rule (not supported)")
        self._take("op", ":")
        self._define(name, self._alternatives(0))
        if self._peek()[0] not in ("nl", "end"):
            raise self._error(f"an unexpected {self._peek()[1]!r}")

    def _directive(self) -> None:
        _, directive = self._peek()
        if directive != "%import":
            why = {"%ignore": " (it would allow text between any two terminals)"}.get(directive, "")
            raise self._error(f"'{directive}': not supported{why}")
        self.i += 1
        module = self._take("name")
        if module != "common":
            raise self._error(f"'%import {module}': only Lark's 'common' terminals can be imported")
        wanted: dict[str, str] = {}
        if self._peek() == ("op", "."):
            self.i += 1
            name = self._take("term")
            alias = name
            if self._peek() == ("op", "->"):
                self.i += 1
                alias = self._take("term")
            wanted[name] = alias
        else:
            self._take("op", "(")
            while True:
                name = self._take("term")
                wanted[name] = name
                if self._peek() != ("op", ","):
                    break
                self.i += 1
            self._take("op", ")")
        self._import(wanted)

    def _import(self, wanted: dict[str, str]) -> None:
        common = _Reader(COMMON).read()
        for name in wanted:
            if name not in common:
                raise self._error(f"'common.{name}': not among the terminals that can be imported")
        needed, todo = set(), list(wanted)
        while todo:
            name = todo.pop()
            if name not in needed:
                needed.add(name)
                todo += refs(common[name])
        names = {n: wanted.get(n, f"common__{n}") for n in needed}
        for name in sorted(needed):
            term = _renamed(common[name], names)
            if names[name] in self.defs and self.defs[names[name]] == term:
                # imported before
                continue
            self._define(names[name], term)

    def _alternatives(self, depth: int) -> Term:
        if depth > MAX_DEPTH:
            raise self._error(f"groups nested deeper than {MAX_DEPTH}")
        options = [self._sequence(depth)]
        while True:
            ahead = 0
            while self._peek(ahead)[0] == "nl":
                ahead += 1
            if self._peek(ahead) != ("op", "|"):
                break
            self.i += ahead + 1
            options.append(self._sequence(depth))
        return options[0] if len(options) == 1 else Alt(tuple(options))

    def _sequence(self, depth: int) -> Term:
        items: list[Term] = []
        while True:
            kind, text = self._peek()
            if kind in ("nl", "end") or (kind == "op" and text in ("|", ")", "]", "->")):
                break
            items.append(self._repeated(self._atom(depth)))
        # an alias names the tree's node, not the text
        if self._peek() == ("op", "->"):
            self.i += 1
            self._take("name")
        return EMPTY if not items else items[0] if len(items) == 1 else Seq(tuple(items))

    def _repeated(self, atom: Term) -> Term:
        kind, text = self._peek()
        if kind != "op" or text not in ("?", "*", "+", "~"):
            return atom
        self.i += 1
        if text == "~":
            lo = hi = self._count()
            if self._peek() == ("op", ".."):
                self.i += 1
                hi = self._count()
                if hi < lo:
                    raise self._error("a '~' range whose maximum is below its minimum")
            return Repeat(atom, lo, hi)
        return Repeat(atom, *{"?": (0, 1), "*": (0, None), "+": (1, None)}[text])

    def _count(self) -> int:
        n = int(self._take("number"))
        if n > MAX_BOUND:
            raise self._error(f"a count above {MAX_BOUND}")
        return n

    def _atom(self, depth: int) -> Term:
        kind, text = self._peek()
        self.i += 1
        if kind in ("name", "term"):
            return Ref(text)
        if kind == "string":
            low = self._string(text)
            if self._peek() != ("op", ".."):
                return Text(low)
            self.i += 1
            high = self._string(self._take("string"))
            if len(low) != 1 or len(high) != 1 or high < low:
                raise self._error('a range that is not from one character to a later one ("a".."z")')
            return chars([(ord(low), ord(high))])
        if kind == "regexp":
            body, flags = text[1:].rsplit("/", 1)
            if flags:
                raise self._error(f"regular expression flags ('{flags}'): not supported")
            try:
                return parse_regex(body, whole=False)
            except FormatError as exc:
                raise self._error(str(exc).removeprefix("the ")) from None
        if (kind, text) in (("op", "("), ("op", "[")):
            inner = self._alternatives(depth + 1)
            self._take("op", ")" if text == "(" else "]")
            return inner if text == "(" else Repeat(inner, 0, 1)
        self.i -= 1
        raise self._error(f"an unexpected {text!r}" if text else "an unexpected end")

    def _string(self, token: str) -> str:
        body, flags = token[1:].rsplit('"', 1)
        if flags:
            raise self._error(f"string flags ('{flags}'): not supported")
        out, i = [], 0
        while i < len(body):
            c = body[i]
            if c != "\\":
                out.append(c)
                i += 1
                continue
            e = body[i + 1]
            width = {"x": 2, "u": 4, "U": 8}.get(e, 0)
            if width:
                digits = body[i + 2 : i + 2 + width]
                if not re.fullmatch(f"[0-9a-fA-F]{{{width}}}", digits) or not _char_code(int(digits, 16)):
                    raise self._error(f"a malformed '\\{e}' escape in a string")
                out.append(chr(int(digits, 16)))
                i += 2 + width
                continue
            # Lark keeps an unknown escape as it is
            out.append(_STRING_ESCAPES.get(e, "\\" + e))
            i += 2
        if not out:
            raise self._error("an empty string")
        return "".join(out)


def _terminal(name: str) -> bool:
    # common__DIGIT: imported
    return name.rsplit("__", 1)[-1].lstrip("_")[:1].isupper()


def _char_code(code: int) -> bool:
    return code <= 0x10FFFF and not 0xD800 <= code <= 0xDFFF
