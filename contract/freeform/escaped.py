"""A freeform grammar as the GBNF of its text written inside a JSON string.

A custom call travels as a function call whose one argument is `input` (calls.py). So the grammar
the sampler enforces is over the argument's JSON string, not over the raw text. Each character of
the text is written as JSON writes it (`json.dumps(text, ensure_ascii=False)`). Quotes and
backslashes become `\\"` and `\\\\`. Control characters become `\\n`, `\\t`, `\\r`, `\\b`, `\\f`,
or `\\u00XX` for the others. Everything else is written as itself. Escaping a text is escaping each
of its characters. So a grammar's text, literals and character sets map one by one. The string the
model writes decodes to a text of the grammar, and only to one.

Bounds are as for JSON schemas (contract/schema.py). A definition has at most MAX_SCHEMA_BYTES. A
grammar is refused the moment it passes MAX_GRAMMAR_CHARS while it is built. Counts are at most
MAX_BOUND. Repetitions are at most MAX_REPEATS in all, since llama.cpp spells each one out. What
llama.cpp's grammar engine cannot run is refused here, naming the rule. It cannot run left recursion
(a rule that can start with itself). Nor can it run a repetition without bound of something that can
be empty.
"""

from __future__ import annotations

from contract.freeform.lark import parse_lark, refs
from contract.freeform.regex import MAX_BOUND, parse_regex
from contract.freeform.terms import Alt, Chars, FormatError, Ref, Repeat, Seq, Term, Text
from contract.gbnf import MAX_GRAMMAR_CHARS, Grammar, SchemaError, literal
from contract.schema import MAX_SCHEMA_BYTES

MAX_REPEATS = 10 * MAX_BOUND
SYNTAXES = ("lark", "regex")
# written escaped
_SPECIAL = [(0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C)]
_NAMED = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def escaped(ch: str) -> str:
    """How a JSON string holds `ch`, as json.dumps writes it."""
    if ch in _NAMED:
        return _NAMED[ch]
    return f"\\u{ord(ch):04x}" if ord(ch) < 0x20 else ch


def check_format(fmt: object) -> None:
    """Raise FormatError unless `fmt` is a custom tool's format this server enforces. That is
    `{"type": "text"}` or `{"type": "grammar", "syntax": "lark" | "regex", "definition"}`."""
    string_rule(fmt, Grammar(), "")


def string_rule(fmt: object, g: Grammar, prefix: str) -> str:
    """The rule of the JSON string holding an input of `fmt`. It covers the quotes, then optional
    space. It defines its rules in `g`, under names starting with `prefix`."""
    if fmt == {"type": "text"}:
        return "string"
    if not isinstance(fmt, dict) or set(fmt) != {"type", "syntax", "definition"} or fmt["type"] != "grammar":
        raise FormatError("a format is {'type': 'text'} or {'type': 'grammar', 'syntax', 'definition'}")
    syntax, definition = fmt["syntax"], fmt["definition"]
    if syntax not in SYNTAXES or not isinstance(definition, str):
        raise FormatError(f"a grammar's syntax is one of {list(SYNTAXES)}, its definition a string")
    size = len(definition.encode())
    if size > MAX_SCHEMA_BYTES:
        raise FormatError(f"the grammar is {size} bytes; at most {MAX_SCHEMA_BYTES}")
    defs = parse_lark(definition) if syntax == "lark" else {"start": parse_regex(definition)}
    _check(defs)
    try:
        start = _Emitter(defs, g, prefix).emit()
        return g.define(g.name(f"{prefix}input"), f'"\\"" {start} "\\"" ws')
    # the grammar's bound, checked as each rule is added
    except SchemaError:
        raise FormatError(f"the grammar makes a GBNF grammar over {MAX_GRAMMAR_CHARS} characters") from None


