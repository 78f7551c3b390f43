"""What a freeform grammar is made of once read (from Lark or a regular expression). The terms are
text, sets of characters, sequences, alternatives, repetitions and references to named rules. Both
readers build these. `escaped` compiles them."""

from __future__ import annotations

from dataclasses import dataclass

MAX_CODE = 0x10FFFF
# never in UTF-8 text: no set holds them
SURROGATES = (0xD800, 0xDFFF)


class FormatError(ValueError):
    """A grammar that cannot be enforced, or that is malformed. The message says why."""


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class Chars:
    """One character of a set: code point ranges, sorted, disjoint, none a surrogate."""

    ranges: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Seq:
    items: tuple[Term, ...]


@dataclass(frozen=True)
class Alt:
    options: tuple[Term, ...]


@dataclass(frozen=True)
class Repeat:
    item: Term
    lo: int
    # None: unbounded
    hi: int | None


@dataclass(frozen=True)
class Ref:
    name: str


Term = Text | Chars | Seq | Alt | Repeat | Ref
EMPTY = Seq(())


def chars(ranges: list[tuple[int, int]]) -> Chars:
    """The set of `ranges` (any order, overlapping), without surrogates."""
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        for a, b in ((lo, min(hi, SURROGATES[0] - 1)), (max(lo, SURROGATES[1] + 1), hi)):
            if a > b:
                continue
            if out and a <= out[-1][1] + 1:
                out[-1] = (out[-1][0], max(out[-1][1], b))
            else:
                out.append((a, b))
    return Chars(tuple(out))


def complement(ranges: list[tuple[int, int]]) -> Chars:
    """Every character but those of `ranges`."""
    inside = chars(ranges).ranges
    out, at = [], 0
    for lo, hi in inside:
        if at < lo:
            out.append((at, lo - 1))
        at = hi + 1
    if at <= MAX_CODE:
        out.append((at, MAX_CODE))
    return chars(out)


def one_of(text: str) -> list[tuple[int, int]]:
    return [(ord(c), ord(c)) for c in text]


# Python's classes under re.ASCII (what these grammars mean by \d, \w, \s)
DIGIT = [(0x30, 0x39)]
WORD = [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)]
SPACE = one_of(" \t\n\r\f\v")