def _check(defs: dict[str, Term]) -> None:
    nullable = _solve(defs, leaf=False)
    if not _solve(defs, leaf=True)["start"]:
        raise FormatError("the grammar matches no text ('start' never ends)")
    repeats = 0
    for name, term in defs.items():
        for rep in _repeats(term):
            if rep.hi is None and _nullable(rep.item, nullable):
                raise FormatError(f"'{name}' repeats without bound something that can be empty")
            repeats += max(rep.lo, rep.hi or 0, 1)
    if repeats > MAX_REPEATS:
        raise FormatError(f"the grammar's repetitions count {repeats} in all; at most {MAX_REPEATS}")
    starts = {name: sorted(_firsts(term, nullable)) for name, term in defs.items()}
    looped = _cycle(starts)
    if looped is not None:
        raise FormatError(f"'{looped}' is left-recursive (it can start with itself): use a repetition")


def _cycle(edges: dict[str, list[str]]) -> str | None:
    """A name on a cycle of `edges`, found in one pass. (Can a rule start with itself?)"""
    # 1: on the path being walked, 2: done
    state: dict[str, int] = {}
    for root in edges:
        if root in state:
            continue
        state[root] = 1
        path = [(root, iter(edges[root]))]
        while path:
            name, rest = path[-1]
            nxt = next(rest, None)
            if nxt is None:
                state[name] = 2
                path.pop()
            elif state.get(nxt) == 1:
                return nxt
            elif nxt not in state:
                state[nxt] = 1
                path.append((nxt, iter(edges[nxt])))
    return None


def _solve(defs: dict[str, Term], leaf: bool) -> dict[str, bool]:
    """Which rules hold, in one pass over the grammar. Text and sets hold as `leaf` says. A
    sequence holds when all its items do, and alternatives when one does. A repetition holds when
    it may be empty or its item holds. A reference holds when its rule does. For nullable rules,
    `leaf` is False. For rules that can end, `leaf` is True."""
    never = 1 << 60
    # per node: how many of its parts must still hold (0: it holds)
    need: list[int] = []
    # per node: the nodes it is a part of
    ups: list[list[int]] = []
    refs_at: list[tuple[int, str]] = []

    def add(term: Term) -> int:
        node = len(need)
        need.append(0)
        ups.append([])
        parts: tuple[Term, ...] = ()
        if isinstance(term, Text | Chars):
            need[node] = 0 if leaf else never
        elif isinstance(term, Seq):
            parts, need[node] = term.items, len(term.items)
        elif isinstance(term, Alt):
            parts, need[node] = term.options, 1
        elif isinstance(term, Repeat):
            parts, need[node] = (term.item,), 0 if term.lo == 0 or term.hi == 0 else 1
        else:
            need[node] = 1
            refs_at.append((node, term.name))
        for part in parts:
            ups[add(part)].append(node)
        return node

    roots = {name: add(term) for name, term in defs.items()}
    for node, name in refs_at:
        ups[roots[name]].append(node)
    todo = [n for n, left in enumerate(need) if left == 0]
    while todo:
        for up in ups[todo.pop()]:
            need[up] -= 1
            if need[up] == 0:
                todo.append(up)
    return {name: need[node] <= 0 for name, node in roots.items()}


def _nullable(term: Term, known: dict[str, bool]) -> bool:
    if isinstance(term, Text | Chars):
        return False
    if isinstance(term, Ref):
        return known[term.name]
    if isinstance(term, Seq):
        return all(_nullable(t, known) for t in term.items)
    if isinstance(term, Alt):
        return any(_nullable(t, known) for t in term.options)
    return term.lo == 0 or term.hi == 0 or _nullable(term.item, known)


def _firsts(term: Term, nullable: dict[str, bool]) -> set[str]:
    """The rules a text of `term` can start with."""
    if isinstance(term, Ref):
        return {term.name}
    if isinstance(term, Seq):
        out: set[str] = set()
        for item in term.items:
            out |= _firsts(item, nullable)
            if not _nullable(item, nullable):
                break
        return out
    if isinstance(term, Alt):
        return set().union(*(_firsts(t, nullable) for t in term.options))
    if isinstance(term, Repeat):
        return _firsts(term.item, nullable) if term.hi != 0 else set()
    return set()


def _repeats(term: Term) -> list[Repeat]:
    if isinstance(term, Seq | Alt):
        parts = term.items if isinstance(term, Seq) else term.options
        return [r for t in parts for r in _repeats(t)]
    if isinstance(term, Repeat):
        return [term, *_repeats(term.item)]
    return []


class _Emitter:
    """The GBNF rules of one grammar's definitions, over the escaped text."""

    def __init__(self, defs: dict[str, Term], g: Grammar, prefix: str) -> None:
        self._defs, self._g = defs, g
        self._names = {name: g.name(f"{prefix}{name}") for name in _reachable(defs)}
        self._sets: dict[Chars, str] = {}
        self._prefix = prefix

    def emit(self) -> str:
        for name, rule in self._names.items():
            self._g.define(rule, self._expr(self._defs[name]))
        return self._names["start"]

    def _expr(self, term: Term) -> str:
        if isinstance(term, Text):
            return literal("".join(escaped(c) for c in term.text))
        if isinstance(term, Chars):
            return self._set(term)
        if isinstance(term, Ref):
            return self._names[term.name]
        if isinstance(term, Seq):
            return " ".join(self._expr(t) for t in term.items) or '""'
        if isinstance(term, Alt):
            return "(" + " | ".join(self._expr(t) for t in term.options) + ")"
        if term.hi == 0:
            return '""'
        item = self._expr(term.item)
        # one symbol: llama.cpp copies it, count times
        if not isinstance(term.item, Ref | Chars):
            item = f"({item})"
        if (term.lo, term.hi) in ((0, 1), (0, None), (1, None)):
            return item + {(0, 1): "?", (0, None): "*", (1, None): "+"}[(term.lo, term.hi)]
        if term.lo == term.hi:
            return f"{item}{{{term.lo}}}"
        return f"{item}{{{term.lo},{'' if term.hi is None else term.hi}}}"

    def _set(self, term: Chars) -> str:
        """One character of the set, escaped: a rule of its own, one per set."""
        if term in self._sets:
            return self._sets[term]
        if not term.ranges:
            raise FormatError("a character set matches no character")
        plain, special = _split(term.ranges)
        options = [f"[{''.join(_span(lo, hi) for lo, hi in plain)}]"] if plain else []
        options += [literal(_NAMED[c]) for c in special if c in _NAMED]
        coded = [c for c in special if c not in _NAMED]
        for high in "01":
            lows = "".join(f"{ord(c) & 0xF:x}" for c in coded if ord(c) >> 4 == int(high))
            if lows:
                options.append(f'"\\\\u00{high}" [{lows}]')
        name = self._g.define(self._g.name(f"{self._prefix}chars"), " | ".join(options))
        self._sets[term] = name
        return name


def _reachable(defs: dict[str, Term]) -> list[str]:
    out: dict[str, None] = {}
    todo = ["start"]
    while todo:
        name = todo.pop()
        if name not in out:
            out[name] = None
            todo += sorted(refs(defs[name]))
    return list(out)


def _split(ranges: tuple[tuple[int, int], ...]) -> tuple[list[tuple[int, int]], list[str]]:
    """The ranges' characters JSON writes as they are, and those it escapes."""
    plain, special = [], []
    for lo, hi in ranges:
        at = lo
        for s_lo, s_hi in _SPECIAL:
            if s_hi < at or s_lo > hi:
                continue
            if at < s_lo:
                plain.append((at, s_lo - 1))
            special += [chr(c) for c in range(max(at, s_lo), min(hi, s_hi) + 1)]
            at = s_hi + 1
        if at <= hi:
            plain.append((at, hi))
    return plain, special


def _span(lo: int, hi: int) -> str:
    return _code(lo) if lo == hi else f"{_code(lo)}-{_code(hi)}"


def _code(c: int) -> str:
    if chr(c).isascii() and chr(c).isalnum():
        return chr(c)
    return f"\\x{c:02X}" if c <= 0xFF else f"\\u{c:04X}" if c <= 0xFFFF else f"\\U{c:08X}"
